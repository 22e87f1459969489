"""The lookahead switched on through the GPU runner's child, end to end on the stand-in driver: a
planned run given a trace prefetches each launch's footprint at the callback before its own, on a
copy stream, unless the request turns it off; indexed launches are never prefetched early."""

from __future__ import annotations

import json
import struct
import sys
import types
from pathlib import Path

import pytest

from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.footprints import footprints
from pagecast.replay.gpu import child as C
from pagecast.replay.online.lookahead import indexed_launches
from pagecast.replay.online.ranges import UNIT
from pagecast.replay.request import ReplayRequest
from pagecast.replay.unit_space import managed_bytes
from cuda_standin import FakeCuda, FakeHook, FakeMonitor

TRACE = Path(__file__).resolve().parent / "data" / "h200" / "jacobi2d-1.pctrace"
SHIFT = 1 << 36
STREAM = 77


def _workload(tr, f: FakeCuda, monkeypatch, tmp_path):
    """A workload script whose launches are the trace's, its pointers moved by SHIFT (another run's
    addresses); the stand-in logs a ("kernel", t) after each callback."""
    al = tr.allocations
    addrs, sizes = al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist()
    for a, n in zip(addrs, sizes):
        f.add_allocation(a + SHIFT, n)
    lo, hi = min(addrs), max(a + n for a, n in zip(addrs, sizes))
    rows = tr.launches.select([T.KERNEL, T.PARAM_OFFSETS, T.PARAM_SIZES, T.PARAM_DATA]).to_pylist()
    mod = types.ModuleType("pagecast_lookahead_launch")

    def launch(t):
        row = rows[t]
        data = bytearray(row[T.PARAM_DATA] or b"")
        for off, size in zip(row[T.PARAM_OFFSETS], row[T.PARAM_SIZES]):
            if size == 8 and lo <= struct.unpack_from("<Q", data, off)[0] < hi:
                struct.pack_into("<Q", data, off, struct.unpack_from("<Q", data, off)[0] + SHIFT)
        FakeHook.current.on_launch(LaunchArgs(
            kernel=row[T.KERNEL], function=0, grid_x=1, grid_y=1, grid_z=1, block_x=1, block_y=1, block_z=1,
            shared_mem_bytes=0, stream=STREAM, correlation_id=t, param_offsets=tuple(row[T.PARAM_OFFSETS]),
            param_sizes=tuple(row[T.PARAM_SIZES]), param_data=bytes(data), cbid=0))
        f.log.append(("kernel", t))

    mod.launch = launch
    monkeypatch.setitem(sys.modules, "pagecast_lookahead_launch", mod)
    script = tmp_path / "work.py"
    script.write_text(f"import pagecast_lookahead_launch as L\nfor t in range({len(rows)}):\n    L.launch(t)\n")
    return script


def _child(tmp_path, monkeypatch, policy, *, lookahead, capacity=None, model=None):
    tr = T.read_trace(TRACE)
    f = FakeCuda()
    script = _workload(tr, f, monkeypatch, tmp_path)
    req = ReplayRequest(backend="gpu", policies=(policy,), traces=(str(TRACE),), model=model,
                        capacity=None if capacity is None else (capacity,), workload=("python", str(script)),
                        lookahead=lookahead)
    job, res = tmp_path / "job.json", tmp_path / "r.json"
    job.write_text(C.ChildJob(request=req, result=str(res)).to_json())
    assert C.child_main([str(job)], cuda=f, monitor=FakeMonitor(f), hook_factory=FakeHook) == 0
    out = json.loads(res.read_text())
    assert out.get("error") is None, out
    return f, out, tr


