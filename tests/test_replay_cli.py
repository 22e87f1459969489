"""Cost profiles, plan and results files, and the plan / replay / demo commands."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pagecast import trace as T
from pagecast.cli import main
from pagecast.errors import InputError, OutputExistsError, PlanError, ProfileError
from pagecast.replay.plan import plan_io
from pagecast.replay.costs import builtin_names, load_profile, replace, save_profile
from pagecast.replay.results_io import (RUN_SCHEMA, TIMELINE_SCHEMA, is_results, read_results, timeline_path,
                                        write_results)



def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *needles):
    assert code == 2
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# ---- cost profiles -------------------------------------------------------------------

def test_builtin_profiles():
    assert {"msched-rtx5080", "pcie4", "pcie3", "none"} <= set(builtin_names())
    m = load_profile("msched-rtx5080")
    assert m.lone_fault_s == pytest.approx(31.79e-6)   # a fault alone: one fault, one block, one batch
    assert m.htod_bandwidth == 41.7e9 and m.pipelined_bandwidth == 63.5e9 and m.duplex
    assert m.granularity == 64 << 10 and m.eviction_unit == 2 << 20 and m.faults_per_batch == 256
    # pipelined eviction + population: 1 GB each way at 63.5 GB/s combined
    assert m.bulk_time(1e9, 1e9) == pytest.approx(2e9 / 63.5e9)
    assert m.fault_time(512) == pytest.approx(512 * m.fault_time_s + 2 * (m.block_service_s + m.batch_overhead_s))
    none = load_profile("none")
    assert not none.charges and none.bulk_time(1e9, 1e9) == 0 and none.fault_time(10) == 0
    p3 = load_profile("pcie3")
    assert p3.lone_fault_s == pytest.approx(45e-6) and p3.htod_bandwidth == 12.15e9


@pytest.mark.parametrize("field,value,expect", [
    # found by fuzzing the CLI: memory errors, a numba typing error, an overflow (exit 1), and
    # profiles that ran to inf / nan times (exit 0)
    ("granularity", 2, "'granularity' must be from 512"),
    ("faults_per_batch", 2 ** 70, "'faults_per_batch' must be from 1"),
    ("fault_time_s", 10 ** 400, "'fault_time_s' must be a number, found 1000"),
    ("fault_time_s", 1e308, "'fault_time_s' must be from 0 to 1"),
    ("htod_bandwidth", 1e-300, "'htod_bandwidth' must be from 1000"),
])
def test_profile_values_beyond_any_machine_are_refused(tmp_path, field, value, expect):
    d = load_profile("msched-rtx5080").to_dict()
    d[field] = value
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=expect):
        load_profile(tmp_path / "p.json")


def test_profile_round_trip_and_refusals(tmp_path):
    p = replace(load_profile("pcie4"), name="mine", fault_time_s=20e-6)
    path = save_profile(p, tmp_path / "p.json")
    assert load_profile(path) == p
    with pytest.raises(OutputExistsError):
        save_profile(p, path)
    save_profile(p, path, force=True)
    d = json.loads(path.read_text())
    del d["htod_bandwidth"]
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="missing field 'htod_bandwidth'"):
        load_profile(tmp_path / "bad.json")
    d = json.loads(path.read_text())
    d["granularity"] = 3000
    (tmp_path / "bad2.json").write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="power of two"):
        load_profile(tmp_path / "bad2.json")
    d["version"] = 9
    (tmp_path / "bad3.json").write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="version"):
        load_profile(tmp_path / "bad3.json")
    with pytest.raises(ProfileError, match="built-in profiles: .*msched-rtx5080"):
        load_profile("no-such-profile")


# ---- results files -------------------------------------------------------------------------

def test_results_round_trip(tmp_path):
    runs = [{"policy": "demand", "backend": "sim", "capacity_bytes": 1 << 30, "oversub": 2.0, "time_s": 1.5,
             "stall_s": 1.0, "faults": 10, "htod_bytes": 5, "dtoh_bytes": 4, "speedup_vs_demand": 1.0,
             "tasks": ["a", "b"], "my_extra": 3}]
    tl = {"run": [0, 0], "policy": ["demand"] * 2, "launch_id": [0, 1], "start_s": [0.0, 1.0]}
    p = write_results(tmp_path / "r.parquet", runs, tl)
    assert is_results(p) and not is_results(tmp_path / "nothing.parquet")
    assert timeline_path(p).name == "r.timeline.parquet"
    r, t = read_results(p)
    row = r.to_pylist()[0]
    assert row["tasks"] == ["a", "b"] and row["my_extra"] == 3 and row["fraction_of_oracle"] is None
    assert t.num_rows == 2 and t.schema.field("faults").type == pa.int64()
    with pytest.raises(OutputExistsError):
        write_results(p, runs, tl)
    write_results(p, runs, None, force=True)  # no stale timeline left beside new results
    assert read_results(p)[1] is None


def _runs_and_timeline(tmp_path):
    runs = [{"policy": p, "backend": "sim", "capacity_bytes": 1 << 30, "oversub": 2.0, "time_s": t, "run": i}
            for i, (p, t) in enumerate((("demand", 2.0), ("oracle", 1.0)))]
    tl = {"run": [0, 1], "policy": ["demand", "oracle"], "task": [0, 0], "start_s": [0.0, 0.0],
          "end_s": [2.0, 1.0], "stall_s": [1.5, 0.5]}
    p = write_results(tmp_path / "r.parquet", runs, tl)
    return p, pq.read_table(p), pq.read_table(timeline_path(p))


def _with(t, name, arr):
    return t.set_column(t.schema.get_field_index(name), name, arr)


def _meta(t, **changes):
    meta = dict(t.schema.metadata)
    meta.update({k.encode(): v.encode() for k, v in changes.items()})
    return t.replace_schema_metadata(meta)


@pytest.mark.parametrize("case,needles", [
    ("version-99", ["r.parquet: results version is '99'", "reads version 1"]),
    ("version-abc", ["results version is 'abc'"]),
    ("version-missing", ["results version is missing"]),
    ("time-as-string", ["r.parquet: replay results whose column 'time_s' holds string, not numbers"]),
    ("time-inf", ["column 'time_s' holds inf; it must be finite"]),
    ("speedup-nan", ["column 'speedup_vs_demand' holds nan"]),
    ("tasks-as-string", ["column 'tasks' holds string, not lists of strings"]),
    ("capacity-beyond-int64", ["column 'capacity_bytes' does not fit int64"]),
    ("timeline-garbage", ["r.timeline.parquet: unreadable Parquet"]),
    ("timeline-version-99", ["r.timeline.parquet: timeline version is '99'"]),
    ("timeline-is-results", ["r.timeline.parquet: not the timeline of replay results", "'pagecast-results'"]),
    ("timeline-without-start", ["r.timeline.parquet: timeline without the column 'start_s'"]),
    ("timeline-all-strings", ["r.timeline.parquet: timeline whose column 'run' holds string, not integers"]),
    ("timeline-end-inf", ["column 'end_s' holds inf; it must be finite, within ±1e+12 s"]),
    ("timeline-end-huge", ["column 'end_s' holds 1e+300"]),
])
def test_read_results_refuses_malformed_files(tmp_path, case, needles):
    # each was read (a version) or left to crash the report (exit 1) before
    p, runs, tl = _runs_and_timeline(tmp_path)
    tlp = timeline_path(p)
    if case.startswith("version-"):
        v = case.split("-")[1]
        meta = dict(runs.schema.metadata)
        if v == "missing":
            del meta[b"pagecast.version"]
        else:
            meta[b"pagecast.version"] = v.encode()
        pq.write_table(runs.replace_schema_metadata(meta), p)
    elif case == "time-as-string":
        pq.write_table(_with(runs, "time_s", runs.column("time_s").cast(pa.string())), p)
    elif case == "time-inf":
        pq.write_table(_with(runs, "time_s", pa.array([1.0, float("inf")])), p)
    elif case == "speedup-nan":
        pq.write_table(_with(runs, "speedup_vs_demand", pa.array([1.0, float("nan")])), p)
    elif case == "tasks-as-string":
        pq.write_table(_with(runs, "tasks", pa.array(["a", "b"])), p)
    elif case == "capacity-beyond-int64":
        pq.write_table(_with(runs, "capacity_bytes", pa.array([2**63, 1], pa.uint64())), p)
    elif case == "timeline-garbage":
        tlp.write_bytes(bytes(range(256)) * 4)
    elif case == "timeline-version-99":
        pq.write_table(_meta(tl, **{"pagecast.version": "99"}), tlp)
    elif case == "timeline-is-results":
        tlp.write_bytes(p.read_bytes())
    elif case == "timeline-without-start":
        pq.write_table(tl.drop_columns(["start_s"]), tlp)
    elif case == "timeline-all-strings":
        pq.write_table(pa.table({n: tl.column(n).cast(pa.string()) for n in tl.column_names})
                       .replace_schema_metadata(tl.schema.metadata), tlp)
    else:
        pq.write_table(_with(tl, "end_s", pa.array([2.0, float("inf") if case.endswith("inf") else 1e300])), tlp)
    with pytest.raises(InputError) as e:
        read_results(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(tlp if case.startswith("timeline") else p) + ": ")
    for n in needles:
        assert n in msg, msg


def test_read_results_casts_compatible_columns(tmp_path):
    """Narrower integer, dictionary-encoded and all-null columns are read with the schema's types."""
    p, runs, tl = _runs_and_timeline(tmp_path)
    runs = _with(runs, "capacity_bytes", runs.column("capacity_bytes").cast(pa.int32()))
    runs = _with(runs, "time_s", pa.array([2, 1], pa.int16()))
    runs = _with(runs, "policy", runs.column("policy").dictionary_encode())
    runs = _with(runs, "stall_s", pa.nulls(2))
    pq.write_table(runs, p)
    pq.write_table(_with(tl, "start_s", pa.array([-1.0, 0.0])), timeline_path(p))
    r, t = read_results(p)
    for f in ("capacity_bytes", "time_s", "policy", "stall_s"):
        assert r.schema.field(f).type == RUN_SCHEMA.field(f).type
    assert r.column("policy").to_pylist() == ["demand", "oracle"] and r.column("time_s").to_pylist() == [2.0, 1.0]
    assert t.schema == TIMELINE_SCHEMA and t.column("start_s").to_pylist() == [-1.0, 0.0]


