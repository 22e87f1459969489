"""Trace format v1: round trips, hand-written traces, and every rejection the spec implies."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pagecast import trace as T
from pagecast.cli import main
from pagecast.errors import OutputExistsError, TraceError
from pagecast.footprints import observed_footprints

from conftest import BASE, MiB, write_hand_trace


def test_hand_written_trace_reads(hand_trace):
    t = T.read_trace(hand_trace)
    assert t.n_launches == 4
    assert t.launches.schema == T.SCHEMAS[T.LAUNCHES]  # columns back in spec order, spec types
    assert t.allocations.column(T.ALLOC_NS).null_count == 2  # absent nullable column -> nulls
    assert t.manifest["future_key"] == {"nested": [1, 2]}  # unknown keys kept
    assert t.truth is None


def test_observed_footprint_attributes_by_time(hand_trace):
    fp = observed_footprints(T.read_trace(hand_trace))
    # launch 0: its fault (no launch_id, time 10 inside [0, 500]) and a coherence migration of 16 pages
    s, e = fp.of(0)
    base = BASE // 4096
    assert list(zip(s, e)) == [(base, base + 1), (base + 512, base + 528)]
    assert fp.pages_per_launch().tolist() == [17, 1, 1, 1]


def test_round_trip_with_parts(tmp_path):
    m = T.new_manifest(workload={"name": "rt"})
    path = tmp_path / "rt.pctrace"
    rows = {T.TIME_NS: np.arange(10), T.ADDRESS: (BASE + np.arange(10) * 4096).astype(np.uint64),
            T.COUNT: np.ones(10, np.int32), T.ACCESS: ["write"] * 10, T.DEVICE: np.zeros(10, np.int32)}
    with T.TraceWriter(path, m, part_rows=4) as w:
        assert json.loads((w.tmp / T.MANIFEST).read_text())["complete"] is False
        assert not path.exists()   # written into a temporary sibling, renamed into place at close
        w.append(T.FAULTS, rows)
        w.append(T.FAULTS, rows)
    parts = sorted((path / T.FAULTS).glob("*.parquet"))
    assert len(parts) == 2  # each append of 10 rows >= part_rows closes a part
    assert len(list((path / T.LAUNCHES).glob("*.parquet"))) == 1  # empty table: one zero-row part
    t = T.read_trace(path)
    assert t.complete and t.faults.num_rows == 20
    assert t.faults.column(T.LAUNCH_ID).null_count == 20
    assert t.faults.column(T.ADDRESS).to_pylist()[:2] == [BASE, BASE + 4096]


def test_writer_refuses_overwrite(tmp_path, hand_trace):
    with pytest.raises(OutputExistsError):
        T.TraceWriter(hand_trace, T.new_manifest())
    T.TraceWriter(hand_trace, T.new_manifest(), force=True).close()
    assert T.read_trace(hand_trace).n_launches == 0
    other = tmp_path / "notmine"
    other.mkdir()
    (other / "precious.txt").write_text("x")
    with pytest.raises(OutputExistsError):
        T.TraceWriter(other, T.new_manifest(), force=True)
    assert (other / "precious.txt").exists()


def test_crash_keeps_closed_parts(tmp_path):
    path = tmp_path / "crash.pctrace"
    with pytest.raises(RuntimeError):
        with T.TraceWriter(path, T.new_manifest(), part_rows=1, keep_partial=True) as w:
            w.append(T.TRUTH, {T.LAUNCH_ID: [0], T.ADDRESS: [BASE], T.BYTES: [10], T.ACCESS: ["read"]})
            raise RuntimeError("workload died")
    with pytest.warns(T.TraceWarning, match="incomplete"):
        t = T.read_trace(path)
    assert not t.complete and t.truth.num_rows == 1
    assert [p.name for p in tmp_path.iterdir()] == ["crash.pctrace"]


def test_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "gone.pctrace"
    with pytest.raises(RuntimeError):
        with T.TraceWriter(path, T.new_manifest(), part_rows=1) as w:
            w.append(T.TRUTH, {T.LAUNCH_ID: [0], T.ADDRESS: [BASE], T.BYTES: [10], T.ACCESS: ["read"]})
            raise RuntimeError("generator died")
    assert list(tmp_path.iterdir()) == []


def test_killed_writer_leaves_readable_debris_that_force_removes(tmp_path):
    """A writer killed outright (never closed) leaves its closed parts in its temporary sibling,
    readable as an incomplete trace; --force on the path removes that debris."""
    path = tmp_path / "k.pctrace"
    w = T.TraceWriter(path, T.new_manifest(), part_rows=1)
    w.append(T.TRUTH, {T.LAUNCH_ID: [0], T.ADDRESS: [BASE], T.BYTES: [10], T.ACCESS: ["read"]})
    dead = tmp_path / w.tmp.name.replace(f"-{os.getpid()}-", "-999999999-")
    w.tmp.rename(dead)   # as if its process had died
    assert not path.exists()
    with pytest.warns(T.TraceWarning, match="incomplete"):
        assert T.read_trace(dead).truth.num_rows == 1
    T.write_trace(path, T.new_manifest(), {}, force=False)   # without --force: debris left alone
    assert dead.exists()
    T.write_trace(path, T.new_manifest(), {}, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.pctrace"]


def test_incomplete_trace_reads_with_warning_via_cli(tmp_path, capsys):
    p = write_hand_trace(tmp_path / "inc.pctrace", manifest_extra={"complete": False})
    assert main(["summary", str(p), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["complete"] is False
    assert "incomplete" in err


def test_unsorted_launch_ids_are_put_in_order(tmp_path):
    p = write_hand_trace(tmp_path / "t.pctrace")
    t = pq.read_table(p / "launches" / "part-00000.parquet")
    pq.write_table(t.take([3, 1, 0, 2]), p / "launches" / "part-00000.parquet")
    assert T.read_trace(p).launches.column(T.LAUNCH_ID).to_pylist() == [0, 1, 2, 3]


def test_parts_read_in_name_order(tmp_path):
    p = write_hand_trace(tmp_path / "t.pctrace")
    f = pq.read_table(p / "faults" / "part-00000.parquet")
    (p / "faults" / "part-00000.parquet").unlink()
    pq.write_table(f.slice(2), p / "faults" / "part-00001.parquet")
    pq.write_table(f.slice(0, 2), p / "faults" / "part-00000.parquet")
    assert T.read_trace(p).faults.column(T.TIME_NS).to_pylist() == f.column("time_ns").to_pylist()


# ---- rejections: one line on stderr, exit 2, no traceback --------------------

def _rewrite(p, table, fn):
    part = p / table / "part-00000.parquet"
    pq.write_table(fn(pq.read_table(part)), part)


def _set_col(t: pa.Table, name, arr):
    return t.set_column(t.column_names.index(name), name, arr)


def _manifest(p, **changes):
    m = json.loads((p / "manifest.json").read_text())
    (p / "manifest.json").write_text(json.dumps({**m, **changes}))


def _add_truth(p, launch_ids, address=BASE):
    (p / "truth").mkdir()
    pq.write_table(pa.table({"launch_id": pa.array(launch_ids, pa.int64()),
                             "address": pa.array([address] * len(launch_ids), pa.uint64()),
                             "bytes": pa.array([4096] * len(launch_ids), pa.int64()),
                             "access": pa.array(["read"] * len(launch_ids))}), p / "truth" / "part-00000.parquet")


BAD = {
    "format": (lambda p: (p / "manifest.json").write_text(json.dumps({"format": "nsys", "version": 1})),
               "format is 'nsys'"),
    "version": (lambda p: (p / "manifest.json").write_text(json.dumps(
        {**json.loads((p / "manifest.json").read_text()), "version": 7})), "reads version 1"),
    "manifest-json": (lambda p: (p / "manifest.json").write_text("{truncated"), "not valid JSON"),
    "no-manifest": (lambda p: (p / "manifest.json").unlink(), "missing"),
    "missing-table": (lambda p: __import__("shutil").rmtree(p / "faults"), "required table 'faults'"),
    "missing-column": (lambda p: _rewrite(p, "launches", lambda t: t.drop_columns(["kernel"])),
                       "column 'kernel' is missing"),
    "wrong-type": (lambda p: _rewrite(p, "faults", lambda t: _set_col(
        t, "count", pa.array([1.5] * t.num_rows))), "column 'count' has type double"),
    "zero-bytes": (lambda p: _rewrite(p, "allocations", lambda t: _set_col(
        t, "bytes", pa.array([0, 5], pa.int64()))), "'bytes' must be > 0"),
    "negative-bytes": (lambda p: _rewrite(p, "migrations", lambda t: _set_col(
        t, "bytes", pa.array([-4096], pa.int64()))), "'bytes' must be > 0"),
    "not-dense": (lambda p: _rewrite(p, "launches", lambda t: _set_col(
        t, "launch_id", pa.array([0, 1, 2, 5], pa.int64()))), "dense"),
    "overlap": (lambda p: _rewrite(p, "allocations", lambda t: _set_col(
        t, "address", pa.array([BASE, BASE + MiB], pa.uint64()))), "overlap"),
    "unreadable-part": (lambda p: (p / "faults" / "part-00000.parquet").write_bytes(b"PAR1garbage"),
                        "unreadable Parquet part"),
    "truncated-part": (lambda p: (p / "launches" / "part-00000.parquet").write_bytes(
        (p / "launches" / "part-00000.parquet").read_bytes()[:100]), "unreadable Parquet part"),
    "bad-enum": (lambda p: _rewrite(p, "migrations", lambda t: _set_col(
        t, "direction", pa.array(["sideways"]))), "unknown values"),
    "null-required": (lambda p: _rewrite(p, "faults", lambda t: _set_col(
        t, "address", pa.array([None] * t.num_rows, pa.uint64()))), "null"),
    "param-outside": (lambda p: _rewrite(p, "launches", lambda t: _set_col(
        t, "param_sizes", pa.array([[8, 8, 400]] * t.num_rows, pa.list_(pa.int32())))), "outside param_data"),
    # version true / 1.0 are not the integer 1 (were read as version 1)
    "version-true": (lambda p: _manifest(p, version=True), "version is True"),
    "version-float": (lambda p: _manifest(p, version=1.0), "version is 1.0"),
    # a workload or device that is not an object (was an internal error, exit 1, in summary/fit/report)
    "workload-string": (lambda p: _manifest(p, workload="vadd"), "workload must be an object or null"),
    "device-string": (lambda p: _manifest(p, device="gpu"), "device must be an object or null"),
    # truth rows for launches the trace does not have (were silently dropped)
    "truth-unknown-launch": (lambda p: _add_truth(p, [0, 99]), "launch_id 99 names no launch"),
    "truth-negative-launch": (lambda p: _add_truth(p, [-1, 0]), "launch_id -1 names no launch"),
    # found by fuzzing the CLI (were internal errors, exit 1, or memory errors further on)
    "page-size-huge": (lambda p: _manifest(p, page_size=1 << 62), "page_size must be a power of two from 512"),
    "page-size-tiny": (lambda p: _manifest(p, page_size=2), "page_size must be a power of two from 512"),
    "version-long-int": (lambda p: _manifest(p, version=10 ** 4000), "version is 1000"),
    "manifest-nested": (lambda p: (p / "manifest.json").write_text("[" * 100_000 + "]" * 100_000),
                        "not valid JSON"),
    "manifest-int-too-long": (lambda p: (p / "manifest.json").write_text('{"version": ' + "9" * 5001 + "}"),
                              "not valid JSON"),
    # ranges past the end of the address space were dropped silently; a lifetime that ends before it
    # begins was accepted
    "truth-wraps": (lambda p: _add_truth(p, [0, 1], address=2**64 - 4096), "runs past the end of the address space"),
    "lifetime-backwards": (lambda p: _rewrite(p, "allocations", lambda t: _set_col(_set_col(
        t, "first_launch", pa.array([3] * t.num_rows, pa.int64())), "last_launch",
        pa.array([0] * t.num_rows, pa.int64()))), "before its first_launch"),
    # a FIFO made every command hang, a link to /dev/zero read until memory ran out
    "manifest-fifo": (lambda p: ((p / "manifest.json").unlink(), os.mkfifo(p / "manifest.json")),
                      "not a regular file"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_trace_exit_2_one_line(tmp_path, capsys, case):
    p = write_hand_trace(tmp_path / "bad.pctrace")
    damage, expect = BAD[case]
    damage(p)
    with pytest.raises(TraceError, match=expect.replace("(", r"\(")):
        T.read_trace(p)
    assert main(["summary", str(p)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert str(p) in lines[0]


def test_address_reuse_after_free_is_fine(tmp_path):
    p = write_hand_trace(tmp_path / "t.pctrace", n=4)
    # allocation 1 lives for launches 0..1, allocation 2 reuses its address from launch 2 on
    _rewrite(p, "allocations", lambda t: pa.table({
        "alloc_id": pa.array([0, 1, 2], pa.int64()), "address": pa.array([BASE, BASE + 2 * MiB, BASE + 2 * MiB], pa.uint64()),
        "bytes": pa.array([2 * MiB] * 3, pa.int64()), "kind": pa.array(["managed"] * 3),
        "device": pa.array([0] * 3, pa.int32()), "first_launch": pa.array([0, 0, 2], pa.int64()),
        "last_launch": pa.array([None, 1, None], pa.int64())}))
    assert T.read_trace(p).allocations.num_rows == 3
    _rewrite(p, "allocations", lambda t: _set_col(t, "first_launch", pa.array([0, 0, 1], pa.int64())))
    with pytest.raises(TraceError, match="allocations 1 and 2 overlap"):
        T.read_trace(p)


def test_empty_tables_without_parts(tmp_path):
    p = write_hand_trace(tmp_path / "t.pctrace")
    (p / "migrations" / "part-00000.parquet").unlink()
    t = T.read_trace(p)
    assert t.migrations.num_rows == 0 and t.migrations.schema == T.SCHEMAS[T.MIGRATIONS]


def test_not_a_directory(tmp_path, capsys):
    f = tmp_path / "x.parquet"
    f.write_text("hello")
    assert main(["summary", str(f)]) == 2
    assert "not a trace" in capsys.readouterr().err


def test_reader_ignores_temporary_parts(tmp_path):
    p = write_hand_trace(tmp_path / "t.pctrace")
    (p / "faults" / ".part-00001.parquet.tmp").write_bytes(b"half written")
    assert T.read_trace(p).faults.num_rows == 4


def test_warning_category_is_not_an_error(hand_trace):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        T.read_trace(hand_trace)  # complete traces read silently


# ---- records left on disk, read a row group at a time (read_trace(lazy=...)) ------------------

def _many_parts_trace(path, n_launches=40, n_faults=3000, part_rows=500, seed=0):
    """A trace whose faults and migrations lie in several parts, a third of the faults without a
    launch id (attributed by time)."""
    rng = np.random.default_rng(seed)
    m = T.new_manifest(workload={"name": "parts"})
    L = {T.LAUNCH_ID: np.arange(n_launches), T.KERNEL: ["k"] * n_launches, T.DEVICE: np.zeros(n_launches, np.int32),
         T.STREAM: np.zeros(n_launches), **{c: np.ones(n_launches, np.int32) for c in T.GRID_COLUMNS},
         T.SHARED_MEM_BYTES: np.zeros(n_launches, np.int32), T.START_NS: np.arange(n_launches) * 1000,
         T.END_NS: np.arange(n_launches) * 1000 + 900, T.PARAM_OFFSETS: [[]] * n_launches,
         T.PARAM_SIZES: [[]] * n_launches, T.PARAM_DATA: [b""] * n_launches}
    lid = rng.integers(0, n_launches, n_faults)
    known = rng.random(n_faults) < 0.66
    F = {T.TIME_NS: lid * 1000 + rng.integers(0, 900, n_faults),
         T.ADDRESS: (BASE + rng.integers(0, 4096, n_faults) * 4096).astype(np.uint64),
         T.COUNT: np.ones(n_faults, np.int32), T.ACCESS: rng.choice(["read", "write"], n_faults),
         T.DEVICE: np.zeros(n_faults, np.int32), T.LAUNCH_ID: pa.array(np.where(known, lid, 0), mask=~known)}
    nm = n_faults // 10
    ml = rng.integers(0, n_launches, nm)
    M = {T.START_NS: ml * 1000 + 5, T.END_NS: ml * 1000 + 50,
         T.ADDRESS: (BASE + rng.integers(0, 4096, nm) * 4096).astype(np.uint64),
         T.BYTES: rng.integers(1, 64, nm) * 4096, T.DIRECTION: ["htod"] * nm,
         T.CAUSE: rng.choice(["coherence", "prefetch", "user"], nm), T.LAUNCH_ID: ml}
    A = {T.ALLOC_ID: [0], T.ADDRESS: np.array([BASE], np.uint64), T.BYTES: [4096 * 4096], T.KIND: ["managed"],
         T.DEVICE: [0], T.FIRST_LAUNCH: [0], T.LAST_LAUNCH: [None]}
    with T.TraceWriter(path, m, part_rows=part_rows) as w:
        w.append(T.LAUNCHES, L)
        w.append(T.ALLOCATIONS, A)
        for k in range(0, n_faults, part_rows):
            w.append(T.FAULTS, {c: v[k:k + part_rows] for c, v in F.items()})
        for k in range(0, nm, 100):
            w.append(T.MIGRATIONS, {c: v[k:k + 100] for c, v in M.items()})
    return path


def test_lazy_records_read_by_row_group_match_eager(tmp_path, monkeypatch):
    import pagecast.values as V
    from pagecast import footprints as FP
    p = _many_parts_trace(tmp_path / "p.pctrace")
    assert len(list((p / T.FAULTS).glob("*.parquet"))) == 6
    eager = T.read_trace(p)
    lazy = T.read_trace(p, lazy=T.LAZY_TABLES)
    assert set(lazy.lazy) == {T.FAULTS, T.MIGRATIONS}
    pieces = list(lazy.batches(T.FAULTS, [T.ADDRESS, T.LAUNCH_ID]))
    assert len(pieces) == 6 and all(b.column_names == [T.ADDRESS, T.LAUNCH_ID] for b in pieces)
    assert pa.concat_tables(pieces).equals(eager.faults.select([T.ADDRESS, T.LAUNCH_ID]))
    assert T.FAULTS in lazy.lazy   # streaming read nothing into the trace
    # footprints and observed writes from pieces equal those from the whole table, in one piece or many
    monkeypatch.setattr(T, "BATCH_ROWS", 7)
    for prefetch in (False, True):
        a, b = FP.observed_footprints(eager, include_prefetch=prefetch), FP.observed_footprints(
            lazy, include_prefetch=prefetch)
        for x in (a, b):
            assert np.array_equal(x.indptr, a.indptr) and np.array_equal(x.start, a.start)
            assert np.array_equal(x.end, a.end)
        assert a.total_pages() > 0
    assert np.array_equal(V._observed_writes(eager), V._observed_writes(lazy))
    # the attribute still gives the whole table, read once when first asked for
    assert lazy.faults.equals(eager.faults) and T.FAULTS not in lazy.lazy
    assert lazy.migrations.equals(eager.migrations)


def test_observed_footprints_in_pieces_equal_one_piece(tmp_path, monkeypatch):
    """Merging each piece's intervals before the next is read changes nothing (peer: one piece)."""
    from pagecast import footprints as FP
    p = _many_parts_trace(tmp_path / "p.pctrace", n_faults=5000, seed=3)
    one = FP._observed(T.read_trace(p), False)            # the loaded table in one piece
    monkeypatch.setattr(T, "BATCH_ROWS", 13)
    many = FP._observed(T.read_trace(p), False)           # the same table in pieces of 13 rows
    assert np.array_equal(one.indptr, many.indptr) and np.array_equal(one.start, many.start)
    assert np.array_equal(one.end, many.end)
    # row groups cut into pieces of 5 records, and the pieces' intervals merged as they grow
    # (each merge past OBSERVED_ROWS intervals): from disk, with and without the prefetches
    monkeypatch.setattr(FP, "OBSERVED_ROWS", 5)
    merges = []
    real = FP.Footprints.from_intervals.__func__
    monkeypatch.setattr(FP.Footprints, "from_intervals",
                        classmethod(lambda cls, *a, **k: merges.append(len(a[1])) or real(cls, *a, **k)))
    for prefetch in (False, True):
        want = FP._observed(T.read_trace(p), prefetch)
        got = FP._observed(T.read_trace(p, lazy=T.LAZY_TABLES), prefetch)
        assert want.total_pages() > 0
        for f in ("indptr", "start", "end"):
            assert np.array_equal(getattr(got, f), getattr(want, f))
            if not prefetch:
                assert np.array_equal(getattr(want, f), getattr(one, f))
    assert max(merges) > 5 and len(merges) > 2 * 5000 // 5   # every piece, and merges of several pieces


