"""The GPU child's `dropped_records` counts every activity record lost: the ones CUPTI dropped
(its buffers were full, `activity_get_num_dropped_records`) and the ones that arrived but could
not be read. The real CuptiMonitor runs, with cupti-python's functions replaced by recorders."""

from __future__ import annotations

import ctypes
import json
from types import SimpleNamespace as R

import pytest

from pagecast.replay.gpu import child as C
from pagecast.replay.gpu.cupti_monitor import MAX_KEPT, CuptiMonitor, UvmCounts, _add_record
from pagecast.replay.request import ReplayRequest

from cuda_standin import FakeCuda

cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")


class FakeCupti:
    """The activity calls CuptiMonitor makes: a flush delivers one unreadable record once; CUPTI
    reports `drops` dropped records, one number per query."""

    def __init__(self, monkeypatch, drops):
        self.drops = list(drops)
        self.completed = None
        self.queries = 0
        monkeypatch.setattr(cupti, "activity_register_callbacks", self.register)
        monkeypatch.setattr(cupti, "activity_configure_unified_memory_counter", lambda ptr, n: None)
        monkeypatch.setattr(cupti, "activity_enable", lambda k: None)
        monkeypatch.setattr(cupti, "activity_disable", lambda k: None)
        monkeypatch.setattr(cupti, "activity_flush_all", self.flush)
        monkeypatch.setattr(cupti, "activity_get_num_dropped_records", self.dropped)
        self.bad = [R(kind=int(cupti.ActivityKind.UNIFIED_MEMORY_COUNTER))]   # no counter_kind: unreadable

    def register(self, requested, completed):
        self.completed = completed

    def flush(self, flag):
        batch, self.bad = self.bad, []
        if batch:
            self.completed(batch)

    def dropped(self, context, stream, ptr):
        self.queries += 1
        ctypes.c_size_t.from_address(ptr).value = self.drops.pop(0) if self.drops else 0


def test_the_monitor_counts_cuptis_dropped_records_and_unreadable_ones(monkeypatch):
    f = FakeCupti(monkeypatch, drops=[7, 3])
    m = CuptiMonitor(0)
    m.start()
    c = m.poll()                       # the flush brings the unreadable record; CUPTI says 7 dropped
    assert (c.dropped, c.cupti_dropped, c.decode_errors) == (8, 7, 1)
    c = m.stop()                       # the last query, after the final flush: 3 more
    assert (c.dropped, c.cupti_dropped, c.decode_errors) == (11, 10, 1) and f.queries == 2


def test_records_past_the_cap_are_counted_as_not_kept():
    c = UvmCounts()
    c.fault_records = [(0, 0, 1)] * MAX_KEPT
    _add_record(c, "fault", {"value": 2, "start": 5, "address": 4096}, keep=True)
    assert c.faults == 2 and len(c.fault_records) == MAX_KEPT and c.not_kept == 1


class _Hook:
    def __init__(self, on_launch, api_callbacks=None):
        self.errors = 0

    def start(self):
        return self

    def stop(self):
        pass


def test_the_child_reports_every_lost_record(tmp_path, monkeypatch):
    FakeCupti(monkeypatch, drops=[4])
    script = tmp_path / "w.py"
    script.write_text("x = 1\n")
    res = tmp_path / "r.json"
    job = tmp_path / "job.json"
    job.write_text(C.ChildJob(ReplayRequest(backend="gpu", policies=("demand",), workload=("python", str(script))),
                              result=str(res)).to_json())
    code = C.child_main([str(job)],
                        cuda=FakeCuda(), monitor=CuptiMonitor(0), hook_factory=_Hook)
    out = json.loads(res.read_text())
    assert code == 0, out
    assert out["dropped_records"] == 5 and out["dropped_by_cupti"] == 4 and out["record_decode_errors"] == 1
    assert any("5 activity records were lost" in w for w in out["warnings"])
