"""Host placement (replay/placement.py, `replay --placement auto`): footprints cut at host ranges
against a page-set peer, first touches, which allocations are candidates, what a run there is
charged, and that the planned policies keep it only where their own view says it is faster."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from test_replay_sim import BASE, page_trace  # noqa: E402 - the same synthetic page traces

from pagecast import footprints as F  # noqa: E402
from pagecast.errors import ProfileError  # noqa: E402
from pagecast.replay.costs import load_profile, profile_from_dict  # noqa: E402
from pagecast.replay.placement import (HostRanges, first_touches, host_candidates, host_split,  # noqa: E402
                                       split_footprints)
from pagecast.replay.sim.sweep import HostPlaced, SimConfig, replay_sim  # noqa: E402

PS = 4096
BLOCK = 512            # pages per 2 MiB block
MiB = 1 << 20


def _fp(per_launch: list[list[tuple[int, int]]]) -> F.Footprints:
    ptr = np.cumsum([0] + [len(x) for x in per_launch]).astype(np.int64)
    s = np.array([a for x in per_launch for a, _ in x], np.int64)
    e = np.array([b for x in per_launch for _, b in x], np.int64)
    return F.Footprints(ptr, s, e, PS)


def _pages(fp: F.Footprints, i: int) -> set[int]:
    return set(fp.pages(i).tolist())


@st.composite
def footprints_and_ranges(draw):
    n = draw(st.integers(1, 4))
    per = []
    for _ in range(n):
        cuts = sorted(set(draw(st.lists(st.integers(0, 60), max_size=8))))
        per.append([(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)])
    rc = sorted(set(draw(st.lists(st.integers(0, 64), max_size=6))))
    hs = np.array(rc[0::2][:len(rc) // 2], np.int64)
    he = np.array(rc[1::2][:len(rc) // 2], np.int64)
    return _fp(per), hs, he


@settings(max_examples=200, deadline=None)
@given(footprints_and_ranges())
def test_split_matches_page_sets(case):
    """Every launch's pages split exactly: those in a host range inside, the rest outside."""
    fp, hs, he = case
    out, inside = split_footprints(fp, hs, he)
    host = set().union(*[set(range(a, b)) for a, b in zip(hs.tolist(), he.tolist())]) if len(hs) else set()
    for i in range(fp.n_launches):
        p = _pages(fp, i)
        assert _pages(out, i) == p - host
        assert _pages(inside, i) == p & host
        for part in (out, inside):   # still sorted, disjoint intervals per launch
            s, e = part.of(i)
            assert (e > s).all() and (s[1:] >= e[:-1]).all()


def test_first_touches_count_each_page_once():
    fp = _fp([[(0, 3)], [(2, 5)], [(0, 5)], [(9, 10)]])
    assert first_touches(fp).tolist() == [3, 2, 0, 1]


def test_candidates_are_allocations_whose_touches_carry_less_than_their_chunks(tmp_path):
    """Allocation 0 (8 blocks): one page in each block, 10 launches = 80 pages over the run, far fewer
    bytes than its 8 chunks: a candidate. Allocation 1 (8 blocks, one touched): the same 4 pages read
    by every launch of 600: 2,400 pages, more than its one touched chunk holds: stays on the device."""
    sparse = np.arange(8) * BLOCK
    dense = 8 * BLOCK + np.arange(4)
    launches = [np.concatenate([sparse, dense]) if i < 10 else dense for i in range(600)]
    tr = page_trace(tmp_path / "t.pctrace", launches, n_allocs=2, top=16 * BLOCK)
    h = host_candidates(tr, F.footprints(tr), 2 * MiB)
    assert h.start.tolist() == [BASE] and h.end.tolist() == [BASE + 8 * 2 * MiB]
    kept, link, first = host_split(F.footprints(tr), h)
    assert link[:10].tolist() == [8 * PS] * 10 and link[10:].sum() == 0
    assert first[:2].tolist() == [8, 0]
    assert kept.pages_per_launch().tolist() == [4] * 600


