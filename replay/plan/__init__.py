"""The planner: Belady on (predicted) footprints, the span a plan is made on, and plan files.

- `belady.py`: the Belady planner (numba) and `plan_groups`;
- `groups.py`: `Groups`, a plan in unit space (what to evict and prefetch before each step);
- `spans.py`: `span_needs` and `choose_span` (plan at each span, keep the fastest in trial runs);
- `adaptive.py`: the template policy's predictions (the model plus the adaptive fallback);
- `plan_io.py`: plan files on disk; `plan_rows.py`: `Groups` <-> a plan file's rows.
"""