# ---- commands --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    from pagecast.datasets.registry import make_trace
    d = tmp_path_factory.mktemp("cli")
    out = {}
    for seed in (1, 2, 3):
        out[seed] = make_trace("jacobi2d", d / f"j{seed}.pctrace", scale=0.05, seed=seed)
    out["spmv"] = make_trace("spmv-cg", d / "s3.pctrace", scale=0.05, seed=3)
    return out


@pytest.fixture(scope="module")
def model(traces, tmp_path_factory):
    from pagecast.predict.fit import fit_model
    from pagecast.predict.model_io import save_model
    m = fit_model([T.read_trace(traces[1]), T.read_trace(traces[2])])
    return save_model(m, tmp_path_factory.mktemp("model") / "m.json")


def test_replay_json_and_results_file(traces, tmp_path, capsys):
    out = tmp_path / "r.parquet"
    code, stdout, err = run_cli(capsys, "replay", traces[3], traces["spmv"], "--policy", "demand,alloc,oracle",
                                "--oversub", "1.5,3", "--json", "-o", out, "--timeslice", "0.1")
    assert code == 0, err
    runs = json.loads(stdout)
    assert len(runs) == 6
    for r in runs:
        for k in ("policy", "backend", "capacity_bytes", "oversub", "time_s", "stall_s", "faults", "htod_bytes",
                  "dtoh_bytes", "speedup_vs_demand", "fraction_of_oracle"):
            assert k in r
        assert r["backend"] == "sim" and r["workload"] == "jacobi2d+spmv-cg"
    assert {r["oversub"] for r in runs} == {1.5, 3.0}
    assert all(r["speedup_vs_demand"] == 1.0 for r in runs if r["policy"] == "demand")
    assert "wrote replay results" in err
    r, tl = read_results(out)
    assert r.num_rows == 6 and tl.num_rows > 0
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand", "--oversub", "2", "-o", out)
    one_line_error(code, err, "exists", "--force")
    code, stdout, _ = run_cli(capsys, "replay", traces[3], "--policy", "demand", "--capacity", "1MiB")
    assert code == 0 and "demand" in stdout  # the rich table
    code, stdout, _ = run_cli(capsys, "replay", traces[3], "--policy", "demand,oracle", "--capacity", "512KiB",
                              "--json", "--costs", "none", "--eviction", "lru", "--no-driver-prefetch",
                              "--granularity", "4KiB", "--eviction-unit", "4KiB")
    runs = json.loads(stdout)
    assert code == 0 and runs[0]["granularity"] == 4096 and runs[0]["time_s"] == 0


