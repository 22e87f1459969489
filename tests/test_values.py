"""The optional `values` table: writing it within its limit, reading it back, bad input, and when
values exist (the launch that wrote them, as the trace observed it)."""

from __future__ import annotations

import json
import struct
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast import trace as T
from pagecast import values as V
from pagecast.cli import main
from pagecast.errors import TraceError

import index_workload as IW
from conftest import BASE, MiB, write_hand_trace


def _values_part(path, rows: dict, manifest_values: dict | None = None):
    (path / T.VALUES).mkdir(exist_ok=True)
    pq.write_table(pa.table(rows), path / T.VALUES / "part-00000.parquet")
    if manifest_values is not None:
        m = json.loads((path / T.MANIFEST).read_text())
        m[T.VALUES_KEY] = manifest_values
        (path / T.MANIFEST).write_text(json.dumps(m))


def _rows(lids, addrs, datas, offs=None):
    return {"launch_id": pa.array(lids, pa.int64()), "param_offset": pa.array(offs or [0] * len(lids), pa.int32()),
            "address": pa.array(addrs, pa.uint64()), "bytes": pa.array([len(d) for d in datas], pa.int64()),
            "data": pa.array(datas, pa.binary())}


def test_a_trace_without_values_reads_and_one_with_them_too(tmp_path):
    t = T.read_trace(write_hand_trace(tmp_path / "a"))
    assert t.values is None and V.image(t).n_rows == 0
    p = write_hand_trace(tmp_path / "b")
    _values_part(p, _rows([1, 3], [BASE, BASE + 64], [b"\1\0\0\0", b"\2\0\0\0\3\0\0\0"]),
                 {"limit_bytes": 4096, "clipped_bytes": 0, "clipped_launches": 0, "repeats": "kept"})
    t = T.read_trace(p)
    assert t.values.num_rows == 2 and t.values_report["clipped_bytes"] == 0
    im = V.image(t)
    assert im.find([1, 2, 3], np.array([BASE, BASE, BASE + 64], np.uint64)).tolist() == [0, -1, 1]
    assert im.ints(1, 5).tolist() == [2, 3]   # fewer values than asked: what the row holds


def test_readers_that_do_not_know_values_ignore_it(tmp_path):
    """DuckDB-style readers see the table as a directory beside the others; `query` registers it."""
    p = write_hand_trace(tmp_path / "v")
    _values_part(p, _rows([0], [BASE], [b"\7\0\0\0"]))
    assert main(["query", str(p), "SELECT count(*) AS n FROM values", "--csv"]) == 0


def test_bad_values_are_dropped_or_clipped_and_counted(tmp_path):
    p = write_hand_trace(tmp_path / "bad", n=4)
    data = [b"x" * 100, b"y" * 8, b"z" * 8, b"w" * 8, b"q" * 8]
    # a row past the launch limit (100 > 64), a row for launch 9 (none), a pointer word outside the
    # parameters (offset 40 of a 24-byte buffer), a row pointing into no allocation, one past its end
    rows = _rows([0, 9, 1, 2, 3], [BASE, BASE, BASE, 0x1000, BASE + 4 * MiB - 4], data, [0, 0, 40, 0, 8])
    _values_part(p, rows, {"limit_bytes": 64, "clipped_bytes": 0, "clipped_launches": 0, "repeats": "kept"})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t = T.read_trace(p)
        im = V.image(t)
    msgs = [str(x.message) for x in w]
    assert any("rows for launches the trace does not have" in m and "past the limit of 64" in m for m in msgs)
    assert any("point into no allocation" in m for m in msgs)
    r = t.values_report
    assert (r["dropped_no_launch"], r["dropped_no_pointer"], r["clipped_bytes"], r["clipped_launches"]) == (1, 1, 36, 1)
    assert im.report == {"clipped_to_allocation": 4, "outside_allocation": 1}
    assert t.values.column(T.BYTES).to_pylist() == [64, 8, 8]
    assert im.nbytes.tolist() == [64, 4]


def test_contradictory_values_rows_are_refused_in_one_line(tmp_path):
    p = write_hand_trace(tmp_path / "c")
    rows = _rows([0], [BASE], [b"abcd"])
    rows["bytes"] = pa.array([8], pa.int64())   # says 8, holds 4
    _values_part(p, rows)
    with pytest.raises(TraceError, match="says 8 bytes but its data holds 4"):
        T.read_trace(p)
    for bad in ({"limit_bytes": 0}, {"repeats": "sometimes"}, "64KiB"):
        q = write_hand_trace(tmp_path / f"m{len(str(bad))}")
        m = json.loads((q / T.MANIFEST).read_text())
        m[T.VALUES_KEY] = bad
        (q / T.MANIFEST).write_text(json.dumps(m))
        with pytest.raises(TraceError, match="values"):
            T.read_trace(q)
    assert main(["summary", str(p)]) == 2


