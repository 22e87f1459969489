"""`pagecast.prefetching`: the template policy in-process, for users' own programs."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Iterator

from pagecast.collect.launch_hook import LaunchHook
from pagecast.collect.managed import free_callbacks
from pagecast.units import parse_size

from ..online.prediction import default_fallback, load_model_file, make_online_predict, model_kernel_names
from . import cupti_monitor, driver
from .cuda_engine import Engine
from .feedback_loop import FeedbackLoop


@contextlib.contextmanager
def prefetching(model, capacity: int | str | None = None, fallback: str | None = None,
                feedback: bool = False, *, cuda=None, hook_factory=None, monitor=None) -> Iterator[Engine]:
    """Apply the template policy to the kernels launched inside the block.

    `model`: a model path or a loaded model (`pagecast fit`). `capacity`: bytes
    or a size string (`"8GiB"`) to emulate a smaller GPU (evicting to the host);
    None uses the whole GPU. Yields the `Engine` (its `stats` say what was
    prefetched). Needs an NVIDIA GPU (NoGPUError otherwise) and no other CUPTI
    subscriber in the process (e.g. not inside `pagecast collect`).

        import pagecast
        with pagecast.prefetching("model.json", capacity="16GiB") as eng:
            train()
        print(eng.stats.prefetch_bytes)
    """
    if isinstance(model, (str, os.PathLike)):
        model = load_model_file(model)
    cap = parse_size(capacity) if capacity is not None else None
    if feedback:
        # CUPTI's unified-memory counters count faults only where they start before the CUDA
        # context exists (on an H200, started after it they counted none): start them first
        if monitor is None:
            if cuda is None and driver.context_exists(0):
                warnings.warn("pagecast.prefetching(feedback=True) started after this program's first CUDA call:"
                              " CUPTI's unified-memory counters then count no faults, so feedback sees none;"
                              " enter it before the first CUDA call", stacklevel=3)
            monitor = cupti_monitor.CuptiMonitor(cuda.device if cuda is not None else 0)
        monitor.start(keep_records=True, live=True)
    if cuda is None:
        try:
            cuda = driver.open_cuda()
        except BaseException:
            if feedback:
                monitor.stop()
            raise
    if fallback is None:
        fallback = default_fallback(feedback)
    predict = make_online_predict(model, fallback)
    engine = Engine(cuda, "template", capacity=cap, predict=predict, model_kernels=model_kernel_names(model),
                    warn=lambda m: warnings.warn(m, stacklevel=3))
    fb = FeedbackLoop(engine, monitor, model, fallback, predict) if feedback else None
    if hook_factory is None:
        hook_factory = LaunchHook
    hook = hook_factory(engine.on_launch if fb is None else fb.on_launch, api_callbacks=free_callbacks(engine.on_free))
    hook.start()
    try:
        yield engine
    finally:
        hook.stop()
        if fb is not None:
            monitor.stop()
            fb.round()
