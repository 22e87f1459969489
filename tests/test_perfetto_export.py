"""`pagecast export perfetto`: the written file parsed back with the perfetto package's protobuf definitions.

(trace_processor would answer the same questions by SQL, but the package fetches its binary from the
network at run time, which these machines cannot reach.)
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast import trace as T
from pagecast.cli import main
from pagecast.replay.results_io import read_results
from pagecast.report.perfetto_writer import lanes

sys.path.insert(0, str(Path(__file__).parent))
from nsys_fixture import make_export  # noqa: E402


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


class Parsed:
    """Tracks (uuid -> name, parent, counter?) and events per track, names resolved through interning."""

    def __init__(self, path: Path):
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent
        trace = Trace.FromString(path.read_bytes())
        self.tracks: dict[int, dict] = {}
        self.events: dict[int, list] = defaultdict(list)
        names: dict[int, str] = {}
        seqs = set()
        for pkt in trace.packet:
            seqs.add(pkt.trusted_packet_sequence_id)
            if pkt.HasField("track_descriptor"):
                d = pkt.track_descriptor
                self.tracks[d.uuid] = {"name": d.name, "parent": d.parent_uuid if d.HasField("parent_uuid") else None,
                                       "counter": d.HasField("counter"), "rank": d.sibling_order_rank}
            for e in pkt.interned_data.event_names:
                names[e.iid] = e.name
            if pkt.HasField("track_event"):
                ev = pkt.track_event
                name = names.get(ev.name_iid) if ev.name_iid else ev.name or None
                kind = {TrackEvent.TYPE_SLICE_BEGIN: "B", TrackEvent.TYPE_SLICE_END: "E",
                        TrackEvent.TYPE_INSTANT: "I", TrackEvent.TYPE_COUNTER: "C"}[ev.type]
                args = {a.name: _val(a) for a in ev.debug_annotations}
                self.events[ev.track_uuid].append((pkt.timestamp, kind, name, ev.counter_value, args))
        assert seqs == {1}
        for u, evs in self.events.items():
            assert u in self.tracks, "an event on an undeclared track"
            evs.sort(key=lambda e: (e[0], e[1] != "E"))   # trace_processor's order: ends before begins at a tie

    def find(self, name: str, parent: str | None = None) -> int:
        hits = [u for u, t in self.tracks.items() if t["name"] == name
                and (parent is None or self.tracks.get(t["parent"], {}).get("name") == parent)]
        assert len(hits) == 1, (name, parent, hits)
        return hits[0]

    def children(self, uuid: int) -> list[str]:
        kids = [(t["rank"], t["name"]) for t in self.tracks.values() if t["parent"] == uuid]
        return [n for _, n in sorted(kids)]

    def slices(self, uuid: int) -> list[tuple[int, int, str, dict]]:
        """(start, end, name, args) of a slice track; checks begins and ends pair up and nest."""
        out, stack = [], []
        for ts, kind, name, _, args in self.events[uuid]:
            if kind == "B":
                stack.append((ts, name, args))
            elif kind == "E":
                s, n, a = stack.pop()
                out.append((s, ts, n, a))
        assert not stack
        out.sort()
        for (s0, e0, *_), (s1, e1, *_) in zip(out, out[1:]):
            assert s1 >= e0 or e1 <= e0, "slices on one track must not partly overlap"
        return out

    def counter(self, uuid: int) -> list[tuple[int, int]]:
        assert self.tracks[uuid]["counter"]
        return [(ts, v) for ts, kind, _, v, _ in self.events[uuid] if kind == "C"]


def _val(a):
    for f in ("int_value", "double_value", "string_value", "bool_value"):
        if a.HasField(f):
            return getattr(a, f)
    return None


@pytest.fixture
def nsys_trace(tmp_path, capsys):
    src = tmp_path / "run.sqlite"
    counts = make_export(src, n_kernels=12)
    out = tmp_path / "run.pctrace"
    assert run_cli(capsys, "import", "nsys", src, "-o", out)[0] == 0
    return out, counts


def test_trace_export_parses_back(nsys_trace, tmp_path, capsys):
    trace_dir, counts = nsys_trace
    tr = T.read_trace(trace_dir)
    out = tmp_path / "t.pftrace"
    code, stdout, err = run_cli(capsys, "export", "perfetto", trace_dir, "-o", out, "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["kind"] == "trace" and doc["launches"] == counts["launches"]
    p = Parsed(out)
    root = p.find("pagecast trace: run")
    assert p.children(root)[0] == "kernels"
    # kernels per stream, named as the trace names them
    kern = p.find("kernels")
    assert p.children(kern) == ["GPU 0 stream 7", "GPU 0 stream 13"]
    L = tr.launches.to_pylist()
    for s in (7, 13):
        sl = p.slices(p.find(f"GPU 0 stream {s}"))
        mine = [r for r in L if r["stream"] == s]
        assert [(a, b, n) for a, b, n, _ in sl] == [(r["start_ns"], r["end_ns"], r["kernel"]) for r in mine]
        assert [x[3]["launch_id"] for x in sl] == [r["launch_id"] for r in mine]
    # faults: an instant per record, the cumulative counter ends at the total
    fi = p.events[p.find("GPU page faults")]
    assert len(fi) == counts["fault_records"] and {e[1] for e in fi} == {"I"}
    assert sum(e[4]["count"] for e in fi) == counts["faults"]
    cum = p.counter(p.find("faults (cumulative)"))
    assert cum[-1][1] == counts["faults"] and all(b[1] >= a[1] for a, b in zip(cum, cum[1:]))
    # migrations by cause: slices and cumulative bytes
    M = tr.migrations.to_pylist()
    for (d, c), nbytes in {("htod", "coherence"): None, ("htod", "prefetch"): None, ("dtoh", "eviction"): None,
                           ("htod", "user"): None}.items():
        rows = [m for m in M if m["direction"] == d and m["cause"] == c]
        lanes_ = [u for u, t in p.tracks.items() if t["name"].split(" #")[0] == f"{d} {c}"]
        n = sum(len(p.slices(u)) for u in lanes_)
        assert n == len(rows) > 0
        total = p.counter(p.find(f"{d} {c} bytes (cumulative)"))[-1][1]
        assert total == sum(m["bytes"] for m in rows) == counts["migrated_bytes_by_cause"][c]
    # allocations: lifetime slices per kind and live bytes
    A = tr.allocations.to_pylist()
    g = p.find("allocations")
    managed = [u for u, t in p.tracks.items() if t["parent"] == g and t["name"].split(" #")[0] == "managed"]
    assert sum(len(p.slices(u)) for u in managed) == sum(a["kind"] == "managed" for a in A)
    live = p.counter(p.find("managed bytes live"))
    assert max(v for _, v in live) == sum(a["bytes"] for a in A if a["kind"] == "managed")
    assert live[-1][1] == sum(a["bytes"] for a in A if a["kind"] == "managed" and a["free_ns"] is None)


@pytest.fixture
def results(tmp_path, capsys):
    from pagecast.datasets.registry import make_trace
    a = make_trace("stream", tmp_path / "a.pctrace", scale=0.02, seed=1)
    b = make_trace("jacobi2d", tmp_path / "b.pctrace", scale=0.02, seed=1)
    out = tmp_path / "r.parquet"
    code, _, err = run_cli(capsys, "replay", a, b, "--policy", "demand,swap,oracle", "--oversub", "1.5,3", "-o", out,
                           "--timeslice", "0.05")
    assert code == 0, err
    return out


def test_results_export_lines_policies_up(results, tmp_path, capsys):
    out = tmp_path / "r.pftrace"
    code, stdout, err = run_cli(capsys, "export", "perfetto", results, "-o", out, "--json")
    assert code == 0, err
    runs, tl = read_results(results)
    p = Parsed(out)
    assert json.loads(stdout)["runs"] == runs.num_rows == 6
    for r in runs.to_pylist():
        label = f"{r['workload']}: {r['oversub']:.0%} oversubscription"
        group = next(u for u, t in p.tracks.items() if t["parent"] is None and t["name"].startswith(label))
        # the run order, one above the other (a plan's span beside its policy where wider than units)
        assert [c.split(" (")[0] for c in p.children(group)] == ["demand", "swap", "oracle"]
        pol = next(u for u, t in p.tracks.items() if t["parent"] == group and t["name"].split(" (")[0] == r["policy"])
        assert p.children(pol) == ["kernels: stream", "kernels: jacobi2d", "stalls", "htod bytes per launch",
                                   "dtoh bytes per launch", "faults per launch"]
        mine = tl.filter(tl.column("run").to_numpy() == r["run"]).to_pylist()
        n = 0
        for task in ("stream", "jacobi2d"):
            sl = p.slices(next(u for u, t in p.tracks.items() if t["parent"] == pol and t["name"] == f"kernels: {task}"))
            rows = sorted((x for x in mine if x["task_name"] == task), key=lambda x: x["start_s"])
            assert [s[2] for s in sl] == [x["kernel"] for x in rows]
            assert [s[0] for s in sl] == [round(x["start_s"] * 1e9) for x in rows]
            n += len(sl)
        assert n == len(mine)
        stalls = p.slices(next(u for u, t in p.tracks.items() if t["parent"] == pol and t["name"] == "stalls"))
        assert len(stalls) == sum(x["stall_s"] > 0 for x in mine)
        assert abs(sum(e - s for s, e, *_ in stalls) / 1e9 - r["stall_s"]) < 1e-6 * max(1.0, r["stall_s"]) + 1e-6
        htod = p.counter(next(u for u, t in p.tracks.items() if t["parent"] == pol
                              and t["name"] == "htod bytes per launch"))
        assert sum(v for _, v in htod) == r["htod_bytes"]
        faults = p.counter(next(u for u, t in p.tracks.items() if t["parent"] == pol and t["name"] == "faults per launch"))
        assert sum(v for _, v in faults) == r["faults"]


def test_results_export_filters_and_bad_input(results, tmp_path, capsys):
    out = tmp_path / "r.pftrace"
    code, stdout, err = run_cli(capsys, "export", "perfetto", results, "-o", out, "--policy", "demand", "--json")
    assert code == 0, err
    p = Parsed(out)
    assert {t["name"].split(" (")[0] for t in p.tracks.values()} & {"demand", "swap", "oracle"} == {"demand"}
    for argv, needle in (([results, "-o", tmp_path / "x.pftrace", "--policy", "alloc"], "not in the results"),
                         ([tmp_path, "-o", tmp_path / "x.pftrace"], "not a pagecast trace"),
                         ([tmp_path / "nope", "-o", tmp_path / "x.pftrace"], "no such file"),
                         ([results, "-o", out], "--force")):
        code, _, err = run_cli(capsys, "export", "perfetto", *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "x.pftrace").exists()


def test_synthetic_trace_exports(tmp_path, capsys):
    from pagecast.datasets.registry import make_trace
    t = make_trace("spmv-cg", tmp_path / "s.pctrace", scale=0.02, seed=1)
    out = tmp_path / "s.pftrace"
    code, _, err = run_cli(capsys, "export", "perfetto", t, "-o", out)
    assert code == 0, err
    p = Parsed(out)
    tr = T.read_trace(t)
    n = sum(len(p.slices(u)) for u, x in p.tracks.items() if x["name"].startswith("GPU "))
    assert n == tr.n_launches


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 200)), max_size=60))
def test_lanes_never_overlap_and_use_the_least(iv):
    s = np.array([a for a, _ in iv], np.int64)
    e = s + np.array([b for _, b in iv], np.int64)
    lane = lanes(s, e)
    for k in set(lane.tolist()):
        sel = np.flatnonzero(lane == k)
        o = sel[np.argsort(s[sel], kind="stable")]
        assert (s[o][1:] >= e[o][:-1]).all()
    # no more lanes than intervals meet at one instant, no fewer than overlap there
    n_lanes = int(lane.max()) + 1 if len(lane) else 0
    open_depth = max((int(((s <= t) & (e > t)).sum()) for t in s.tolist()), default=0)
    closed_depth = max((int(((s <= t) & (e >= t)).sum()) for t in s.tolist()), default=0)
    assert open_depth <= n_lanes <= max(closed_depth, 1 if len(lane) else 0)


def _packets(path: Path):
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace
    return list(Trace.FromString(path.read_bytes()).packet)


@pytest.mark.parametrize("batch", [1, 2, 7])
def test_batches_lose_no_event(tmp_path, monkeypatch, batch):
    """Across every batch boundary each packet carries its event, and slices pair (a packet must
    not be flushed before the caller fills it: that wrote an empty packet and lost the event)."""
    from pagecast.report import perfetto_writer as PW
    monkeypatch.setattr(PW, "BATCH", batch)
    out = tmp_path / "w.pftrace"
    with PW.PerfettoWriter(out) as w:
        a = w.track("a")
        b = w.track("b", a)
        c = w.track("c", a, counter_unit="count")
        w.slices(b, np.arange(23) * 10, np.arange(23) * 10 + 5, [f"k{i % 3}" for i in range(23)], {"i": np.arange(23)})
        w.instants(a, np.arange(5), "tick")
        w.counter(c, np.arange(9), np.arange(9))
    pk = _packets(out)
    assert len(pk) == 3 + 2 * 23 + 5 + 9
    assert all(p.HasField("track_descriptor") or p.HasField("track_event") for p in pk)
    p = Parsed(out)
    got = p.slices(b)
    assert [(s, e, n, x["i"]) for s, e, n, x in got] == [(10 * i, 10 * i + 5, f"k{i % 3}", i) for i in range(23)]
    assert p.counter(c) == [(i, i) for i in range(9)]


def test_export_in_small_batches_has_no_empty_packet(tmp_path, capsys, monkeypatch):
    from pagecast.datasets.registry import make_trace
    from pagecast.report import perfetto_writer as PW
    monkeypatch.setattr(PW, "BATCH", 97)
    t = make_trace("llm-decode", tmp_path / "l.pctrace", scale=0.02, seed=1)
    out = tmp_path / "l.pftrace"
    code, _, err = run_cli(capsys, "export", "perfetto", t, "-o", out)
    assert code == 0, err
    pk = _packets(out)
    assert len(pk) > 10 * 97
    assert all(p.HasField("track_descriptor") or p.HasField("track_event") for p in pk)
    p = Parsed(out)
    for u, x in p.tracks.items():
        if not x["counter"]:
            p.slices(u)   # every begin has its end, properly nested
    n = sum(len(p.slices(u)) for u, x in p.tracks.items() if x["name"].startswith("GPU "))
    assert n == T.read_trace(t).n_launches
