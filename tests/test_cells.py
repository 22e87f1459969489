"""replay/cells.py: a sweep's runs in threads, each after what it waits for, the most waited-for first,
and a cell's pieces shared with idle threads."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast.replay.cells import Cells, each


def test_one_job_runs_each_cell_when_submitted_in_order():
    seen = []
    with Cells(1) as cells:
        assert cells.inline
        a = cells.submit(lambda: seen.append("a") or 1)
        assert seen == ["a"] and a.result() == 1   # done before submit returned
        b = cells.submit(lambda: seen.append("b") or 2, after=(a,))
        assert seen == ["a", "b"] and b.result() == 2


@settings(max_examples=30, deadline=None)
@given(deps=st.lists(st.lists(st.integers(0, 30), max_size=3), min_size=1, max_size=12),
       jobs=st.integers(2, 4))
def test_a_cell_starts_after_every_cell_it_waits_for_has_ended(deps, jobs):
    """Random graphs (a cell waits only for cells submitted before it), in threads: each cell starts
    after its cells end, every cell runs once, and the results are each cell's own."""
    lock = threading.Lock()
    events = []   # (cell, "start" | "end") in the order they happened

    def cell(i):
        def run():
            with lock:
                events.append((i, "start"))
            time.sleep(0.001)
            with lock:
                events.append((i, "end"))
            return i
        return run

    with Cells(jobs) as cells:
        futures = []
        waits = []
        for i, d in enumerate(deps):
            w = sorted({x % i for x in d}) if i else []
            waits.append(w)
            futures.append(cells.submit(cell(i), after=tuple(futures[j] for j in w)))
        assert [f.result(timeout=30) for f in futures] == list(range(len(deps)))
    at = {e: k for k, e in enumerate(events)}
    assert len(events) == 2 * len(deps)
    for i, w in enumerate(waits):
        assert all(at[(j, "end")] < at[(i, "start")] for j in w)


def _busy(cells, n, go):
    """n cells that hold a thread each until `go`, returned once every one is running."""
    running = [threading.Event() for _ in range(n)]

    def hold(ev):
        ev.set()
        go.wait()
    held = [cells.submit(lambda ev=ev: hold(ev)) for ev in running]
    assert all(ev.wait(10) for ev in running)
    return held


def test_of_the_ready_cells_the_most_waited_for_starts_first():
    """Two threads held busy; then two ready cells, the second waited for by two later cells: freed,
    a thread takes the second first, though it was submitted after."""
    go = threading.Event()
    started = []
    with Cells(2) as cells:
        hold = _busy(cells, 2, go)
        x = cells.submit(lambda: started.append("x"), after=(hold[0],))
        y = cells.submit(lambda: started.append("y"), after=(hold[0],))
        later = [cells.submit(lambda: None, after=(y, hold[1])) for _ in range(2)]
        go.set()
        for f in (x, y, *later):
            f.result(timeout=10)
    assert started[0] == "y"


def test_a_failure_fails_what_waits_for_it_and_reaches_the_reader():
    with Cells(2) as cells:
        bad = cells.submit(lambda: 1 / 0)
        after = cells.submit(lambda: "never", after=(bad,))
        with pytest.raises(ZeroDivisionError):
            after.result(timeout=10)
    with Cells(1) as cells:
        bad = cells.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            bad.result()
        with pytest.raises(ZeroDivisionError):
            cells.submit(lambda: "never", after=(bad,))


def test_a_cells_pieces_run_once_each_in_order_and_idle_threads_take_some():
    """`each` inside a cell: results in the order given, every piece run once; with a thread free, a
    piece runs on it while the cell runs another. Outside any cell it runs them here."""
    lock = threading.Lock()
    ran = []

    other = threading.Event()   # a piece ran on a thread other than the cell's
    cell_thread = []

    def piece(k):
        def run():
            me = threading.current_thread().name
            with lock:
                ran.append((k, me))
            if cell_thread and me != cell_thread[0]:
                other.set()
            if k == 0 and cell_thread:
                other.wait(10)   # the cell's own first piece: the other thread takes one meanwhile
            return k * k
        return run

    assert each([piece(k) for k in range(3)]) == [0, 1, 4]
    assert {t for _, t in ran} == {threading.current_thread().name}
    ran.clear()
    with Cells(2) as cells:
        def cell():
            cell_thread.append(threading.current_thread().name)
            return each([piece(k) for k in range(6)])
        out = cells.submit(cell).result(timeout=30)
    assert out == [k * k for k in range(6)]
    assert sorted(k for k, _ in ran) == list(range(6))   # once each
    assert len({t for _, t in ran}) == 2                  # the other thread took some


def test_leaving_on_a_failure_drops_what_has_not_started():
    """The sweep fails while both threads are busy: a cell waiting for one of them is never run, and
    the threads end once the running cells end."""
    go = threading.Event()
    ran = []
    threading.Timer(0.2, go.set).start()   # the running cells end after the failure
    with pytest.raises(RuntimeError):
        with Cells(2) as cells:
            first, _ = _busy(cells, 2, go)
            waiting = cells.submit(lambda: ran.append(1), after=(first,))
            queued = cells.submit(lambda: ran.append(2))
            after_queued = cells.submit(lambda: ran.append(3), after=(queued,))
            raise RuntimeError("the sweep failed")
    for f in (waiting, queued, after_queued):
        assert isinstance(f.exception(timeout=5), Exception)   # settled: nothing waits on them forever
    assert ran == []