def test_recorder_keeps_the_limit_and_leaves_out_repeats():
    rec = V.ValuesRecorder(limit=10, omit_repeats=True)
    rec.launch(0, [(0, 100, b"abcd"), (8, 200, b"0123456789")])   # 14 bytes: the second clipped to 6
    rec.launch(1, [(0, 100, b"abcd")])                            # a repeat: left out
    rec.launch(2, [(0, 100, b"abce")])
    cols = rec.take()
    assert cols[T.LAUNCH_ID] == [0, 0, 2] and cols[T.BYTES] == [4, 6, 4]
    assert rec.manifest() == {"limit_bytes": 10, "clipped_bytes": 4, "clipped_launches": 1, "repeats": "omitted"}
    assert rec.omitted == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.binary(min_size=1, max_size=12)), min_size=1, max_size=30),
       st.integers(1, 24))
def test_omitted_repeats_read_back_as_kept_ones(reads, limit):
    """A reader of a trace with repeats left out sees, for every launch and address, what a trace
    that kept every row holds (the peer: the recorder with omit_repeats off)."""
    kept, omitted = V.ValuesRecorder(limit, False), V.ValuesRecorder(limit, True)
    for i, (a, d) in enumerate(reads):
        kept.launch(i, [(0, 4096 * a, d)])
        omitted.launch(i, [(0, 4096 * a, d)])
    ka, oa = kept.take(), omitted.take()
    for i, (a, _) in enumerate(reads):
        want = [d for lid, ad, d in zip(ka[T.LAUNCH_ID], ka[T.ADDRESS], ka[T.DATA]) if lid == i and ad == 4096 * a]
        # the latest row from that address at or before launch i
        got = [d for lid, ad, d in zip(oa[T.LAUNCH_ID], oa[T.ADDRESS], oa[T.DATA]) if lid <= i and ad == 4096 * a]
        assert want == got[-1:]


def test_workload_models_record_their_index_values(tmp_path):
    from pagecast.datasets.registry import make_trace
    t = T.read_trace(make_trace("moe-decode", tmp_path / "moe", scale=0.05, seed=1))
    m = t.manifest[T.VALUES_KEY]
    assert m["repeats"] == "omitted" and m["clipped_bytes"] == 0 and t.values.num_rows > 0
    ffn = [k for k in set(t.launches.column(T.KERNEL).to_pylist()) if "moe_expert_ffn" in k]
    assert ffn
    lids = t.values.column(T.LAUNCH_ID).to_numpy()
    kern = np.array(t.launches.column(T.KERNEL).to_pylist(), dtype=object)[lids]
    assert any("moe_expert_ffn" in k for k in kern) and any("embedding_lookup" in k for k in kern)


def _truth_writer(t: T.Trace, c: int, addr: int, nb: int) -> int:
    tr = t.truth
    lid, a, b = (tr.column(x).to_numpy() for x in (T.LAUNCH_ID, T.ADDRESS, T.BYTES))
    w = (np.array(tr.column(T.ACCESS).to_pylist()) != "read") & (lid < c) & (a < addr + nb) & (a + b > addr)
    return int(lid[w].max()) if w.any() else -1


def test_producers_are_never_before_the_true_writer(tmp_path):
    """On the hand-made gather (ids written two launches before the gather reads them) and on the
    workload models, the launch after which values exist is the writer the truth table shows, or
    later: never earlier."""
    from pagecast.datasets.registry import make_trace
    traces = [T.read_trace(IW.build(seed=3).write(tmp_path / "g.pctrace"))]
    for name in ("moe-decode", "llm-prefill-decode", "spmv-cg"):
        traces.append(T.read_trace(make_trace(name, tmp_path / name, scale=0.05, seed=2)))
    for t in traces:
        im = V.image(t)
        lid = im.launch
        rows = np.arange(im.n_rows)
        prod = V.producers(t, lid, rows)
        exact = 0
        for c, r, p in zip(lid, rows, prod):
            tw = _truth_writer(t, int(c), int(im.address[r]), int(im.nbytes[r]))
            assert p >= tw, (t.name, c, p, tw)
            exact += p == max(tw, -1) or tw < 0
        assert exact >= 0.99 * len(lid)
    g = traces[0]
    prod = V.producers(g, V.image(g).launch, np.arange(V.image(g).n_rows))
    assert (V.image(g).launch - prod == 2).all()   # write_ids, then scale_buf, then the gather


def test_natural_mode_waits_for_the_launch_before(tmp_path):
    t = T.read_trace(IW.build(seed=1).write(tmp_path / "n.pctrace", mode="natural"))
    im = V.image(t)
    assert (V.producers(t, im.launch, np.arange(im.n_rows)) == im.launch - 1).all()


def test_summary_reports_the_values_table(tmp_path):
    p = IW.build(seed=1).write(tmp_path / "s.pctrace")
    from pagecast.summary import trace_summary
    s = trace_summary(T.read_trace(p))
    assert s["values"]["rows"] == 24 and s["values"]["limit_bytes"] == T.VALUES_LIMIT


def test_pointer_word_of_each_row_is_the_index_parameter(tmp_path):
    t = T.read_trace(IW.build(seed=1).write(tmp_path / "w.pctrace"))
    data = t.launches.column(T.PARAM_DATA).to_pylist()
    for lid, off, addr in zip(*(t.values.column(c).to_pylist() for c in (T.LAUNCH_ID, T.PARAM_OFFSET, T.ADDRESS))):
        assert struct.unpack_from("<Q", data[lid], off)[0] == addr