def test_bad_input_one_line_exit_2(traces, tmp_path, capsys):
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,lfu", "--oversub", "2")
    one_line_error(code, err, "unknown policy 'lfu'", "demand, alloc, template, oracle, swap")
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand", "--capacity", "0")
    one_line_error(code, err, "capacity", "> 0")
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand", "--oversub", "0")
    one_line_error(code, err, "oversub")
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand", "--capacity", "1KiB")
    one_line_error(code, err, "migration unit")
    d = load_profile("pcie4").to_dict()
    del d["faults_per_batch"]
    (tmp_path / "p.json").write_text(json.dumps(d))
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand", "--oversub", "2", "--costs",
                           tmp_path / "p.json")
    one_line_error(code, err, "missing field 'faults_per_batch'")
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "template", "--oversub", "2")
    one_line_error(code, err, "--model")
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand")
    one_line_error(code, err, "--capacity")
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand", "--oversub", "2",
                           "--granularity", "3000")
    one_line_error(code, err, "power of two")


@pytest.mark.parametrize("cmd", ["replay", "plan"])
@pytest.mark.parametrize("flag", [("--capacity", "99999999999999999999999GiB"), ("--oversub", "1e-300")])
def test_capacity_beyond_int64_is_one_line_exit_2(traces, model, tmp_path, capsys, cmd, flag):
    # were internal errors (numba TypingError / OverflowError), exit 1
    argv = (["replay", traces[3], "--policy", "demand"] if cmd == "replay"
            else ["plan", model, traces[3], "-o", tmp_path / "p.plan"])
    code, _, err = run_cli(capsys, *argv, *flag)
    one_line_error(code, err, "more than the simulator handles")