def _units(tr, t: int) -> set[int]:
    """Launch t's footprint in the run's addresses, as 2 MiB units."""
    fp = footprints(tr)
    ps = fp.page_size
    out = set()
    for k in range(fp.indptr[t], fp.indptr[t + 1]):
        a, b = int(fp.start[k]) * ps + SHIFT, int(fp.end[k]) * ps + SHIFT
        out |= set(range(a // UNIT, (b - 1) // UNIT + 1))
    return out


def _callbacks(f: FakeCuda) -> list[list]:
    """The stand-in's log cut at each kernel: callback t's calls at [t]."""
    out, cur = [], []
    for x in f.log:
        if x[0] == "kernel":
            out.append(cur)
            cur = []
        else:
            cur.append(x)
    return out


@pytest.mark.parametrize("capacity", [None, "half"])
def test_the_child_looks_ahead_for_the_oracle_by_default(tmp_path, monkeypatch, capacity):
    cap = managed_bytes(T.read_trace(TRACE)) // 2 if capacity == "half" else None
    f, out, tr = _child(tmp_path, monkeypatch, "oracle", lookahead=True, capacity=cap)
    assert out["lookahead"] >= 1 and out["ahead_launches"] > 0   # the deepest window (lookahead.py)
    gpu = [x for x in f.log if x[0] == "gpu"]
    assert gpu and all(x[3] != STREAM for x in gpu)             # on the copy stream, never the launch's
    # launch t + 1's data that launch t does not touch went at callback t: before kernel t was queued
    early = 0
    for t, ops in enumerate(_callbacks(f)[:-1]):
        later = _units(tr, t + 1) - _units(tr, t)
        moved = {u for x in ops if x[0] == "gpu" for u in range(x[1] // UNIT, (x[1] + x[2] - 1) // UNIT + 1)}
        early += bool(moved & later)
        waits = [x for x in ops if x[0] == "wait" and x[1] == STREAM]
        assert len(waits) <= 1                                   # the launch's own event, at most
    assert early > 0


def test_no_lookahead_prefetches_on_the_launchs_own_stream(tmp_path, monkeypatch):
    f, out, _ = _child(tmp_path, monkeypatch, "oracle", lookahead=False)
    assert out["lookahead"] == 0 and out["ahead_launches"] == 0
    gpu = [x for x in f.log if x[0] == "gpu"]
    assert gpu and all(x[3] == STREAM for x in gpu)


def test_indexed_launches_are_never_planned_ahead():
    """A model kernel with an indexed region: its launches are in the skip set."""
    tr = T.read_trace(TRACE)
    k0 = tr.launches.column(T.KERNEL).to_pylist()[0]
    region = types.SimpleNamespace(cls="indexed")
    model = types.SimpleNamespace(kernels={k0: types.SimpleNamespace(regions=[region])})
    skip = indexed_launches(model, tr)
    names = tr.launches.column(T.KERNEL).to_pylist()
    assert skip == frozenset(t for t, k in enumerate(names) if k == k0) and skip


def test_the_child_looks_ahead_for_template_with_its_model(tmp_path, monkeypatch):
    """Template's lookahead plans on the model's predictions of the trace's launches; off, the
    same run prefetches on the launch's own stream only."""
    from pagecast.predict.fit import fit_model
    from pagecast.predict.model_io import save_model
    model = tmp_path / "m.json"
    save_model(fit_model([T.read_trace(TRACE)]), model)
    on_dir, off_dir = tmp_path / "on", tmp_path / "off"
    on_dir.mkdir()
    off_dir.mkdir()
    f, out, _ = _child(on_dir, monkeypatch, "template", lookahead=True, model=str(model))
    assert out["lookahead"] >= 1 and out["ahead_launches"] > 0   # the deepest window (lookahead.py)
    assert all(x[3] != STREAM for x in f.log if x[0] == "gpu")
    g, off, _ = _child(off_dir, monkeypatch, "template", lookahead=False, model=str(model))
    assert off["lookahead"] == 0 and off["ahead_launches"] == 0
    assert all(x[3] == STREAM for x in g.log if x[0] == "gpu")


@pytest.mark.parametrize("flags, on", [([], True), (["--no-lookahead"], False)])
def test_the_cli_turns_the_lookahead_off_only_when_asked(flags, on):
    import argparse

    from pagecast.replay.commands import ReplayCommand, replay_request
    p = argparse.ArgumentParser()
    ReplayCommand().add_arguments(p)
    args = p.parse_args(["--backend", "gpu", "--policy", "oracle", str(TRACE), *flags, "--", "python", "w.py"])
    req = replay_request(args)
    assert req.lookahead is on
    assert C.ChildJob.from_json(C.ChildJob(request=req.one_run("oracle", None), result="r.json").to_json()
                                ).request.lookahead is on
