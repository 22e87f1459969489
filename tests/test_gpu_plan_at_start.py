"""`pagecast replay --backend gpu` with template, a model and a trace but no --plan: the replay
makes template's plan at start for each capacity (the simulator's planner, as `pagecast plan`
makes it), and oracle's from the trace's true footprints, and the child carries out their
schedules (the planned path), on the stand-in driver; --no-lookahead keeps one launch at a time,
with no plan. A plan given with --plan is carried out by template's runs alone, at the capacity it
was made for; one made for another capacity or another trace is refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pagecast import trace as T
from pagecast.replay.gpu import backend as G
from pagecast.replay.gpu import child as C
from pagecast.replay.gpu import driver as D
from pagecast.replay.unit_space import managed_bytes
from cuda_standin import FakeCuda, FakeHook, FakeMonitor
from test_gpu_lookahead_child import STREAM, TRACE, _workload


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from pagecast.predict.fit import fit_model
    from pagecast.predict.model_io import save_model

    path = tmp_path_factory.mktemp("model") / "m.json"
    save_model(fit_model([T.read_trace(TRACE)]), path)
    return path


def _replay(tmp_path, monkeypatch, capsys, model, *flags, capacity=True, trace=TRACE, errs=None):
    """The replay command end to end, each child run in-process on a fresh stand-in; -> (rows, jobs,
    the plan directories as each child saw them); `trace`: the one the replay is given (the workload
    launches TRACE's launches); `errs`: a list the command's stderr is appended to."""
    from pagecast.cli import main

    tr = T.read_trace(TRACE)
    script = _workload(tr, FakeCuda(), monkeypatch, tmp_path)
    jobs, seen = {}, {}   # policy -> its job; policy -> (its plan was there, prefetches on the launch's stream)

    def fake_child(cmd):
        job = json.loads(Path(cmd[-1]).read_text())
        policy, plan = job["request"]["policies"][0], job["request"]["plan"]
        jobs[policy] = job
        there = plan is not None and Path(plan, "manifest.json").exists()
        f = FakeCuda()
        _workload(tr, f, monkeypatch, tmp_path)   # this run's stand-in behind the workload's launches
        code = C.child_main(cmd[cmd.index(G.CHILD) + 1:], cuda=f, monitor=FakeMonitor(f), hook_factory=FakeHook)
        seen[policy] = (there, sum(1 for x in f.log if x[0] == "gpu" and x[3] == STREAM))
        return subprocess.CompletedProcess(cmd, code)

    monkeypatch.setattr(D, "open_cuda", lambda device=0: FakeCuda())
    monkeypatch.setattr(G, "_run_child", fake_child)
    cap = managed_bytes(tr) // 2
    assert main(["replay", str(trace), "--backend", "gpu", "--policy", "demand,template,oracle", "--model", str(model),
                 *(["--capacity", str(cap)] if capacity else []), "--json", *flags, "--", "python", str(script)]) == 0
    out = capsys.readouterr()
    if errs is not None:
        errs.append(out.err)
    rows = {r["policy"]: r for r in json.loads(out.out)}
    return rows, jobs, seen, cap


def test_template_and_oracle_without_a_plan_file_run_the_plans_made_at_start(tmp_path, monkeypatch, capsys, model):
    rows, jobs, seen, cap = _replay(tmp_path, monkeypatch, capsys, model)
    assert jobs["demand"]["request"]["plan"] is None and rows["demand"]["planned"] is False
    for p in ("template", "oracle"):
        plan = jobs[p]["request"]["plan"]
        # made for this capacity, there while the child ran, removed with the replay's temporary folder
        assert plan is not None and seen[p][0] and not Path(plan).exists(), p
        assert rows[p]["planned"] is True and rows[p]["ahead_launches"] > 0, p
        assert seen[p][1] == 0, p   # nothing prefetched on the launch's own stream: the copy stream's
        assert not any("capacity of" in w for w in rows[p]["warnings"]), p   # made at this run's capacity
    assert jobs["template"]["request"]["plan"] != jobs["oracle"]["request"]["plan"]


def test_no_lookahead_makes_no_plan_and_decides_one_launch_at_a_time(tmp_path, monkeypatch, capsys, model):
    rows, jobs, seen, _ = _replay(tmp_path, monkeypatch, capsys, model, "--no-lookahead")
    assert all(j["request"]["plan"] is None for j in jobs.values())
    for p in ("template", "oracle"):
        assert rows[p]["planned"] is False and rows[p]["ahead_launches"] == 0, p
        assert seen[p][1] > 0, p   # on the launch's own stream


def _plan_file(tmp_path, capsys, model, cap) -> Path:
    from pagecast.cli import main

    out = tmp_path / "given.plan"
    assert main(["plan", str(model), str(TRACE), "--capacity", str(cap), "-o", str(out)]) == 0
    capsys.readouterr()
    return out


@pytest.mark.parametrize("capacity", [True, False], ids=["at-its-capacity", "no-capacity-given"])
def test_a_plan_file_is_carried_out_by_template_alone(tmp_path, monkeypatch, capsys, model, capacity):
    """--plan: template's runs carry out that plan (its directory, kept), at the capacity it was made
    for (where none is given, the replay's: every policy emulates it); oracle makes its own at start,
    demand gets none."""
    from pagecast.replay.plan import plan_io

    cap = managed_bytes(T.read_trace(TRACE)) // 2
    given = _plan_file(tmp_path, capsys, model, cap)
    rows, jobs, seen, _ = _replay(tmp_path, monkeypatch, capsys, model, "--plan", str(given), capacity=capacity)
    assert jobs["template"]["request"]["plan"] == str(given) and seen["template"][0] and given.exists()
    assert rows["template"]["planned"] is True and seen["template"][1] == 0
    oracle = jobs["oracle"]["request"]["plan"]
    assert oracle is not None and oracle != str(given) and not Path(oracle).exists()   # made at start, removed
    assert rows["oracle"]["planned"] is True
    assert jobs["demand"]["request"]["plan"] is None and rows["demand"]["planned"] is False
    assert plan_io.read_plan(given).capacity_bytes == cap
    for p in ("demand", "template", "oracle"):
        assert rows[p]["capacity_bytes"] == cap and jobs[p]["request"]["capacity"] == [cap], p
        assert not any("capacity of" in w for w in rows[p]["warnings"]), p


def _refused(tmp_path, monkeypatch, capsys, plan, *flags) -> str:
    from pagecast.cli import main

    tr = T.read_trace(TRACE)
    script = _workload(tr, FakeCuda(), monkeypatch, tmp_path)
    ran = []
    monkeypatch.setattr(D, "open_cuda", lambda device=0: FakeCuda())
    monkeypatch.setattr(G, "_run_child", lambda cmd: ran.append(cmd))
    code = main(["replay", str(TRACE), "--backend", "gpu", "--policy", "demand,template", "--plan", str(plan),
                 *flags, "--", "python", str(script)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert not ran   # refused before any run
    return lines[0]


def test_a_plan_file_at_another_capacity_or_for_another_trace_is_refused(tmp_path, monkeypatch, capsys, model):
    from pagecast.units import format_size

    cap = managed_bytes(T.read_trace(TRACE)) // 2
    given = _plan_file(tmp_path, capsys, model, cap)
    line = _refused(tmp_path, monkeypatch, capsys, given, "--model", str(model), "--capacity", str(2 * cap))
    assert f"planned for a capacity of {format_size(cap)}" in line and f"--capacity {format_size(2 * cap)}" in line
    assert f"--capacity {cap}" in line   # what to run instead
    line = _refused(tmp_path, monkeypatch, capsys, given, "--model", str(model), "--oversub", "4")
    assert "--oversub 4 gives" in line
    # the same plan said to be another trace's: its launch fingerprint no longer matches
    man = given / "manifest.json"
    m = json.loads(man.read_text())
    m["trace"]["fingerprint"] = "0" * len(m["trace"]["fingerprint"])
    man.write_text(json.dumps(m))
    line = _refused(tmp_path, monkeypatch, capsys, given, "--model", str(model), "--capacity", str(cap))
    assert "plan was made for another trace" in line


def test_a_plan_file_needs_its_trace_and_no_feedback(tmp_path, monkeypatch, capsys, model):
    from pagecast.cli import main

    cap = managed_bytes(T.read_trace(TRACE)) // 2
    given = _plan_file(tmp_path, capsys, model, cap)
    line = _refused(tmp_path, monkeypatch, capsys, given, "--model", str(model), "--feedback")
    assert "a fixed --plan cannot be refined" in line
    assert main(["replay", "--backend", "gpu", "--policy", "template", "--model", str(model), "--plan", str(given),
                 "--", "python", "x.py"]) == 2
    assert "--plan needs the TRACE it was made for" in capsys.readouterr().err


def test_template_with_a_plan_but_no_model_says_why_the_model_is_needed(tmp_path, monkeypatch, capsys, model):
    """--plan without --model: the GPU child's runner still predicts from the model where a run leaves
    the plan (the workload's launches stop matching the plan's trace; what moved overflows the
    emulated capacity and the ledger makes room as without a plan), so the model is needed: one line
    that says why, exit 2, before any run (it was the message for a replay with no plan at all)."""
    from pagecast.errors import UsageError
    from pagecast.replay.gpu import cuda_engine as E
    from pagecast.replay.online.planned import PlannedCalls, schedule_from_plan
    from pagecast.replay.online.relocate import Relocator
    from pagecast.replay.plan import plan_io

    tr = T.read_trace(TRACE)
    cap = managed_bytes(tr) // 2
    given = _plan_file(tmp_path, capsys, model, cap)
    for flags in (["--capacity", str(cap)], []):
        line = _refused(tmp_path, monkeypatch, capsys, given, *flags)
        assert "policy template needs --model MODEL on the GPU even with --plan" in line, line
        assert "leaves the plan" in line and "the model the plan was made from" in line, line
    # what makes it so: the child's engine, given the plan's schedule, keeps the decider that predicts
    # each launch off the plan, and that decider refuses template without a predictor
    plan = plan_io.read_plan(given, tr)
    rel = Relocator(tr)
    with pytest.raises(UsageError, match="needs a model"):
        E.Engine(FakeCuda(), "template", capacity=cap, relocator=rel,
                 planned=PlannedCalls(schedule_from_plan(plan.table, plan.launches, tr, rel), rel))


def _without_argument_bytes(tmp_path, how: str) -> Path:
    """TRACE without its launches' argument bytes: an empty param_data column (collected without
    them), or the manifest's `argument_bytes: false` (as `pagecast import nsys` writes)."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path / f"{how}.pctrace"
    shutil.copytree(TRACE, out)
    if how == "empty-column":
        for part in (out / "launches").glob("*.parquet"):
            t = pq.read_table(part)
            for col, empty in ((T.PARAM_DATA, b""), (T.PARAM_OFFSETS, []), (T.PARAM_SIZES, [])):
                i = t.schema.get_field_index(col)
                t = t.set_column(i, t.schema.field(i), pa.array([empty] * t.num_rows, t.schema.field(i).type))
            pq.write_table(t, part)
    else:
        man = out / "manifest.json"
        m = json.loads(man.read_text())
        m["argument_bytes"] = False
        man.write_text(json.dumps(m))
    return out


@pytest.mark.parametrize("how", ["empty-column", "manifest"])
def test_a_trace_without_argument_bytes_warns_that_plans_are_not_made(tmp_path, monkeypatch, capsys, model, how):
    """A trace whose launches carry no argument bytes cannot be matched to the workload's launches: no
    plan is made at start (template and oracle decided one launch at a time, silently); one warning
    line says so and what to do, and the replay runs."""
    trace = _without_argument_bytes(tmp_path, how)
    assert not T.read_trace(trace).has_argument_bytes() and T.read_trace(TRACE).has_argument_bytes()
    errs: list[str] = []
    rows, jobs, _, _ = _replay(tmp_path, monkeypatch, capsys, model, trace=trace, errs=errs)
    said = [ln for ln in errs[0].splitlines() if "argument bytes" in ln]
    assert len(said) == 1, errs[0]
    assert "template decides one launch at a time" in said[0] and "oracle cannot place" in said[0], said[0]
    assert "recollect the trace" in said[0] and "pagecast collect" in said[0], said[0]
    for p in ("demand", "template", "oracle"):
        assert jobs[p]["request"]["plan"] is None and rows[p]["planned"] is False, p
    # template predicts each launch from its live arguments and moves data (a plan made at start on
    # such a trace, as before, moved nothing: its ranges could not be placed in the run)
    assert rows["template"]["prefetch_bytes"] > 0


@pytest.mark.parametrize("how", ["empty-column", "manifest"])
def test_fit_and_plan_refuse_a_trace_without_argument_bytes_in_one_line(tmp_path, capsys, model, how):
    """fit and plan need the launches' argument bytes: a trace collected without them (an empty
    param_data column, no manifest flag) is refused as the manifest's `argument_bytes: false` is, in
    one line with exit 2, not fitted or planned from nothing."""
    from pagecast.cli import main

    trace = _without_argument_bytes(tmp_path, how)
    for argv in (["fit", str(trace), "-o", str(tmp_path / "m.json")],
                 ["plan", str(model), str(trace), "--capacity", "64MiB", "-o", str(tmp_path / "p")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "needs the kernels' argument bytes" in err[0], err
