"""Fault feedback on the GPU: every few launches, the faults the prediction missed refine the model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pagecast import trace as T
from pagecast.predict.feedback import apply_feedback
from pagecast.uvm import PAGE

from ..online.ranges import AllocationMap

if TYPE_CHECKING:
    from .cuda_engine import Engine


def _launch_table(las: list, allocs: AllocationMap):
    """A minimal in-memory Trace of the given launches (for the predictor's trace-based seams)."""
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
        online = getattr(self.predict, "online", None)
        page_size = int(getattr(self.model, "page_size", PAGE))

        def apply(la, ivs) -> bool:
            if online is not None and hasattr(online, "observe"):
                online.observe(la.kernel, ivs)
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
