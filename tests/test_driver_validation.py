"""The driver model on hand-made traces (datasets/handmade.py) and the ARIADNE benchmark models
(datasets/polybench.py): what docs/driver-validation.md rests on, checked small and fast."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pagecast import trace as T
from pagecast.cli import main
from pagecast.datasets import registry
from pagecast.datasets.handmade import one_page_per_block, touch_trace
from pagecast.datasets.polybench import ARIADNE, SIDE
from pagecast.replay.costs import load_profile
from pagecast.replay.sim.sweep import SimConfig, replay_sim
from pagecast.uvm import VA_BLOCK

MSCHED_FAULT_S = 31.79e-6   # MSched (arXiv 2512.24637 v2), sec. 3: one GPU page fault on an RTX 5080


def _replay_json(capsys, *args) -> list[dict]:
    assert main(["replay", *args, "--backend", "sim", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_two_hundred_lone_faults_cost_mscheds_fault_each(tmp_path, capsys):
    tr = touch_trace(tmp_path / "lone.pctrace", one_page_per_block(200), name="lone")
    r = _replay_json(capsys, str(tr), "--policy", "demand", "--capacity", "1GiB", "--costs", "msched-rtx5080")[0]
    assert r["faults"] == 200
    assert r["stall_s"] / r["faults"] == pytest.approx(MSCHED_FAULT_S, rel=0.2)
    # nothing else is charged to them: the run is the kernels plus the faults
    assert r["time_s"] == pytest.approx(r["compute_s"] + r["stall_s"], rel=1e-9)


def test_lone_faults_under_the_none_profile_cost_nothing_and_count_the_same(tmp_path, capsys):
    tr = touch_trace(tmp_path / "lone.pctrace", one_page_per_block(50), name="lone")
    r = _replay_json(capsys, str(tr), "--policy", "demand", "--capacity", "1GiB", "--costs", "none")[0]
    assert r["faults"] == 50 and r["stall_s"] == 0


def test_lone_fault_cost_is_the_profiles_sum_not_a_constant(tmp_path):
    """Doubling every fault-path charge of the profile doubles the lone fault: the check can fail."""
    from pagecast.replay.costs import replace
    tr = T.read_trace(touch_trace(tmp_path / "lone.pctrace", one_page_per_block(20), name="lone"))
    p = load_profile("msched-rtx5080")
    fields = {k: 2 * getattr(p, k) for k in ("fault_time_s", "batch_overhead_s", "block_service_s") if hasattr(p, k)}
    one, _ = replay_sim([tr], ["demand"], capacity=[1 << 30], config=SimConfig(costs=p), timeline=False)
    two, _ = replay_sim([tr], ["demand"], capacity=[1 << 30], config=SimConfig(costs=replace(p, **fields)),
                        timeline=False)
    assert two[0]["stall_s"] == pytest.approx(2 * one[0]["stall_s"])
    assert two[0]["stall_s"] / 20 != pytest.approx(MSCHED_FAULT_S, rel=0.2)


def test_handmade_trace_touches_what_it_was_given(tmp_path):
    tr = T.read_trace(touch_trace(tmp_path / "t.pctrace", [np.array([0, 3 * VA_BLOCK]), np.array([VA_BLOCK])]))
    assert tr.n_launches == 2 and tr.mode == "full"
    lid = tr.truth.column(T.LAUNCH_ID).to_numpy()
    a = tr.truth.column(T.ADDRESS).to_numpy().astype(np.int64)
    base = int(tr.allocations.column(T.ADDRESS)[0].as_py())
    assert sorted(a[lid == 0] - base) == [0, 3 * VA_BLOCK] and list(a[lid == 1] - base) == [VA_BLOCK]
    with pytest.raises(ValueError):
        touch_trace(tmp_path / "bad.pctrace", [np.array([], dtype=np.int64)])
    with pytest.raises(ValueError):
        touch_trace(tmp_path / "bad.pctrace", [np.array([-4])])


def test_one_page_per_block_splits_blocks_into_launches():
    ls = one_page_per_block(10, per_launch=4)
    assert [len(x) for x in ls] == [4, 4, 2]
    assert (np.concatenate(ls) == np.arange(10) * VA_BLOCK).all()


# ---- the ARIADNE benchmark models -------------------------------------------------------

def test_ariadne_models_are_registered_but_not_in_the_demo():
    assert set(registry.SUITES["ariadne"]) == set(ARIADNE.values())
    assert set(ARIADNE.values()) <= set(registry.WORKLOADS)
    assert not set(ARIADNE.values()) & set(registry.DEMO_WORKLOADS)
    assert set(registry.DEMO_WORKLOADS) | set(ARIADNE.values()) == set(registry.WORKLOADS)


def _truth(b, kernel: str):
    """{launch id: {buffer label: bytes touched}} of one kernel's launches in a built model."""
    ids = {int(i) for bl in b.blocks if bl.kernel.name == kernel for i in bl.ids}
    out: dict[int, dict[str, int]] = {}
    for lid, aid, _addr, nb, _acc in b._truth:
        for l_, a_, n_ in zip(lid, aid, nb):
            if int(l_) in ids:
                d = out.setdefault(int(l_), {})
                d[b.buffers[a_].label] = d.get(b.buffers[a_].label, 0) + int(n_)
    return out


