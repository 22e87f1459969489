"""llm-paged-decode: block tables within the pool, blocks freed and reused, truth that follows the
values the trace records, and the producer of those values."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from pagecast import trace as T
from pagecast import values as V
from pagecast.datasets import paged, registry

NAME = "llm-paged-decode"


@pytest.fixture(scope="module")
def tr(tmp_path_factory):
    return T.read_trace(registry.make_trace(NAME, tmp_path_factory.mktemp("paged") / "t", scale=0.3, seed=4))


def _launches(t: T.Trace, k) -> tuple[np.ndarray, dict]:
    sel = t.launches.filter(pc.equal(t.launches.column(T.KERNEL), k.mangled))
    ids = sel.column(T.LAUNCH_ID).to_numpy()
    raw = b"".join(sel.column(T.PARAM_DATA).to_pylist())
    mat = np.frombuffer(raw, np.uint8).reshape(len(ids), k.param_bytes)
    return ids, {key: np.ascontiguousarray(mat[:, o:o + s]).view(dt).reshape(-1) for key, dt, o, s in k.fields}


def _values(t: T.Trace, ids: np.ndarray, ptr: np.ndarray, count: np.ndarray) -> list[np.ndarray]:
    im = V.image(t)
    rows = im.find(ids, ptr)
    assert (rows >= 0).all()
    out = [im.ints(int(r), int(c)) for r, c in zip(rows, count)]
    assert [len(v) for v in out] == count.tolist()      # recorded exactly: count values a launch
    return out


def _merged(lo: np.ndarray, hi: np.ndarray) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(zip(lo.tolist(), hi.tolist())):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [tuple(x) for x in out]


def _truth(t: T.Trace, lid: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """The bytes launch lid's truth covers inside [lo, hi), as merged [start, end) intervals."""
    tt = t.truth
    sel = (tt.column(T.LAUNCH_ID).to_numpy() == lid)
    a = tt.column(T.ADDRESS).to_numpy().astype(np.int64)[sel]
    n = tt.column(T.BYTES).to_numpy()[sel]
    k = (a >= lo) & (a < hi)
    return _merged(a[k], a[k] + n[k])


def _chunks(base: int, size: int, v: np.ndarray) -> list[tuple[int, int]]:
    return _merged(base + size * v, base + size * (v + 1))


def _pool(t: T.Trace, at: int) -> tuple[int, int]:
    """(address, bytes) of the allocation holding address `at` (the KV block pool)."""
    al = t.allocations
    addr = al.column(T.ADDRESS).to_numpy().astype(np.int64)
    nb = al.column(T.BYTES).to_numpy()
    i = int(np.flatnonzero((addr <= at) & (at < addr + nb))[0])
    return int(addr[i]), int(nb[i])


def test_block_tables_lie_in_the_pool_and_never_share_a_block(tr):
    ids, a = _launches(tr, paged.K_PAGED_ATTN)
    base, size = _pool(tr, int(a["k_cache"].min()))
    blk = paged.BLOCK_TOKENS * a["n_kv_heads"][0] * a["head_dim"][0] * 2
    layers = len(np.unique(a["k_cache"]))
    n_pool = size // (2 * layers * blk)
    for v in _values(tr, ids, a["block_ids"], a["n_blocks"]):
        assert len(v) and v.min() >= 0 and v.max() < n_pool
        assert len(np.unique(v)) == len(v)             # a block belongs to one sequence at a time
    assert len(np.unique(a["n_seqs"])) > 1             # sequences start and finish at different steps


