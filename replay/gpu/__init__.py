"""The GPU runner: policies applied at each kernel launch on a real GPU, measured with CUPTI.

- `driver.py`: every CUDA driver call, behind `CudaIface`; `cupti_monitor.py`: CUPTI's counters;
- `cuda_engine.py`: `Engine`, a policy's per-launch decisions (pagecast.replay.online) carried out
  with CUDA calls; `feedback_loop.py`: the model refined from the faults it missed;
- `backend.py`: `run_gpu_replay(request)`, the GPU backend of `pagecast replay`; `child.py`: one measured
  run, its job (the request narrowed to it) read as JSON;
- `prefetching.py`: `pagecast.prefetching`, the template policy in a user's own program;
- `calibrate.py` and `commands.py`: `pagecast calibrate`, a cost profile measured on this GPU.
"""
