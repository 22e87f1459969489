"""One launch at a time: the decisions the GPU runner makes, shared with the simulator's `runner` policy.

- `decide.py`: `LaunchDecider`, a policy's prefetches and (with an emulated capacity) evictions per launch;
- `unit_residency.py` (+ `residency_kernels.py`): the residency estimate and its victim rules in arrays,
  one compiled call per launch; `period.py`: the launch sequence's period, compiled; `residency.py`: the
  same as Python objects (the reference); `ranges.py`: byte ranges, allocations;
- `relocate.py`: a trace's footprints relocated into a run's addresses (the oracle);
- `prediction.py`: the model's online predictor, as the runner calls it.
"""
