"""Plan, simulate, run on a GPU: everything after the model.

- `plan/`: the planner (Belady on predicted footprints, the span, plan files);
- `policies/`: the policies, one module each, for the simulator and the GPU runner alike;
- `online/`: the per-launch decisions the GPU runner makes (and the simulator's `runner` replays);
- `sim/`: the trace-driven UVM simulator; `gpu/`: the GPU runner and `calibrate`;
- shared by them: `unit_space.py` (traces in migration units), `costs.py` (cost profiles),
  `results_io.py` (results files), `results_table.py`; `request.py`: `ReplayRequest`, what one replay
  runs (the simulator, the GPU runner and its child take it); `commands.py`: `pagecast plan` and `replay`.

docs/architecture.md draws the layers between them.
"""
