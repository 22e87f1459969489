"""benchmarks/results.py keeps oracle a bound on every table it writes: oracle's row is widened
(RunPool) by every run of the same trace and capacity the document reports, whichever replay
made it, and check_bound stops the script where a printed policy is faster than oracle."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pagecast.demo import OVERSUB

_spec = importlib.util.spec_from_file_location(
    "pagecast_bench_results_bound", Path(__file__).resolve().parents[1] / "benchmarks" / "results.py")
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)

DEMAND_S = 2.0
CAP = 1 << 26


def _run(policy, time_s, o, workload="w", **extra):
    return {"workload": workload, "oversub": o, "policy": policy, "time_s": time_s, "capacity_bytes": CAP,
            "speedup_vs_demand": DEMAND_S / time_s, "lower_bound_s": 0.01, **extra}


def _pooled():
    """A pooled replay of one workload: oracle's own plan at 0.10 s, template at 0.11 s."""
    out = []
    for o in OVERSUB:
        out += [_run("demand", DEMAND_S, o), _run("template", 0.11, o),
                _run("oracle", 0.10, o, oracle_plan="own", oracle_own_s=0.10)]
    return out


def _fits(one_s):
    """Per-workload fits' runs (fit_mode_runs' keys): one profile's template at `one_s`."""
    fm = {}
    for mode, t in (("one profile", one_s), ("two profiles", 0.105)):
        for o in OVERSUB:
            fm[mode, "w", o, "demand"] = _run("demand", DEMAND_S, o)
            fm[mode, "w", o, "template"] = _run("template", t, o, plan_span="fitted")
    return fm


def test_a_fit_faster_than_the_pooled_oracle_becomes_oracles_run():
    pooled, fm = _pooled(), _fits(0.099)
    widened = R.fit_mode_pool(pooled, fm).widen(pooled)
    orc = [r for r in widened if r["policy"] == "oracle"]
    assert all(r["time_s"] == 0.099 and r["oracle_plan"] == "template (one profile)" for r in orc)
    assert all(r["oracle_own_s"] == 0.10 and r["plan_span"] == "fitted" for r in orc)
    text = R.fit_mode_section(fm, widened)
    # one profile's template is oracle's run: 100% of it, not 101% as against the pooled replay's oracle
    row = next(line for line in text.splitlines() if line.startswith("| w | 150%"))
    assert "20.20x (100%)" in row and "template (one profile)'s run" in row and "(101%)" not in row


def test_the_old_table_fails_the_check():
    """The per-workload table against the pooled replay's oracle alone (before RunPool): the fit's
    template is faster than the oracle printed beside it, and the script stops naming the cell."""
    with pytest.raises(SystemExit, match=r"per-workload fits' table.*w at 150%: template, one profile"):
        R.fit_mode_section(_fits(0.099), _pooled())


def test_no_fit_faster_leaves_oracles_own_row():
    pooled = _pooled()
    widened = R.fit_mode_pool(pooled, _fits(0.12)).widen(pooled)
    assert [r for r in widened if r["policy"] == "oracle"] == [r for r in pooled if r["policy"] == "oracle"]


def test_check_bound_names_every_faster_cell_and_counts_rows():
    R.BOUND_CHECKED.clear()
    assert R.check_bound("t", [("a", 2.0, {"x": 2.0, "y": None}), ("b", 3.0, {"x": 1.0})]) == 2
    assert R.BOUND_CHECKED == {"t": 2}
    with pytest.raises(SystemExit, match=r"t2: oracle is not a bound on 2 cell\(s\): a: x .*; b: y"):
        R.check_bound("t2", [("a", 2.0, {"x": 2.1}), ("b", 3.0, {"y": 3.5, "z": 2.9})])
    with pytest.raises(SystemExit, match="no oracle beside x"):
        R.check_bound("t3", [("a", None, {"x": 1.0})])


def test_runs_of_another_replay_are_refused():
    """A run of the same label but another capacity or demand time is not of oracle's replay."""
    pool = R.RunPool().add([_run("oracle", 0.1, 1.5), _run("demand", DEMAND_S, 1.5)])
    pool.add([dict(_run("template", 0.05, 1.5), speedup_vs_demand=3.0 / 0.05)], "template (elsewhere)")
    with pytest.raises(SystemExit, match="not of the same replay"):
        pool.oracle("w", 1.5)


def test_a_schedule_joins_the_family_with_its_time_only():
    pool = R.RunPool().add([_run("oracle", 0.1, 1.5, htod_bytes=5, faults=2), _run("demand", DEMAND_S, 1.5)])
    pool.add_schedule("w", 1.5, "the router-read bound", 0.08)
    r = pool.oracle("w", 1.5)
    assert r["time_s"] == 0.08 and r["speedup_vs_demand"] == pytest.approx(25.0)
    assert r["oracle_plan"] == "the router-read bound" and r["htod_bytes"] is None and r["faults"] is None


def test_rows_won_by_another_replays_run_are_explained():
    """A runner run faster than every member of the pooled replay becomes oracle's row, and the
    misses section names it with oracle's own plans' speedup; template's own replay is not listed."""
    pooled = _pooled()
    pool = R.RunPool().add(pooled)
    pool.add([_run("demand", DEMAND_S, 1.5), _run("runner", 0.08, 1.5)], label="w")
    widened = pool.widen(pooled)
    orc = {r["oversub"]: r for r in widened if r["policy"] == "oracle"}
    assert orc[1.5]["oracle_plan"] == "runner" and orc[1.5]["speedup_vs_demand"] == pytest.approx(25.0)
    assert orc[2.0]["oracle_plan"] == "own"
    text = R.elsewhere(widened)
    assert "w at 150%: runner's run, 25.00x against 20.00x for oracle's own best plan" in text
    assert "200%" not in text
    assert R.elsewhere(pooled) == ""
