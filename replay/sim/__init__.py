"""The trace-driven UVM simulator: the memory model, the clock, one run, and sweeps.

- `kernels.py`: the memory model (numba): faults, evictions by chunk, the tree prefetcher, planned groups;
- `timing.py`: when each launch starts and ends (numba);
- `run.py`: `run_policy`, one policy at one capacity; `stack.py`: LRU at every capacity in one pass;
- `sweep.py`: `simulate(request)` (what `pagecast replay` runs), `replay_sim` (policies x capacities on
  loaded traces) and `make_plan` (`pagecast plan`).

The policies it runs are pagecast.replay.policies'; the planner is pagecast.replay.plan.
"""