def _hand_plan(trace_path, out):
    tr = T.read_trace(trace_path)
    table = pa.table({plan_io.LAUNCH_ID: [0], plan_io.ACTION: [plan_io.PREFETCH],
                      plan_io.ADDRESS: pa.array([int(tr.allocations.column(T.ADDRESS)[0].as_py())], pa.uint64()),
                      plan_io.BYTES: [65536], plan_io.ORDER: [0], plan_io.NEEDED_BY: [0]})
    man = plan_io.new_manifest(trace=tr, capacity_bytes=1 << 20, granularity=65536, model=None)
    return plan_io.write_plan(out, table, man)


def test_plan_for_another_trace_is_refused(traces, tmp_path, capsys):
    p = _hand_plan(traces[1], tmp_path / "a.plan")
    assert plan_io.is_plan(p)
    plan = plan_io.read_plan(p, T.read_trace(traces[1]))
    assert plan.table.num_rows == 1 and plan.capacity_bytes == 1 << 20
    with pytest.raises(PlanError, match="another trace"):
        plan_io.read_plan(p, T.read_trace(traces[3]))
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,template", "--plan", p,
                           "--capacity", "1MiB")
    one_line_error(code, err, "another trace")
    with pytest.raises(PlanError, match="not a plan"):
        plan_io.read_plan(tmp_path)
    with pytest.raises(OutputExistsError):
        _hand_plan(traces[1], tmp_path / "a.plan")


def _plan_manifest(p, **changes):
    m = json.loads((p / plan_io.MANIFEST).read_text())
    (p / plan_io.MANIFEST).write_text(json.dumps({**m, **changes}))


def _plan_table(p, fn):
    import pyarrow.parquet as pq
    pq.write_table(fn(pq.read_table(p / plan_io.TABLE)), p / plan_io.TABLE)


BAD_PLANS = {
    # each was replayed (exit 0) or an internal error (exit 1) before
    "capacity-zero": (lambda p: _plan_manifest(p, capacity_bytes=0), "'capacity_bytes' must be an integer > 0"),
    "capacity-negative": (lambda p: _plan_manifest(p, capacity_bytes=-5), "'capacity_bytes' must be an integer > 0"),
    "capacity-string": (lambda p: _plan_manifest(p, capacity_bytes="lots"), "'capacity_bytes' must be an integer"),
    "capacity-null": (lambda p: _plan_manifest(p, capacity_bytes=None), "'capacity_bytes' must be an integer"),
    "capacity-true": (lambda p: _plan_manifest(p, capacity_bytes=True), "'capacity_bytes' must be an integer"),
    "granularity-zero": (lambda p: _plan_manifest(p, granularity=0), "'granularity' must be an integer > 0"),
    "granularity-string": (lambda p: _plan_manifest(p, granularity="64k"), "'granularity' must be an integer"),
    "granularity-below-page": (lambda p: _plan_manifest(p, granularity=1024), "multiple of the page size"),
    "page-size-zero": (lambda p: _plan_manifest(p, page_size=0), "'page_size' must be an integer > 0"),
    "page-size-odd": (lambda p: _plan_manifest(p, page_size=3000), "power of two"),
    "version-true": (lambda p: _plan_manifest(p, version=True), "version is True"),
    "span-unknown": (lambda p: _plan_manifest(p, span="page"), "'span' must be one of unit, block, fitted, allocation"),
    "null-address": (lambda p: _plan_table(p, lambda t: t.set_column(
        t.column_names.index("address"), "address", pa.nulls(t.num_rows, pa.uint64()))), "null"),
    "no-table": (lambda p: (p / plan_io.TABLE).unlink(), "plan.parquet: missing"),
    # found by fuzzing the CLI: memory errors, negative repeats and index errors (exit 1)
    "bytes-huge": (lambda p: _plan_table(p, lambda t: t.set_column(
        t.column_names.index("bytes"), "bytes", pa.array([2 ** 50] * t.num_rows, pa.int64()))),
        "larger than the capacity"),
    "address-wraps": (lambda p: _plan_table(p, lambda t: t.set_column(
        t.column_names.index("address"), "address", pa.array([2 ** 64 - 4096] * t.num_rows, pa.uint64()))),
        "past the end of the address space"),
    "launches-string": (lambda p: _plan_manifest(p, trace={**json.loads((p / plan_io.MANIFEST).read_text())["trace"],
                                                             "launches": "many"}), "number of launches"),
    "granularity-huge": (lambda p: _plan_manifest(p, granularity=2 ** 70), "at most 1 GiB"),
    "page-size-huge": (lambda p: _plan_manifest(p, page_size=2 ** 40), "'page_size' must be from 512"),
    "page-size-not-the-traces": (lambda p: _plan_manifest(p, page_size=8192, granularity=65536),
                                 "page_size 8192 is not the trace's"),
}


