"""`pagecast replay --backend gpu` with template, a model and a trace but no --plan: the replay
makes template's plan at start for each capacity (the simulator's planner, as `pagecast plan`
makes it), and oracle's from the trace's true footprints, and the child carries out their
schedules (the planned path), on the stand-in driver; --no-lookahead keeps one launch at a time,
with no plan."""

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


def _replay(tmp_path, monkeypatch, capsys, model, *flags):
    """The replay command end to end, each child run in-process on a fresh stand-in; -> (rows, jobs,
    the plan directories as each child saw them)."""
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
    assert main(["replay", str(TRACE), "--backend", "gpu", "--policy", "demand,template,oracle", "--model", str(model),
                 "--capacity", str(cap), "--json", *flags, "--", "python", str(script)]) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
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
