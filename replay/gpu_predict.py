"""The GPU runner's use of the predictor, through its public seam (pagecast.predict):
loading a model, online prediction per launch, and feedback from missed faults."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .gpu_ranges import AllocationMap

if TYPE_CHECKING:
    from .gpu_engine import Engine


def load_model_file(path):
    from pagecast.predict.model_io import load_model

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


def _launch_table(las: list, allocs: AllocationMap):
    """A minimal in-memory Trace of the given launches (for the predictor's trace-based seams)."""
    from pagecast import trace as T

    rows = [la.to_row(i) for i, la in enumerate(las)]
    launches = T.to_table(T.LAUNCHES, {k: [r[k] for r in rows] for k in rows[0]})
    managed = allocs.managed()
    allocations = T.to_table(T.ALLOCATIONS, {
        T.ALLOC_ID: list(range(len(managed))), T.ADDRESS: [a.base for a in managed],
        T.BYTES: [a.size for a in managed], T.KIND: ["managed"] * len(managed),
        T.DEVICE: [0] * len(managed), T.FIRST_LAUNCH: [0] * len(managed)})
    empty = {n: T.SCHEMAS[n].empty_table() for n in (T.FAULTS, T.MIGRATIONS)}
    manifest = T.new_manifest(mode="natural", source="gpu-runner")
    manifest["complete"] = True
    return T.Trace(path=Path("<gpu-runner>"), manifest=manifest, launches=launches, allocations=allocations,
                   faults=empty[T.FAULTS], migrations=empty[T.MIGRATIONS])


def make_online_predict(model, fallback: str = "history") -> Callable[[Any, AllocationMap], list[tuple[int, int]]]:
    """`predict(la, allocs) -> [(address, nbytes)]` from the predictor's OnlinePredictor.

    The managed allocation a pointer the model reads lands in is handed to the
    predictor the first time it is needed (`OnlinePredictor.resolve`, through
    the runner's AllocationMap); its page intervals come back as byte ranges.
    The predictor notices model changes (feedback) by itself
    (`Model.version_counter`).
    """
    from pagecast.predict.predictor import OnlinePredictor

    op = OnlinePredictor(model, fallback).warm()   # compile every kernel before the workload launches any
    ps = int(getattr(op, "ps", None) or model.page_size)
    current: list = [None]   # the AllocationMap of the launch being predicted

    def resolve(v: int):
        a = current[0].find(v) if current[0] is not None else None
        return (a.base, a.size) if a is not None and a.managed else None

    # allocations are looked up only when a pointer the model reads lands in none known yet
    op.resolve = resolve

    def predict(la, allocs: AllocationMap) -> list[tuple[int, int]]:
        current[0] = allocs
        pages = op.predict(la.kernel, bytes(la.param_data or b""), la.param_offsets, la.param_sizes, la.grid, la.block)
        return [(s * ps, (e - s) * ps) for s, e in pages if e > s]

    def forget(addr: int) -> None:
        op.free_allocation(addr)   # freed (cudaFree / cuMemFree): its history goes too

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


class FeedbackLoop:
    """Every `every` launches, refine the model from the faults the prediction missed.

    Records come from the monitor's `take()` (CUPTI delivers them in buffers,
    flushed by the monitor's own thread, never from inside a launch callback).
    Kernel records are kept a while (their faults may arrive later); faults
    newer than every known kernel wait for the next round.
    """

    KEEP_KERNELS = 20_000
    KEEP_FAULTS = 200_000

    def __init__(self, engine: Engine, monitor, model, fallback: str, predict, every: int = 256) -> None:
        self.engine, self.monitor, self.model, self.fallback = engine, monitor, model, fallback
        self.predict = predict
        self.every = max(1, every)
        self.n = 0
        self._kernels: list = []
        self._faults: list = []

    def on_launch(self, la) -> None:
        with self.engine.lock:   # a round changes the model the engine predicts from
            self.engine.on_launch(la)
            self.n += 1
            if self.n % self.every == 0:
                self.round()

    def round(self) -> None:
        try:
            from pagecast.predict.feedback import apply_feedback
        except ImportError:  # the predictor without feedback: only the history fallback learns
            apply_feedback = None
        online = getattr(self.predict, "online", None)
        page_size = int(getattr(self.model, "page_size", 4096))

        def apply(la, ivs) -> bool:
            if online is not None and hasattr(online, "observe"):
                online.observe(la.kernel, ivs)
            if apply_feedback is None:
                return False
            tr = _launch_table([la], self.engine.allocs)
            return bool(apply_feedback(self.model, tr, 0, [a for a, _ in ivs], [b for _, b in ivs]))

        try:
            faults, kernels = self.monitor.take()
            self._kernels = (self._kernels + list(kernels))[-self.KEEP_KERNELS:]
            _, later = self.engine.feedback_from(self._faults + list(faults), self._kernels, apply, page_size)
            self._faults = later[-self.KEEP_FAULTS:]
        except Exception as e:  # noqa: BLE001 - feedback is best effort; the run goes on
            self.engine.stats.errors += 1
            self.engine.stats.last_error = f"feedback: {type(e).__name__}: {e}"