def test_replacing_records_drops_what_was_made_from_them(tmp_path):
    from pagecast import footprints as FP
    p = _many_parts_trace(tmp_path / "p.pctrace")
    t = T.read_trace(p, lazy=T.LAZY_TABLES)
    before = FP.observed_footprints(t).total_pages()
    t.faults = t.faults.slice(0, 10)
    t.migrations = T.SCHEMAS[T.MIGRATIONS].empty_table()
    assert FP.observed_footprints(t).total_pages() <= 10 < before


@pytest.mark.parametrize("damage,expect", [
    (lambda p: (p / "faults" / "part-00002.parquet").write_bytes(b"PAR1garbage"), "unreadable Parquet part"),
    (lambda p: pq.write_table(pq.read_table(p / "faults" / "part-00003.parquet").set_column(
        3, "access", pa.array(["sideways"] * 500)), p / "faults" / "part-00003.parquet"), "unknown values"),
])
def test_lazy_records_are_checked_as_read(tmp_path, capsys, damage, expect):
    """A damaged part of a lazily read table is one line (TraceError) when it is read, as it is eagerly."""
    from pagecast import footprints as FP
    p = _many_parts_trace(tmp_path / "p.pctrace")
    damage(p)
    with pytest.raises(TraceError, match=expect):
        T.read_trace(p)
    t = T.read_trace(p, lazy=T.LAZY_TABLES)     # nothing read yet
    with pytest.raises(TraceError, match=expect) as e:
        list(t.batches(T.FAULTS))
    assert str(p / "faults") in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(TraceError, match=expect):
        _ = t.faults                              # the whole table, as the eager reader would
    if "unknown" not in expect:                   # (a column a reader does not read is not checked by it)
        with pytest.raises(TraceError, match=expect):
            FP.observed_footprints(T.read_trace(p, lazy=T.LAZY_TABLES))
