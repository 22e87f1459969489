"""One launch at a time: the decisions the GPU runner makes, shared with the simulator's `runner` policy.

- `decide.py`: `LaunchDecider`, a policy's prefetches and (with an emulated capacity) evictions per launch;
- `residency.py`: the residency estimate and its victim rules; `ranges.py`: byte ranges, allocations;
- `relocate.py`: a trace's footprints relocated into a run's addresses (the oracle);
- `prediction.py`: the model's online predictor, as the runner calls it.
"""