def test_attention_reads_the_blocks_of_its_tables_and_the_cache_writes_follow_the_slots(tr):
    ids, a = _launches(tr, paged.K_PAGED_ATTN)
    blk = int(paged.BLOCK_TOKENS * a["n_kv_heads"][0] * a["head_dim"][0] * 2)
    vals = _values(tr, ids, a["block_ids"], a["n_blocks"])
    for j in range(0, len(ids), 7):
        k0, v0 = int(a["k_cache"][j]), int(a["v_cache"][j])
        assert _truth(tr, ids[j], k0, v0) == _chunks(k0, blk, vals[j])
        assert _truth(tr, ids[j], v0, v0 + (v0 - k0)) == _chunks(v0, blk, vals[j])
    cids, c = _launches(tr, paged.K_RESHAPE_CACHE)
    slots = _values(tr, cids, c["slot_mapping"], c["n_tokens"])
    per = int(c["n_kv_heads"][0] * c["head_dim"][0] * 2)
    for j in range(0, len(cids), 5):
        k0, v0 = int(c["k_cache"][j]), int(c["v_cache"][j])
        assert _truth(tr, cids[j], k0, v0) == _chunks(k0, per, slots[j])
        assert _truth(tr, cids[j], v0, v0 + (v0 - k0)) == _chunks(v0, per, slots[j])
        # each token's slot lies in a block of its step's tables (the step's attention follows)
        step_blocks = vals[int(np.searchsorted(ids, cids[j]))]
        assert np.isin(slots[j] // paged.BLOCK_TOKENS, step_blocks).all()


def test_blocks_are_freed_and_reused(tr):
    ids, a = _launches(tr, paged.K_PAGED_ATTN)
    layer0 = a["k_cache"] == a["k_cache"].min()
    tables = _values(tr, ids[layer0], a["block_ids"][layer0], a["n_blocks"][layer0])
    live = [set(v.tolist()) for v in tables]
    # a block that leaves the live set (its sequence finished or was preempted) and comes back
    # later, written again by a new token of some sequence
    back = [b for t in range(1, len(live) - 1) for b in live[t - 1] - live[t]
            if any(b in s for s in live[t + 1:])]
    assert back


def test_the_copy_kernel_writes_the_values_the_step_reads(tr):
    ids, a = _launches(tr, paged.K_PAGED_ATTN)
    cids, _ = _launches(tr, paged.K_COPY_INPUTS)
    im = V.image(tr)
    rows = im.find(ids, a["block_ids"])
    prod = V.producers(tr, ids, rows)
    # the producer is this step's copy: the latest copy launch before the attention
    want = cids[np.searchsorted(cids, ids) - 1]
    assert np.array_equal(prod, want)


def test_same_seed_same_run_and_scale_grows_it():
    a, b = registry.build(NAME, scale=0.05, seed=3), registry.build(NAME, scale=0.05, seed=3)
    assert a.paged_stats == b.paged_stats
    assert [r for _, _, _, r in a._values] == [r for _, _, _, r in b._values]
    c = registry.build(NAME, scale=0.5, seed=3)
    assert c.cursor > a.cursor and c.paged_stats["steps"] > a.paged_stats["steps"]


def test_scheduler_keeps_the_pool_whole_under_pressure():
    """A small pool: sequences are preempted, and at every step each block is free or held by
    exactly one running sequence, and every token's slot lies in its own sequence's blocks."""
    n = 40
    sch = paged.Scheduler(np.random.default_rng(5), n, 100, 60, 1000)
    for _ in range(300):
        st = sch.step()
        held = [b for s in sch.running for b in s.blocks]
        assert sorted(held + sch.free) == list(range(n))
        assert len(st.block_ids) == st.indptr[-1] and len(st.tokens) == st.query_start[-1]
        for i in range(len(st.seq_lens)):
            table = st.block_ids[st.indptr[i]:st.indptr[i + 1]]
            assert len(table) == -(-st.seq_lens[i] // paged.BLOCK_TOKENS)
            sl = st.slots[st.query_start[i]:st.query_start[i + 1]]
            assert np.isin(sl // paged.BLOCK_TOKENS, table).all()
    assert sch.preempted > 0 and sch.finished > 0 and sch.admitted > 0


def test_natural_mode_trace(tmp_path):
    t = T.read_trace(registry.make_trace(NAME, tmp_path / "n", scale=0.05, seed=2, mode="natural"))
    assert t.mode == "natural" and t.values is not None and t.values.num_rows > 0