def test_profile_host_bandwidth_default_and_checks():
    p = load_profile("msched-rtx5080")
    assert p.host_access_bandwidth == p.htod_bandwidth / 2
    assert replace(p, host_bandwidth=10e9).host_access_bandwidth == 10e9
    d = p.to_dict()
    d["host_bandwidth"] = -1.0
    with pytest.raises(ProfileError, match="host_bandwidth"):
        profile_from_dict(d)


def _scattered(tmp_path, n=40, turns=4):
    """A page from each of 64 blocks of a 64-block allocation (one of `turns` per block, in turn),
    launch after launch: 64 chunks for a few pages each. A capacity of 32 chunks holds half: under the
    driver's placement every launch evicts and brings back chunks."""
    return page_trace(tmp_path / "s.pctrace", [np.arange(64) * BLOCK + (i % turns) for i in range(n)],
                      top=64 * BLOCK)


def test_oracle_places_scattered_pages_on_the_host(tmp_path):
    tr = _scattered(tmp_path)
    dev, _ = replay_sim([tr], ["demand", "oracle"], capacity=[64 * MiB], config=SimConfig(), timeline=False)
    auto, _ = replay_sim([tr], ["demand", "oracle"], capacity=[64 * MiB], config=SimConfig(placement="auto"),
                         timeline=False)
    d = {r["policy"]: r for r in dev}
    a = {r["policy"]: r for r in auto}
    assert "host_bytes" not in d["oracle"]            # the default: the driver's placement, rows as before
    assert a["oracle"]["host_bytes"] == 128 * MiB
    assert a["oracle"]["time_s"] < d["oracle"]["time_s"] / 2
    assert a["oracle"]["htod_bytes"] == 0 and a["oracle"]["faults"] == 0   # nothing migrates; first touches charged
    assert a["demand"]["host_bytes"] == 0 and a["demand"]["time_s"] == d["demand"]["time_s"]


def test_a_slow_link_keeps_the_driver_placement(tmp_path):
    """Where reading over the link costs more than migrating (a 1 MB/s link), oracle keeps its run."""
    tr = _scattered(tmp_path)
    slow = replace(load_profile("msched-rtx5080"), host_bandwidth=1e6)
    auto, _ = replay_sim([tr], ["oracle"], capacity=[64 * MiB], config=SimConfig(costs=slow, placement="auto"),
                         timeline=False)
    dev, _ = replay_sim([tr], ["oracle"], capacity=[64 * MiB], config=SimConfig(costs=slow), timeline=False)
    assert auto[0]["host_bytes"] == 0 and auto[0]["time_s"] == dev[0]["time_s"]


def test_template_judges_on_its_trial_not_the_run():
    """A predicting policy keeps the host run only where its plan's trial (its predictions) is faster,
    whatever the runs themselves took; without trial times it keeps the driver's placement."""
    from pagecast.replay.sim.run import RunResult

    def run(end, trial=None):
        return RunResult("template", 1, np.zeros((1, 1)), np.zeros(1), np.array([end]), np.zeros(1), np.zeros(1),
                         {} if trial is None else {"plan_trial_s": trial})
    hp = HostPlaced(w=None, host_bytes=7)
    assert hp.better(run(1.0, 2.0), run(5.0, 1.0), "predicted").end[-1] == 5.0      # its trial said host
    assert hp.better(run(5.0, 1.0), run(1.0, 2.0), "predicted").end[-1] == 5.0      # its trial said device
    assert hp.better(run(5.0), run(1.0), "predicted").end[-1] == 5.0                 # nothing to judge on
    assert hp.better(run(5.0), run(1.0), "truth").extra["host_bytes"] == 7
    assert HostRanges.none().nbytes == 0


def test_the_command_says_what_it_left_on_the_host(tmp_path, capsys):
    from pagecast.cli import main
    tr = _scattered(tmp_path)
    assert main(["replay", str(tr.path), "--policy", "demand,oracle", "--capacity", "64MiB",
                 "--placement", "auto"]) == 0
    out = capsys.readouterr().out
    assert "oracle left 128.0 MiB on the host" in out.replace("\n", " ") or "oracle left 128 MiB on the host" in out
    assert main(["replay", str(tr.path), "--policy", "demand,oracle", "--capacity", "64MiB"]) == 0
    assert "on the host" not in capsys.readouterr().out
    assert main(["replay", "--backend", "gpu", "--policy", "demand", "--placement", "auto", "--", "true"]) == 2
    assert "--placement" in capsys.readouterr().err