@pytest.mark.parametrize("name,kernels", [("pb-atax", ("atax_kernel1", "atax_kernel2")),
                                          ("pb-bicg", ("bicg_kernel1", "bicg_kernel2")),
                                          ("pb-mvt", ("mvt_kernel1", "mvt_kernel2"))])
def test_matrix_vector_kernels_each_read_the_whole_matrix(name, kernels):
    b = registry.build(name, scale=0.02, seed=4)
    mat = next(x for x in b.buffers if x.label in ("A", "a"))
    for k in kernels:
        t = _truth(b, k)
        assert len(t) >= 2                                  # a warm-up and a timed run at least
        assert all(v[mat.label] == mat.bytes for v in t.values())


def test_gemm_touches_three_square_matrices_and_counts_its_flops():
    b = registry.build("pb-gemm", scale=0.02, seed=4)
    (bl,) = [x for x in b.blocks if x.kernel.name == "gemm_kernel"]
    n = int(round(b.buffers[0].bytes ** 0.5 / 2))
    assert all(x.bytes == 4 * n * n for x in b.buffers)
    assert np.allclose(bl.flops, 2.0 * n ** 3)


def test_needleman_wunsch_walks_anti_diagonals_of_tiles():
    b = registry.build("nw", scale=0.02, seed=4)
    cols = b.buffers[0].bytes // 4
    cols = int(round(cols ** 0.5))
    t = (cols - 1) // 16
    k1 = _truth(b, "needle_cuda_shared_1")
    k2 = _truth(b, "needle_cuda_shared_2")
    runs = len(k1) // t
    assert runs >= 2 and len(k1) == runs * t and len(k2) == runs * (t - 1)
    # launch d of a run does min(d + 1, 2t - 1 - d) tiles, each 17 rows of 17 ints in each matrix
    per_tile = 17 * 17 * 4
    first = sorted(k1)[:t]
    assert [k1[i]["matrix"] // per_tile for i in first] == list(range(1, t + 1))
    last = sorted(k2)[:t - 1]
    assert [k2[i]["reference"] // per_tile for i in last] == list(range(t - 1, 0, -1))


def test_models_grow_with_scale_and_keep_their_runs():
    small, big = registry.build("pb-2dconv", scale=0.02, seed=1), registry.build("pb-2dconv", scale=1, seed=1)
    assert big.buffers[0].bytes > small.buffers[0].bytes
    assert big.cursor == 11 and small.cursor == 2
    assert big.buffers[0].bytes <= 4 * (1.2 * SIDE) ** 2 + 4 * 256 * SIDE