@pytest.mark.parametrize("case", sorted(BAD_PLANS))
def test_bad_plan_one_line_exit_2(traces, tmp_path, capsys, case):
    p = _hand_plan(traces[1], tmp_path / "a.plan")
    damage, expect = BAD_PLANS[case]
    damage(p)
    with pytest.raises(PlanError, match=expect):
        plan_io.read_plan(p, T.read_trace(traces[1]))
    code, _, err = run_cli(capsys, "replay", traces[1], "--policy", "demand,template", "--plan", p,
                           "--capacity", "1MiB")
    one_line_error(code, err, expect)


def test_plan_command_and_replay_with_plan(traces, model, tmp_path, capsys):
    out = tmp_path / "j3.plan"
    code, stdout, err = run_cli(capsys, "plan", model, traces[3], "--oversub", "2", "-o", out, "--json")
    assert code == 0, err
    man = json.loads(stdout)
    tr = T.read_trace(traces[3])
    assert man["trace"]["fingerprint"] == tr.launch_fingerprint() and man["granularity"] == 65536
    assert man["span"] in plan_io.SPANS
    plan = plan_io.read_plan(out, tr)
    t = plan.table
    assert t.num_rows > 0
    acts = t.column(plan_io.ACTION).to_numpy(zero_copy_only=False)
    lid = t.column(plan_io.LAUNCH_ID).to_numpy()
    assert (np.diff(lid) >= 0).all()
    assert (t.column(plan_io.NEEDED_BY).to_numpy()[acts == "prefetch"] >= lid[acts == "prefetch"]).all()
    # merged: fewer transfers than units moved
    assert t.num_rows < man["prefetch_bytes"] // 65536 + man["evict_bytes"] // 65536 or t.num_rows <= 2
    code, _, err = run_cli(capsys, "plan", model, traces[3], "--oversub", "2", "-o", out)
    one_line_error(code, err, "exists")
    # a plan replayed at another capacity would report template's speedup for memory it was not made for
    from pagecast.units import format_size
    for other, asked in ((["--oversub", "3"], "--oversub 3 gives"),
                         (["--capacity", man["capacity_bytes"] // 2],
                          f"--capacity {format_size(man['capacity_bytes'] // 2)}")):
        code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,template", "--plan", out, *other)
        one_line_error(code, err, f"planned for a capacity of {format_size(man['capacity_bytes'])} (--oversub 2)",
                       asked, f"--capacity {man['capacity_bytes']}")
    # the plan and the same model planned on the fly replay the same
    cap = man["capacity_bytes"]
    code, s1, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,template,oracle", "--plan", out,
                            "--capacity", cap, "--json")
    assert code == 0, err
    code, s2, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,template,oracle", "--model", model,
                            "--capacity", cap, "--json")
    assert code == 0, err
    a, b = json.loads(s1), json.loads(s2)
    ta = next(r for r in a if r["policy"] == "template")
    tb = next(r for r in b if r["policy"] == "template")
    assert ta["faults"] == tb["faults"] and ta["htod_bytes"] == tb["htod_bytes"]
    assert ta["time_s"] == pytest.approx(tb["time_s"], rel=0.05)
    assert ta["speedup_vs_demand"] > 1


