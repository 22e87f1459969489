"""scripts/gpu_validation.py: its plan of commands and its report, on the CPU (no GPU runs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_validation.py"


@pytest.fixture(scope="module")
def V():
    spec = importlib.util.spec_from_file_location("gpu_validation", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_plan_collects_fits_replays_on_gpu_and_simulates_with_the_calibrated_profile(V, tmp_path):
    steps = V.plan("mlp-train", tmp_path, fit_scales=[0.5], replay_scale=2.0, oversub=[1.5, 2, 3],
                   policies=["demand", "template"], repeat=3, profile=tmp_path / "p.json")
    names = [s for s, _ in steps]
    assert names == ["collect (fit scale 0.5)", "fit", "collect (replay scale)", "truth", "no runner",
                     "replay gpu 100%", "replay gpu 150%", "replay gpu 200%", "replay gpu 300%", "replay sim"]
    assert steps[4][1][1:] == ["-m", "pagecast.datasets.gpu.mlp_train", "--scale", "2.0"]   # no runner at all
    # the replay-scale run records the workload's own footprints, which become the trace's truth
    coll, truth = dict(steps)["collect (replay scale)"], dict(steps)["truth"]
    assert coll[0] == "env" and coll[1].startswith("PAGECAST_FOOTPRINTS=")
    assert truth[truth.index("-o") + 1] == dict(steps)["replay gpu 200%"][4]
    base = dict(steps)["replay gpu 100%"]
    assert base[base.index("--policy") + 1] == "demand" and base[base.index("--oversub") + 1] == "1"
    assert all("--allow-oversubscription" not in c for _, c in steps)
    cmds = {s: c for s, c in steps}
    assert cmds["collect (fit scale 0.5)"][-5:] == ["python", "-m", "pagecast.datasets.gpu.mlp_train", "--scale", "0.5"]
    gpu = cmds["replay gpu 200%"]
    assert "--backend" in gpu and gpu[gpu.index("--backend") + 1] == "gpu"
    assert gpu[gpu.index("--oversub") + 1] == "2" and gpu[gpu.index("--repeat") + 1] == "3"
    assert gpu[gpu.index("--") + 1:] == ["python", "-m", "pagecast.datasets.gpu.mlp_train", "--scale", "2.0"]
    sim = cmds["replay sim"]
    assert sim[sim.index("--costs") + 1] == str(tmp_path / "p.json") and "--" not in sim
    assert sim[sim.index("--oversub") + 1] == "1,1.5,2,3"
    assert sim[sim.index("--span") + 1] == "unit"   # the runner prefetches the predicted ranges themselves
    assert sim[sim.index("--policy") + 1] == "demand,template,runner"   # and its own decisions, replayed
    # the simulator replays the very trace whose footprint sizes the GPU runs' --oversub
    assert gpu[gpu.index("replay") + 1] == sim[sim.index("replay") + 1]
    assert sim[sim.index("replay") + 1].endswith("-replay-truth.pctrace")


def test_plan_fits_on_every_fit_scale(V, tmp_path):
    steps = dict(V.plan("jacobi2d", tmp_path, fit_scales=[0.25, 0.5], replay_scale=1, oversub=[2],
                        policies=["demand"], repeat=1, profile=tmp_path / "p.json"))
    fit = steps["fit"]
    assert sum(a.endswith(".pctrace") for a in fit) == 2


def _rows(backend, times):
    out = []
    for ov, pol_times in times.items():
        d = pol_times["demand"]
        o = pol_times.get("oracle")
        for p, t in pol_times.items():
            out.append({"policy": p, "backend": backend, "oversub": ov, "time_s": t, "faults": 10,
                        "predict_us_mean": 12.0 if p == "template" else None,
                        "speedup_vs_demand": d / t, "fraction_of_oracle": (o / t) if o else None})
    return out


def test_report_checks_the_bars_and_the_simulator(V):
    gpu = _rows("gpu", {1.5: {"demand": 10.0, "template": 2.0, "oracle": 1.8},
                        3.0: {"demand": 10.0, "template": 5.0, "oracle": 2.0}})
    sim = _rows("sim", {1.5: {"demand": 11.0, "template": 2.1, "oracle": 1.9},
                        3.0: {"demand": 20.0, "template": 5.0, "oracle": 2.0}})
    rows = V.compare(gpu, sim)
    assert [(r["oversub"], r["policy"]) for r in rows][:3] == [(1.5, "demand"), (1.5, "template"), (1.5, "oracle")]
    b = {x["oversub"]: x for x in V.bars(rows)}
    assert b[1.5]["speedup_ok"] and b[1.5]["oracle_ok"]
    assert not b[3.0]["speedup_ok"] and not b[3.0]["oracle_ok"]
    md = V.render({"jacobi2d": {"rows": rows, "errors": []}, "llm-decode": {"rows": [], "errors": [("fit", "exit 2")]}},
                  device="NVIDIA H200", date="2026-11-29", settings={"fit_scale": 0.5, "replay_scale": 1, "repeat": 1},
                  profile={"fault_time_us": 30.0, "htod_GBps": 50, "dtoh_GBps": 50, "duplex": True,
                           "pipelined_GBps": 90})
    assert "NVIDIA H200" in md and "2026-11-29" in md and "### jacobi2d" in md
    assert "5.00x faster than demand (bar 3x: met)" in md and "NOT met" in md
    assert "| 0.50 ⚠ |" in md            # demand at 300%: simulated 2x the measured time (GPU / sim = 0.5)
    assert "12.0 us per launch on average (budget 20 us: met)" in md
    assert "**fit failed**: exit 2" in md and "some bars not met" in md


def test_gpu_template_is_compared_with_the_simulated_runner(V):
    """Where the simulator replayed the runner's own decisions, the GPU's template is set against
    them (the difference is then the cost model), the planned template's speedup beside."""
    gpu = _rows("gpu", {2.0: {"demand": 10.0, "template": 4.0, "oracle": 2.0}})
    sim = _rows("sim", {2.0: {"demand": 10.0, "template": 2.0, "runner": 4.4, "oracle": 2.0}})
    rows = V.compare(gpu, sim)
    t = next(r for r in rows if r["policy"] == "template")
    assert t["sim_policy"] == "runner" and t["sim_time_s"] == 4.4 and t["sim_planned_speedup"] == 5.0
    assert abs(t["sim_error"] - 0.1) < 1e-12
    md = V.render({"jacobi2d": {"rows": rows, "errors": []}}, device="d", date="x",
                  settings={"fit_scale": 0.5, "replay_scale": 1, "repeat": 1}, profile=None)
    assert "replay the runner's own decisions" in md and "reaches 5.00x at 200%" in md