def _plan(tmp_path, tr, **cfg):
    """`pagecast plan`'s plan for `tr` from a model fitted on its truth, written to tmp_path/p.plan."""
    from pagecast.predict.fit import fit_model
    from pagecast.predict.truth_obs import truth_observations
    from pagecast.replay.sim.sweep import make_plan
    plan = make_plan(fit_model([truth_observations(tr)]), tr, capacity=64 * MiB, config=SimConfig(**cfg))
    return plan.save(tmp_path / "p.plan", force=True), plan.manifest


def test_a_plan_carries_its_host_placement_and_replay_follows_it(tmp_path):
    """`pagecast plan --placement auto` writes the ranges it leaves on the host; `replay --plan` runs the
    plan with them there (host_bytes), and the same plan without them runs as before."""
    import json

    from pagecast.replay.plan import plan_io
    tr = _scattered(tmp_path, turns=1)   # the same pages every launch: the model's history predicts them
    path, manifest = _plan(tmp_path, tr, placement="auto")
    assert manifest[plan_io.HOST_RANGES] == [[BASE, BASE + 128 * MiB]]
    placed, _ = replay_sim([tr], ["demand", "template"], capacity=[64 * MiB], plan_path=str(path), timeline=False)
    by = {r["policy"]: r for r in placed}
    assert by["template"]["host_bytes"] == 128 * MiB and by["template"]["htod_bytes"] == 0
    m = json.loads((path / plan_io.MANIFEST).read_text())
    del m[plan_io.HOST_RANGES]
    (path / plan_io.MANIFEST).write_text(json.dumps(m))
    dev, _ = replay_sim([tr], ["demand", "template"], capacity=[64 * MiB], plan_path=str(path), timeline=False)
    d = {r["policy"]: r for r in dev}
    assert "host_bytes" not in d["template"] and d["template"]["time_s"] > 2 * by["template"]["time_s"]


@pytest.mark.parametrize("bad", [{}, [[1]], [[5, 5]], [[0, 1.5]], [[10, 20], [15, 30]], [[-1, 4]], [[0, 1 << 63]]])
def test_bad_host_ranges_are_one_line_plan_errors(tmp_path, bad):
    import json

    from pagecast.errors import PlanError
    from pagecast.replay.plan import plan_io
    tr = _scattered(tmp_path)
    path, _ = _plan(tmp_path, tr)
    m = json.loads((path / plan_io.MANIFEST).read_text())
    m[plan_io.HOST_RANGES] = bad
    (path / plan_io.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(PlanError, match="host_ranges") as e:
        plan_io.read_plan(path, tr)
    assert "\n" not in str(e.value)


def test_template_trials_charge_the_predicted_host_accesses_not_the_truths(tmp_path):
    """The run charges what the launches truly read on the host; the trial that decides the placement
    charges what the predictions name (here half the pages: each launch's half of its blocks)."""
    from pagecast.replay.sim.sweep import host_workload
    from pagecast.replay.unit_space import build_workload
    tr = _scattered(tmp_path, turns=1)
    truth = F.footprints(tr)
    half = _fp([[(int(s), int(e)) for s, e in zip(*truth.of(i)) if (s - truth.start[0]) // BLOCK % 2 == 0]
                for i in range(truth.n_launches)])
    prof = load_profile("msched-rtx5080")
    cfg = SimConfig(placement="auto")
    w = build_workload([tr], gran=prof.granularity, eviction_unit=prof.eviction_unit, profile=prof,
                       extra_fps=[[half]])
    hp = host_workload(w, [tr], "predicted", [(half, None)], [[half]], prof, cfg, model=None)
    run_s = hp.w.tasks[0].compute_s
    trial_s = hp.w.extra["trial_tasks"][0].compute_s
    link = prof.host_access_bandwidth
    # launch 1 on: 64 pages read on the host, 32 of them predicted (launch 0 also pays its first touches)
    assert np.allclose(run_s[1:] - trial_s[1:], 32 * PS / link)
    oracle = host_workload(w, [tr], "truth", None, [[half]], prof, cfg, model=None)
    assert "trial_tasks" not in oracle.w.extra
