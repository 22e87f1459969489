"""The runner's use of the predictor, through its public seam (pagecast.predict): loading a
model and predicting one launch at a time (the GPU runner and the simulator's `runner` policy)."""

from __future__ import annotations

import struct
from typing import Any, Callable

from pagecast.predict.model_io import load_model
from pagecast.predict.compiled import CompiledPredictor
from pagecast.predict.predictor import OnlinePredictor

from .ranges import AllocationMap


def load_model_file(path):
    return load_model(path)


def model_kernel_names(model) -> set[str] | None:
    """The kernels a model has templates for (None when the model does not say)."""
    for name in ("kernels", "kernel_names"):
        k = getattr(model, name, None)
        if callable(k):
            k = k()
        if isinstance(k, dict):
            return set(k)
        if k is not None:
            try:
                return {getattr(x, "kernel", x) for x in k}
            except TypeError:
                pass
    return None


def make_online_predict(model, fallback: str = "history", *, compiled: bool = True
                        ) -> Callable[[Any, AllocationMap], list[tuple[int, int]]]:
    """`predict(la, allocs) -> [(address, nbytes)]` from the model, one launch at a time.

    `predict(la, allocs, values)`: `values(address, nbytes) -> bytes | None` gives the index values
    of the launch's indexed regions, which `predict.value_reads(la)` names (the runtime reads them
    once the launch that writes them has ended); without them such regions get the fallback.
    `compiled` (the default): the compiled predictor (`pagecast.predict.compiled`), one numba call
    per launch over the raw parameter bytes; `predict.last` is that predictor, whose state array
    holds the last prediction's byte ranges (at `out_at`), which the residency step reads without
    converting them.
    `compiled=False`: `OnlinePredictor`, as the runner predicted before (benchmarks/bench_runner.py
    runs both; the two predict the same ranges, tests/test_predict_compiled.py).

    The managed allocation a pointer the model reads lands in is handed to the predictor the
    first time it is needed (`resolve`, through the runner's AllocationMap); its page intervals
    come back as byte ranges. The predictor notices model changes (feedback) by itself
    (`Model.version_counter`). Everything is compiled here, before the workload launches anything.
    """
    op = (CompiledPredictor if compiled else OnlinePredictor)(model, fallback).warm()
    ps = int(getattr(op, "ps", None) or model.page_size)
    current: list = [None]   # the AllocationMap of the launch being predicted

    def resolve(v: int):
        a = current[0].find(v) if current[0] is not None else None
        return (a.base, a.size) if a is not None and a.managed else None

    # allocations are looked up only when a pointer the model reads lands in none known yet
    op.resolve = resolve

    if compiled:
        seen = [-1]   # the AllocationMap generation the predictor's misses were found under
        pairs = struct.Struct("<qq").iter_unpack

        def predict(la, allocs: AllocationMap, values=None) -> list[tuple[int, int]]:
            current[0] = allocs
            if allocs.generation != seen[0]:
                op.invalidate_misses()
                seen[0] = allocs.generation
            n = op.predict_args(la, bytes(la.param_data or b""), values)
            at = op.out_at
            return list(pairs(op.st[at:at + 2 * n]))   # (address, nbytes) tuples, as the array holds them

        # the last prediction's ranges where the predictor left them: (op.st, op.out_at, their count)
        predict.last = op  # type: ignore[attr-defined]
    else:
        def predict(la, allocs: AllocationMap, values=None) -> list[tuple[int, int]]:
            current[0] = allocs
            pages = op.predict(la.kernel, bytes(la.param_data or b""), la.param_offsets, la.param_sizes,
                               la.grid, la.block, values)
            return [(s * ps, (e - s) * ps) for s, e in pages if e > s]

    def forget(addr: int) -> None:
        op.free_allocation(addr)   # freed (cudaFree / cuMemFree): its history goes too

    def value_reads(la, allocs: AllocationMap | None = None) -> list[tuple[int, int]]:
        """The index values (address, bytes) the launch's indexed regions read (empty: none).
        `allocs`: the runner's allocations, where the pointers are looked up (as `predict`'s; without
        it, those of the last launch predicted, so that a runtime's first launch would read none)."""
        if allocs is not None:
            current[0] = allocs
        return op.value_reads(la.kernel, bytes(la.param_data or b""), la.param_offsets, la.param_sizes,
                              la.grid, la.block)

    predict.value_reads = value_reads  # type: ignore[attr-defined]
    predict.forget = forget  # type: ignore[attr-defined]
    predict.online = op  # type: ignore[attr-defined]  (feedback feeds it the pages it missed)
    # merged ranges inside the managed allocations it was given (its regions are clipped to their
    # allocation): the engine need not clip them again; it cuts them per allocation for the calls
    predict.clipped = True  # type: ignore[attr-defined]
    return predict


def default_fallback(feedback: bool) -> str:
    """The online fallback for kernels the model cannot predict: `history` only with feedback,
    which feeds it the pages launches really fault on; without it the history is the fit's,
    which on data-dependent kernels names every row or expert the fitting runs read
    (replaying the runner's own decisions in the simulator, policy `runner`: moe-decode
    0.26x of demand with it, 1.49x without, at 150%; the other workloads level or better
    without it but spmv-cg at 150%, 5% behind; docs/results.md)."""
    return "history" if feedback else "none"