def test_dry_run_prints_every_command_and_a_synthetic_report(V, capsys, tmp_path):
    assert V.main([str(tmp_path / "out.md"), "--workdir", str(tmp_path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # per workload: two fit scales, the fit, the replay-scale trace, its truth, no runner, 100%, 200%, the simulation
    assert len(lines) == 1 + 4 * 9            # llm-decode, spmv-cg, jacobi2d, moe-decode
    assert "calibrate" in lines[0]
    assert sum("--backend gpu" in line for line in lines) == 8
    assert sum("--repeat 5" in line for line in lines) == 8
    md = (tmp_path / "out.md").read_text()
    assert "| GPU / sim |" in md and "excess over capacity (MiB)" in md and "no runner at all" in md


@pytest.mark.parametrize("name", ["llm-decode", "spmv-cg", "jacobi2d", "mlp-train", "moe-decode"])
def test_the_replay_scale_reaches_a_gib_of_managed_memory(V, name):
    s = V.replay_scale_for(name)
    assert V.planned_bytes(name, s) >= 2**30 > V.planned_bytes(name, s * 0.9)


def test_real_differences_need_ranges_that_do_not_overlap(V):
    gpu = [{"policy": "demand", "oversub": 2.0, "time_s": 2.0, "time_s_min": 1.9, "time_s_max": 2.1, "repeats": 5},
           {"policy": "template", "oversub": 2.0, "time_s": 1.0, "time_s_min": 0.9, "time_s_max": 1.1, "repeats": 5},
           {"policy": "oracle", "oversub": 2.0, "time_s": 1.95, "time_s_min": 1.5, "time_s_max": 2.0, "repeats": 5}]
    rows = {r["policy"]: r for r in V.compare(gpu, [])}
    assert rows["template"]["real"] is True and rows["oracle"]["real"] is False and rows["demand"]["real"] is None


def test_the_workloads_own_time_line_is_read(V):
    out = 'x: 3 launches\nPAGECAST_WORKLOAD {"time_s": 0.25, "launches": 3}\n'
    assert V.workload_time(out) == 0.25 and V.workload_time("nothing") is None


def test_a_run_out_of_budget_still_writes_a_report(V, tmp_path, monkeypatch):
    """Every step fails fast here (no GPU, or a stand-in); the report names each failure or skip."""
    calls = []

    def fake_step(cmd, timeout, log):
        calls.append(cmd)
        return False, "", "exit status 2 (see the log)"

    monkeypatch.setattr(V, "run_step", fake_step)
    out = tmp_path / "val.md"
    assert V.main([str(out), "--workdir", str(tmp_path / "w"), "--workloads", "jacobi2d", "--budget-s", "100",
                   "--replay-scale", "1"]) == 1
    md = out.read_text()
    assert "Calibration failed" in md and "collect (fit scale 0.125) failed" in md
    assert "Partial" not in md and len(calls) == 2      # calibrate, then the first collect: nothing else can run
    assert V.main([str(out), "--workdir", str(tmp_path / "w"), "--workloads", "jacobi2d", "--budget-s", "0",
                   "--replay-scale", "1"]) == 1
    assert "out of time" in out.read_text()


def test_without_the_truth_the_runs_use_the_collected_trace(V, tmp_path, monkeypatch):
    calls = []

    def fake_step(cmd, timeout, log):
        calls.append(cmd)
        if "calibrate" in cmd or "pagecast.datasets.gpu.truth" in cmd:
            return False, "", "exit status 2 (see the log)"
        return True, "[]", ""

    monkeypatch.setattr(V, "run_step", fake_step)
    out = tmp_path / "val.md"
    V.main([str(out), "--workdir", str(tmp_path / "w"), "--workloads", "jacobi2d", "--replay-scale", "1",
            "--no-baselines"])
    gpu = next(c for c in calls if "--backend" in c and "gpu" in c)
    assert gpu[4].endswith("jacobi2d-replay.pctrace")
    assert "lower estimate" in out.read_text() or "No GPU measurements" in out.read_text()


def test_where_the_simulator_is_off_the_report_names_the_term(V):
    gpu = [{"policy": "demand", "oversub": 2.0, "time_s": 2.0, "faults": 12000, "htod_bytes": 100, "dtoh_bytes": 0,
            "repeats": 5}]
    sim = [{"policy": "demand", "oversub": 2.0, "time_s": 1.0, "compute_s": 0.2, "stall_s": 0.8, "faults": 3000,
            "htod_bytes": 100, "dtoh_bytes": 0}]
    md = V.render({"w": {"rows": V.compare(gpu, sim), "errors": []}}, device="d", date="x", profile=None,
                  settings={"fit_scale": 1, "replay_scale": 1, "repeat": 5})
    assert "demand at 200%: simulated 80% stall; furthest apart: faults 12,000 on the GPU, 3,000 simulated" in md
