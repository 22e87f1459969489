"""`pagecast import nsys`: SQLite and Parquet-directory exports built to NVIDIA's schema (tests/nsys_fixture.py)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagecast import trace as T
from pagecast.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from nsys_fixture import A_ADDR, A_SIZE, B_ADDR, B_SIZE, make_export  # noqa: E402


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *needles):
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture(params=["sqlite", "parquetdir"])
def imported(request, tmp_path, capsys):
    kind = request.param
    src = tmp_path / ("run.sqlite" if kind == "sqlite" else "run_pqtdir")
    counts = make_export(src, kind=kind)
    out = tmp_path / "run.pctrace"
    code, stdout, err = run_cli(capsys, "import", "nsys", src, "-o", out, "--json")
    assert code == 0, err
    return out, counts, json.loads(stdout), kind


def test_import_counts_equal_the_export(imported, capsys):
    out, counts, doc, kind = imported
    for k in ("launches", "fault_records", "faults", "migrations", "allocations"):
        assert doc[k] == counts[k], k
    assert doc["allocations_inferred"] is False and doc["schema_version"] == "3.24.14"
    code, stdout, err = run_cli(capsys, "summary", out, "--json")
    assert code == 0, err
    s = json.loads(stdout)
    assert s["source"] == "nsys" and s["mode"] == "natural"
    assert s["launches"] == counts["launches"] and s["fault_records"] == counts["fault_records"]
    assert s["faults"] == counts["faults"] and s["migrations"] == counts["migrations"]
    assert s["allocations"] == counts["allocations"]
    assert {k: v for k, v in s["migrated_bytes_by_cause"].items() if v} == counts["migrated_bytes_by_cause"]
    assert sorted(k["kernel"] for k in s["top_kernels"]) == counts["kernel_names"]   # mangled names
    assert s["footprint_bytes"] > 0


def test_imported_trace_reads_as_the_format_says(imported):
    out, counts, _, _ = imported
    tr = T.read_trace(out)
    m = tr.manifest
    assert m["argument_bytes"] is False and m["allocations_inferred"] is False
    assert m["nsys"]["schema_version"] == "3.24.14" and m["device"]["name"] == "NVIDIA H200"
    L = tr.launches
    assert L.column(T.PARAM_DATA).to_pylist() == [b""] * tr.n_launches
    st_ = L.column(T.START_NS).to_numpy()
    assert (np.diff(st_) > 0).all()                                   # correlation-id order = issue order
    assert set(L.column(T.STREAM).to_pylist()) == {7, 13}
    assert L.column(T.GRID_X).to_pylist() == [64 + i for i in range(tr.n_launches)]
    assert tr.faults.column(T.LAUNCH_ID).null_count == tr.faults.num_rows   # attributed by time
    assert (tr.faults.column(T.ADDRESS).to_numpy() % 4096 == 0).all()
    A = tr.allocations.to_pylist()
    assert sorted(a["kind"] for a in A) == ["device", "host", "managed", "managed"]   # pageable left out
    b = next(a for a in A if a["address"] == B_ADDR)
    assert b["free_ns"] is not None and b["last_launch"] == tr.n_launches - 1
    assert next(a for a in A if a["address"] == A_ADDR)["last_launch"] is None
    assert all(a["first_launch"] == 0 for a in A)      # all made before the first kernel was launched


def test_query_and_report_work_on_an_imported_trace(imported, tmp_path, capsys):
    out, counts, _, _ = imported
    code, stdout, err = run_cli(capsys, "query", out, "SELECT count(*) AS n FROM faults WHERE launch_id IS NULL",
                                "--json")
    assert code == 0, err
    assert json.loads(stdout) == [{"n": counts["fault_records"]}]
    code, _, err = run_cli(capsys, "report", out, "-o", tmp_path / "r.html")
    assert code == 0, err
    assert (tmp_path / "r.html").stat().st_size > 1000


def test_replay_runs_and_fit_refuses(imported, tmp_path, capsys):
    out, _, _, _ = imported
    code, stdout, err = run_cli(capsys, "replay", out, "--policy", "demand,oracle,swap", "--oversub", "1.5,2",
                                "--json")
    assert code == 0, err
    runs = json.loads(stdout)
    assert {r["policy"] for r in runs} == {"demand", "oracle", "swap"} and len(runs) == 6
    assert all(r["speedup_vs_demand"] >= 1.0 for r in runs if r["policy"] == "oracle")
    assert all(r["faults"] > 0 for r in runs if r["policy"] == "demand")
    code, _, err = run_cli(capsys, "fit", out, "-o", tmp_path / "m.json")
    one_line_error(code, err, "argument bytes", "pagecast collect")
    assert not (tmp_path / "m.json").exists()
    # template with a model (of no kernel: this trace cannot be fitted) still needs the pointer
    # arguments to place its predictions; without one, the missing model is said first
    from pagecast.predict.model_io import Model, save_model
    model = save_model(Model(), tmp_path / "empty.json")
    for pol, extra in (("alloc", ()), ("template", ("--model", str(model)))):
        code, _, err = run_cli(capsys, "replay", out, "--policy", f"demand,{pol}", "--oversub", "2", *extra)
        one_line_error(code, err, f"policy {pol}", "pagecast collect")
    code, _, err = run_cli(capsys, "replay", out, "--policy", "demand,template", "--oversub", "2")
    one_line_error(code, err, "policy template", "--model")


def test_allocations_are_inferred_without_memory_usage_events(tmp_path, capsys):
    src = tmp_path / "run.sqlite"
    make_export(src, omit=("CUDA_GPU_MEMORY_USAGE_EVENTS",))
    out = tmp_path / "t.pctrace"
    code, _, err = run_cli(capsys, "import", "nsys", src, "-o", out)
    assert code == 0, err
    assert "inferred" in err and "--cuda-memory-usage=true" in err
    tr = T.read_trace(out)
    assert tr.manifest["allocations_inferred"] is True
    A = tr.allocations
    lo = A.column(T.ADDRESS).to_numpy().astype(np.uint64)
    hi = lo + A.column(T.BYTES).to_numpy().astype(np.uint64)
    assert set(A.column(T.KIND).to_pylist()) == {"managed"}
    assert (lo[1:] >= hi[:-1]).all()                           # sorted, disjoint
    # every fault page and migrated range lies inside one inferred allocation
    pts = np.concatenate([tr.faults.column(T.ADDRESS).to_numpy(), tr.migrations.column(T.ADDRESS).to_numpy()])
    k = np.searchsorted(lo, pts, side="right") - 1
    assert (k >= 0).all() and (pts < hi[k]).all()
    # the 2 MiB gap between the two managed allocations keeps them apart, and nothing is outside them
    assert lo.min() >= A_ADDR and hi.max() <= B_ADDR + B_SIZE
    assert not ((lo < B_ADDR) & (hi > A_ADDR + A_SIZE)).any()


def test_bad_exports_are_one_line_errors(tmp_path, capsys):
    out = tmp_path / "t.pctrace"
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 10)
    one_line_error(*run_cli(capsys, "import", "nsys", junk, "-o", out)[::2], "not an SQLite database")
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    one_line_error(*run_cli(capsys, "import", "nsys", other, "-o", out)[::2], "not an Nsight Systems export")
    v4 = tmp_path / "v4.sqlite"
    make_export(v4, schema_version="4.0.1")
    one_line_error(*run_cli(capsys, "import", "nsys", v4, "-o", out)[::2], "schema version '4.0.1'", "3.x")
    no_um = tmp_path / "noum.sqlite"
    make_export(no_um, omit=("CUDA_UM_GPU_PAGE_FAULT_EVENTS",))
    one_line_error(*run_cli(capsys, "import", "nsys", no_um, "-o", out)[::2], "--cuda-um-gpu-page-faults=true")
    no_um_pq = tmp_path / "noum_pqtdir"
    make_export(no_um_pq, kind="parquetdir", omit=("CUDA_UM_GPU_PAGE_FAULT_EVENTS",))
    one_line_error(*run_cli(capsys, "import", "nsys", no_um_pq, "-o", out)[::2], "--cuda-um-gpu-page-faults=true")
    good = tmp_path / "good.sqlite"
    make_export(good, n_kernels=200)
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    one_line_error(*run_cli(capsys, "import", "nsys", cut, "-o", out)[::2], str(cut))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    one_line_error(*run_cli(capsys, "import", "nsys", empty_dir, "-o", out)[::2], "not an Nsight Systems Parquet")
    one_line_error(*run_cli(capsys, "import", "nsys", tmp_path / "missing.sqlite", "-o", out)[::2], "no such file")
    one_line_error(*run_cli(capsys, "import", "vtune", good, "-o", out)[::2], "invalid choice")
    assert not out.exists()
    code, _, err = run_cli(capsys, "import", "nsys", good, "-o", out)
    assert code == 0, err
    one_line_error(*run_cli(capsys, "import", "nsys", good, "-o", out)[::2], "--force")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), seed=st.integers(0, 2**16), kind=st.sampled_from(["sqlite", "parquetdir"]))
def test_counts_hold_for_any_export(tmp_path_factory, n, seed, kind):
    from pagecast.collect.nsys_import import NsysImportConfig, import_nsys
    d = tmp_path_factory.mktemp("h")
    src = d / ("e.sqlite" if kind == "sqlite" else "e_pqtdir")
    counts = make_export(src, kind=kind, n_kernels=n, seed=seed)
    res = import_nsys(NsysImportConfig(report=src, output=d / "t.pctrace"))
    for k in ("launches", "fault_records", "faults", "migrations", "allocations"):
        assert res.counts[k] == counts[k], k
    tr = T.read_trace(res.path)
    from pagecast.footprints import observed_footprints
    fp = observed_footprints(tr)
    assert (fp.pages_per_launch() > 0).all()        # every kernel faulted: each has a footprint


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_export_is_imported_or_refused_in_one_line(tmp_path_factory, data):
    """Bytes changed anywhere in a good SQLite export: exit 0 with a valid trace, or exit 2 with one line."""
    import contextlib
    import io
    d = tmp_path_factory.mktemp("f")
    src = d / "e.sqlite"
    make_export(src, n_kernels=6)
    raw = bytearray(src.read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(100, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    src.write_bytes(bytes(raw))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["import", "nsys", str(src), "-o", str(d / "t.pctrace")])
    assert code in (0, 2), err.getvalue()
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
    else:
        T.read_trace(d / "t.pctrace")