def test_template_with_feedback_runs(traces, model, capsys):
    code, stdout, err = run_cli(capsys, "replay", traces[3], traces["spmv"], "--policy", "demand,template",
                                "--model", model, "--oversub", "2", "--feedback", "--json")
    assert code == 0, err
    runs = json.loads(stdout)
    t = next(r for r in runs if r["policy"] == "template")
    assert t["feedback"] is True and "feedback_changes" in t


def test_gpu_backend_is_dispatched(monkeypatch, capsys, tmp_path):
    """--backend gpu hands its flags to gpu.backend.run_gpu_replay as a ReplayRequest and prints its rows."""
    import pagecast.replay.gpu.backend as G
    seen = {}

    def fake(args, planner=None):
        seen.update(vars(args), planner=planner)
        return [{"policy": "demand", "backend": "gpu", "capacity_bytes": None, "oversub": None, "time_s": 1.0,
                 "stall_s": 0.0, "faults": 0, "htod_bytes": 0, "dtoh_bytes": 0, "speedup_vs_demand": 1.0}], None
    monkeypatch.setattr(G, "run_gpu_replay", fake)
    code, stdout, err = run_cli(capsys, "replay", "--backend", "gpu", "--policy", "demand", "--repeat", "3",
                                "--json", "--", "python", "train.py", "--epochs", "1")
    assert code == 0, err
    assert json.loads(stdout)[0]["backend"] == "gpu"
    assert seen["workload"] == ("python", "train.py", "--epochs", "1") and seen["traces"] == ()
    assert seen["policies"] == ("demand",) and seen["repeat"] == 3 and seen["capacity"] is None
    assert seen["planner"] is None   # no template: no plan to make at start


def test_demo_refuses_non_empty_dir(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    for force in ([], ["--force"]):   # not "pass --force": it would not help
        code, _, err = run_cli(capsys, "demo", "-o", tmp_path / "x", *force)
        one_line_error(code, err, "not a pagecast demo")
    assert (tmp_path / "x" / "keep.txt").exists()


@pytest.mark.slow
def test_suite_pipeline_small(tmp_path):
    """The demo's pipeline (make, fit on two seeds, replay a third, alone and as a mix) on two workloads;
    in two processes, the same runs as in one."""
    from pagecast.demo import run_suite
    kw = dict(scale=0.05, costs="msched-rtx5080", policies=["demand", "template", "oracle"],
              workloads=["jacobi2d", "spmv-cg"], mixes={"sci": ["jacobi2d", "spmv-cg", "jacobi2d"]},
              oversub=(1.5, 3.0))
    runs, tl, info = run_suite(tmp_path, jobs=2, **kw)
    runs1, tl1, _ = run_suite(tmp_path, jobs=1, **kw)
    assert runs1 == runs and tl1.equals(tl)
    assert (tmp_path / "model.json").exists() and len(list((tmp_path / "traces").iterdir())) == 2 * 2 + 3
    assert len(runs) == 3 * 3 * 2 and tl.num_rows > 0
    labels = {r["workload"] for r in runs}
    assert labels == {"jacobi2d", "spmv-cg", "mix:sci"}
    mix = [r for r in runs if r["workload"] == "mix:sci"]
    assert mix[0]["tasks"] == ["jacobi2d#1", "spmv-cg", "jacobi2d#2"]
    for r in runs:
        if r["policy"] == "oracle":
            assert r["speedup_vs_demand"] > 1
        if r["policy"] == "template":
            assert r["fraction_of_oracle"] > 0.5


def test_suite_remakes_traces_kept_from_another_scale(tmp_path):
    """A --work directory kept from a run at another scale: its traces are made again, not reused.
    In this process (jobs=1: no worker processes to start; the test above runs both)."""
    from pagecast.demo import run_suite
    kw = dict(costs="none", policies=["demand"], workloads=["stream"], mixes={}, oversub=(2.0,), jobs=1)
    run_suite(tmp_path, scale=0.02, **kw)
    p = tmp_path / "traces" / "stream-s3.pctrace"
    assert T.read_trace(p).manifest["workload"]["scale"] == 0.02
    before = (p / "manifest.json").stat().st_mtime_ns
    run_suite(tmp_path, scale=0.02, **kw)
    assert (p / "manifest.json").stat().st_mtime_ns == before   # the same scale: reused
    run_suite(tmp_path, scale=0.04, **kw)
    for q in (tmp_path / "traces").iterdir():
        assert T.read_trace(q).manifest["workload"]["scale"] == 0.04, q


@pytest.mark.slow
def test_demo_command_end_to_end(tmp_path, capsys):
    """`pagecast demo` at a tiny scale: traces, model, results (+ timeline) in DIR; on stdout the
    one-screen pivot (every output line counted: at most 40), every run with --all."""
    out = tmp_path / "demo"
    code, stdout, err = run_cli(capsys, "demo", "-o", out, "--scale", "0.02")
    assert code == 0, err
    lines = stdout.splitlines()
    assert lines[0].split() == ["workload", "oversub", "demand", "time", "alloc", "template", "oracle",
                                "template/oracle"]
    # 9 workloads and 3 mixes at 3 levels, the geometric means on one line, then what the numbers are
    assert sum(ln.startswith("geometric mean (12) at 150% / 200% / 300%: ") for ln in lines) == 1
    assert lines[1 + 12 * 3].startswith("geometric mean (12)")
    caption = " ".join(" ".join(lines[1 + 12 * 3 + 1:]).split())
    assert caption.startswith("demand time: ") and "higher is better" in caption
    assert len((stdout + err).splitlines()) <= 1 + 12 * 3 + 1 + 6, stdout + err   # about a screen
    assert "pagecast export perfetto" in err and "report.html" in err
    assert (out / "model.json").exists() and (out / "results.parquet").exists()
    runs, tl = read_results(out / "results.parquet")
    assert tl is not None and tl.num_rows > 0
    labels = set(runs.column("workload").to_pylist())
    assert {"mix:scientific", "mix:multi-dnn", "mix:multi-llm"} <= labels
    assert set(runs.column("policy").to_pylist()) == {"demand", "alloc", "template", "oracle"}
    assert set(runs.column("oversub").to_pylist()) == {1.5, 2.0, 3.0}
    code, _, err = run_cli(capsys, "demo", "-o", out)
    one_line_error(code, err, "exists")
    code, stdout, err = run_cli(capsys, "demo", "-o", out, "--scale", "0.02", "--force", "--all")
    assert code == 0, err
    assert "oversubscription, geometric mean over demand" in stdout and "stall" in stdout
    assert len(stdout.splitlines()) > 12 * 3 * 4   # a line per run


def test_flags_for_another_policy_or_backend_are_named_and_ignored(traces, tmp_path, capsys):
    # --plan / --model / --feedback without template, --repeat under the simulator: were silently ignored
    # (and a missing --plan still failed the run)
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,oracle", "--oversub", "2",
                           "--plan", tmp_path / "nowhere.plan", "--model", tmp_path / "nowhere.json",
                           "--feedback", "--repeat", "3")
    assert code == 0, err
    for flag in ("--model", "--feedback"):
        assert f"{flag} is for the template policy" in err
    assert "--plan is for the policies that carry out a plan (template, runner)" in err
    assert "--repeat is for --backend gpu" in err


