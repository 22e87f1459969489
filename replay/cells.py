"""A sweep's (policy, capacity) runs, its cells, run in threads as soon as what each waits for is done.

The planner's core and the simulator's engine release the GIL (plan/belady.py, sim/kernels.py),
so threads run cells on several cores. What orders the cells (sim/sweep.py says which):

- a policy's runs go one after the other by default, so that a policy holds one run's planner at
  a time (its peak alone is the one-by-one replay's); with --jobs given, a planned policy's
  capacities go at once after its first, which makes what the others share and keep in the
  workload's `extra` (its needs, its predictions: no two threads make it);
- a policy that runs last (oracle) plans and runs beside the others, and its run at a capacity
  is judged with theirs there (`Policy.with_rivals`) in a cell of its own, once they are done.

Cells of different policies run side by side. Of the cells ready to run, the one the most cells
wait for goes first (then the order submitted).

A cell may split its own work (`each`: the planner's candidates compared on a sample,
plan/sample.py): the pieces go before every cell, and the cell runs those no thread has taken
yet itself, so a cell never waits on a queue, and a core that would idle while it runs takes a
piece instead.

With one job every cell runs when it is submitted, in the order submitted: the sweep is the
one-by-one replay it always was. The runs are the same either way (each has its own context and
memory; what they share they only read, or make the same way: Workload.kept).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import Callable


class Cells:
    """Runs of `fn`s in `jobs` threads (one: inline, as submitted), each after the futures it waits for."""

    def __init__(self, jobs: int):
        self._cv = threading.Condition()
        # heap of (-cells waiting for it, order submitted, the job, its future: None for a piece)
        self._ready: list = []
        self._waiting: dict = {}      # future -> how many cells wait for it
        self._order = itertools.count()
        self._closed = False
        self._drop = False            # leaving on a failure: a cell not started is not started
        self._threads = [threading.Thread(target=self._work, name=f"pagecast-cell-{i}", daemon=True)
                         for i in range(jobs)] if jobs > 1 else []
        for t in self._threads:
            t.start()

    @property
    def inline(self) -> bool:
        return not self._threads

    def submit(self, fn: Callable[[], object], after: tuple[Future, ...] = ()) -> Future:
        """A future of fn(), started once every future in `after` is done (a failure there fails it)."""
        out: Future = Future()
        if self.inline:
            for f in after:
                f.result()   # inline: every one is done already (a failure is raised here)
            _settle(out, fn)
            return out
        order = next(self._order)
        with self._cv:
            for f in after:
                self._waiting[f] = self._waiting.get(f, 0) + 1
        left = [len(after)]

        def ready(_=None):
            with self._cv:
                left[0] -= 1
                if left[0] > 0:
                    return
            bad = next((f for f in after if f.exception() is not None), None)
            if bad is not None:
                out.set_exception(bad.exception())
                return
            with self._cv:
                if self._drop:
                    out.set_exception(CancelledError())
                    return
                heapq.heappush(self._ready, (-self._waiting.get(out, 0), order, partial(_settle, out, fn), out))
                self._cv.notify()

        if not after:
            left[0] = 1
            ready()
        for f in after:
            f.add_done_callback(ready)
        return out

    def _each(self, fns: list) -> list:
        pieces = [_Piece(fn) for fn in fns]
        with self._cv:
            for pc in pieces[1:]:   # the first is the caller's own
                heapq.heappush(self._ready, (_FIRST, next(self._order), pc.run, None))
            self._cv.notify_all()
        for pc in pieces:
            pc.run()   # a piece a thread took already is not run twice
        return [pc.out.result() for pc in pieces]

    def _work(self) -> None:
        _here.cells = self
        while True:
            with self._cv:
                while not self._ready and not self._closed:
                    self._cv.wait()
                if not self._ready:
                    return
                job = heapq.heappop(self._ready)[2]
            job()

    def close(self, drop: bool = False) -> None:
        """Wait for the cells running and (unless `drop`) those queued, then stop the threads."""
        dropped = []
        with self._cv:
            self._closed = True
            if drop:
                self._drop = True
                dropped = [x[3] for x in self._ready if x[3] is not None]   # a cell's pieces: the cell runs them
                self._ready.clear()
            self._cv.notify_all()
        for out in dropped:
            out.set_exception(CancelledError())   # and what waits for it fails too
        for t in self._threads:
            t.join()

    def __enter__(self) -> Cells:
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.close(drop=exc_type is not None)   # a failure: what has not started does not


_FIRST = -(1 << 62)   # a cell's pieces go before every cell


class _Piece:
    """One piece of a cell's work: run once, by whichever thread takes it first."""

    def __init__(self, fn: Callable[[], object]):
        self.fn = fn
        self.out: Future = Future()
        self._taken = threading.Lock()

    def run(self) -> None:
        if self._taken.acquire(blocking=False):
            fn, self.fn = self.fn, None
            _settle(self.out, fn)


_here = threading.local()   # .cells: the Cells whose thread this is


def each(fns: list[Callable[[], object]]) -> list:
    """[fn() for fn in fns], the pieces shared with the other threads of the Cells running the
    calling cell (none: one after the other here). The caller runs every piece no thread has taken."""
    cells = getattr(_here, "cells", None)
    if cells is None or len(fns) < 2:
        return [fn() for fn in fns]
    return cells._each(fns)


def _settle(out: Future, fn: Callable[[], object]) -> None:
    try:
        out.set_result(fn())
    except BaseException as e:   # handed to whoever reads the future (the sweep re-raises it)
        out.set_exception(e)
