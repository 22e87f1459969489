"""Hooks into Triton's interpreter (triton 3.9 `runtime/interpreter.py`; docs/collect.md).

- `InterpretedFunction.run(*args, grid, warmup, **kwargs)`: every launch (the autotuner and
  heuristics call it too). Seen before the arguments are copied and the launch options
  (`num_warps`) dropped.
- `interpreter_builder.set_grid_dim(nx, ny, nz)`: called once per launch with its grid.
- `interpreter_builder.create_masked_load / create_masked_store / create_atomic_rmw /
  create_atomic_cas`: every global-memory access. Plain loads and stores, atomic loads and
  stores and tensor-descriptor loads and stores all reach the masked ones. Each receives
  a TensorHandle of raw addresses (uint64) and, except the CAS, a mask; masked-off lanes
  are never touched.

`install(recorder)` patches them and returns an `uninstall` function.
"""

from __future__ import annotations

from typing import Callable, Protocol

from .interpret_pages import BOTH, READ, WRITE

_BUILDER_METHODS = ("set_grid_dim", "create_masked_load", "create_masked_store", "create_atomic_rmw",
                    "create_atomic_cas")


class Recorder(Protocol):
    def begin(self, fn, args: tuple, kwargs: dict) -> None: ...
    def end(self, partial: bool = False) -> None: ...
    def grid(self, nx: int, ny: int, nz: int) -> None: ...
    def access(self, ptrs, mask, kind: int) -> None: ...


class HookError(Exception):
    """The installed Triton does not have what the hooks patch."""


def install(rec: Recorder) -> Callable[[], None]:
    from triton.runtime import interpreter as I
    builder = getattr(I, "interpreter_builder", None)
    missing = [m for m in _BUILDER_METHODS if not hasattr(builder, m)]
    if not hasattr(I, "InterpretedFunction") or missing:
        raise HookError("triton.runtime.interpreter lacks " + ", ".join(missing or ["InterpretedFunction"]))
    cls = I.InterpretedFunction
    orig_run = cls.run
    saved = {m: builder.__dict__.get(m) for m in _BUILDER_METHODS}
    bound = {m: getattr(builder, m) for m in _BUILDER_METHODS}

    def run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return orig_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        rec.begin(self, args, kwargs)
        try:
            out = orig_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        except BaseException:   # cut off (its own error, a signal): what it touched so far, marked partial
            rec.end(partial=True)
            raise
        rec.end()
        return out

    def set_grid_dim(nx, ny, nz):
        rec.grid(nx, ny, nz)
        return bound["set_grid_dim"](nx, ny, nz)

    def masked_load(ptrs, mask, other, cache_policy, is_volatile):
        rec.access(ptrs, mask, READ)
        return bound["create_masked_load"](ptrs, mask, other, cache_policy, is_volatile)

    def masked_store(ptrs, value, mask, cache_policy):
        rec.access(ptrs, mask, WRITE)
        return bound["create_masked_store"](ptrs, value, mask, cache_policy)

    def atomic_rmw(rmw_op, ptr, val, mask, sem, scope):
        rec.access(ptr, mask, BOTH)
        return bound["create_atomic_rmw"](rmw_op, ptr, val, mask, sem, scope)

    def atomic_cas(ptr, cmp, val, sem, scope):
        rec.access(ptr, None, BOTH)
        return bound["create_atomic_cas"](ptr, cmp, val, sem, scope)

    cls.run = run
    for name, f in zip(_BUILDER_METHODS, (set_grid_dim, masked_load, masked_store, atomic_rmw, atomic_cas)):
        setattr(builder, name, f)

    def uninstall() -> None:
        cls.run = orig_run
        for name, v in saved.items():
            if v is None:
                builder.__dict__.pop(name, None)
            else:
                setattr(builder, name, v)

    return uninstall