def test_plan_and_model_together_say_which_is_used(traces, model, tmp_path, capsys):
    plan = tmp_path / "p.plan"
    assert run_cli(capsys, "plan", model, traces[3], "--oversub", "2", "-o", plan)[0] == 0
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "template", "--oversub", "2",
                           "--plan", plan, "--model", model)
    assert code == 0, err
    assert "template follows the plan" in err


@pytest.mark.parametrize("n", ["0", "-2"])
def test_repeat_below_one_is_one_line_exit_2(traces, capsys, n):
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand", "--oversub", "2", "--repeat", n)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--repeat must be >= 1" in err


def test_results_table_names_a_plan_wider_than_units():
    from rich.console import Console

    from pagecast.replay.results_table import results_table
    base = {"workload": "w", "capacity_bytes": 1 << 20, "oversub": 2.0, "time_s": 1.0, "stall_s": 0.5, "faults": 3,
            "htod_bytes": 1, "dtoh_bytes": 0, "speedup_vs_demand": 1.0, "fraction_of_oracle": 1.0}
    rows = [{**base, "policy": "demand", "run": 0}, {**base, "policy": "alloc", "plan_span": "unit", "run": 1},
            {**base, "policy": "template", "plan_span": "block", "run": 2},
            {**base, "policy": "oracle", "plan_span": "allocation", "run": 3}]
    c = Console(width=200, record=True)
    c.print(results_table(rows))
    text = c.export_text()
    assert "template (blocks)" in text and "oracle (allocations)" in text
    assert "alloc (" not in text and "demand (" not in text
    from pagecast.replay.plan import plan_io
    from pagecast.replay.plan import spans as SP
    from pagecast.replay.commands import SPAN_CHOICES, SPAN_WORDS
    assert set(SPAN_WORDS) == set(plan_io.SPANS) == set(SP.PLAN_SPANS)
    assert SPAN_CHOICES == ("auto", *plan_io.SPANS)


@pytest.mark.parametrize("span", ["unit", "block", "allocation"])
def test_span_flag_fixes_the_span(traces, model, tmp_path, capsys, span):
    code, out, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,alloc,template,oracle", "--model", model,
                             "--oversub", "2", "--span", span, "--json")
    assert code == 0, err
    runs = {r["policy"]: r for r in json.loads(out)}
    assert runs["template"]["plan_span"] == runs["oracle"]["plan_span"] == span
    assert runs["alloc"]["plan_span"] == "unit"
    code, out, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,oracle", "--oversub", "2", "--json")
    auto = {r["policy"]: r for r in json.loads(out)}
    assert auto["oracle"]["time_s"] <= runs["oracle"]["time_s"]   # auto keeps the fastest span on the truth
    code, out, err = run_cli(capsys, "plan", model, traces[3], "--oversub", "2", "--span", span,
                             "-o", tmp_path / "p.plan", "--json")
    assert code == 0, err
    assert json.loads(out)["span"] == span


def test_span_flag_refuses_nonsense(traces, capsys):
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand", "--oversub", "2", "--span", "page")
    assert code == 2 and "--span" in err and "Traceback" not in err


def test_runner_policy_keeps_model_without_template(traces, model, capsys):
    code, out, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,runner", "--model", model,
                             "--oversub", "2", "--json")
    assert code == 0, err
    assert "ignored" not in err and [r["policy"] for r in json.loads(out)] == ["demand", "runner"]


def test_running_out_of_memory_is_one_line_exit_2(traces, capsys, monkeypatch):
    """A corrupted bytes column (2**50 in a truth row) made numpy allocate 128 GiB: exit 1 with an
    internal error before; now one line that says what to check."""
    from pagecast.replay.sim import sweep as run

    def boom(*a, **k):
        raise MemoryError("Unable to allocate 128. GiB for an array with shape (17179869184,)")
    monkeypatch.setattr(run, "replay_sim", boom)
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand", "--oversub", "2")
    one_line_error(code, err, "ran out of memory", "bytes and address columns")


def test_runner_carries_out_a_plan_given_without_template(traces, model, tmp_path, capsys):
    """`--policy runner --plan P` (no template): the runner carries out P, as it does beside template,
    and needs no --model; it was ignored (the runner planned from --model, or failed without one)."""
    plan = tmp_path / "p.plan"
    code, out, err = run_cli(capsys, "plan", model, traces[3], "--oversub", "2", "--span", "block", "-o", plan,
                             "--json")
    assert code == 0, err
    cap = json.loads(out)["capacity_bytes"]
    code, out, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,runner", "--plan", plan,
                             "--capacity", cap, "--json")
    assert code == 0, err
    assert "ignored" not in err and "--model" not in err
    alone = next(r for r in json.loads(out) if r["policy"] == "runner")
    code, out, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,template,runner", "--plan", plan,
                             "--capacity", cap, "--json")
    assert code == 0, err
    beside = {r["policy"]: r for r in json.loads(out)}
    for k in ("time_s", "faults", "htod_bytes", "dtoh_bytes"):
        assert alone[k] == beside["runner"][k], k
    assert beside["template"]["plan_span"] == "block"
    # with --model too the plan is still what the runner carries out (the model is named unused)
    code, out, err = run_cli(capsys, "replay", traces[3], "--policy", "runner", "--plan", plan, "--model", model,
                             "--capacity", cap, "--json")
    assert code == 0 and "runner follows the plan" in err, err
    assert json.loads(out)[0]["htod_bytes"] == alone["htod_bytes"]


def test_runner_refuses_a_plan_for_another_capacity_or_trace(traces, model, tmp_path, capsys):
    from pagecast.units import format_size

    plan = tmp_path / "p.plan"
    code, out, err = run_cli(capsys, "plan", model, traces[3], "--oversub", "2", "-o", plan, "--json")
    assert code == 0, err
    cap = json.loads(out)["capacity_bytes"]
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "demand,runner", "--plan", plan,
                           "--capacity", cap // 2)
    one_line_error(code, err, f"planned for a capacity of {format_size(cap)}", f"--capacity {cap}")
    code, _, err = run_cli(capsys, "replay", traces[1], "--policy", "runner", "--plan", plan, "--capacity", cap)
    one_line_error(code, err, "another trace")
    code, _, err = run_cli(capsys, "replay", traces[3], "--policy", "runner", "--capacity", cap)
    one_line_error(code, err, "policy runner needs --model MODEL or --plan PLAN")
