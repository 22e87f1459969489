"""Workload models against their kernels' semantics: parameter layouts, pointers, templates."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from pagecast import trace as T
from pagecast.datasets import registry
from pagecast.datasets.engine import Kernel


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {n: T.read_trace(registry.make_trace(n, root / n, scale=0.05, seed=11)) for n in registry.WORKLOADS}


def _kernel(name: str, kname: str) -> Kernel:
    return next(k for k in registry.WORKLOADS[name].kernels if k.name == kname)


def _args(tr: T.Trace, k: Kernel) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Launch ids of kernel k and its decoded arguments (by parameter or struct.field name)."""
    sel = pc.equal(tr.launches.column(T.KERNEL), k.mangled)
    t = tr.launches.filter(sel)
    ids = t.column(T.LAUNCH_ID).to_numpy()
    raw = b"".join(t.column(T.PARAM_DATA).to_pylist())
    mat = np.frombuffer(raw, np.uint8).reshape(len(ids), k.param_bytes)
    out = {key: np.ascontiguousarray(mat[:, off:off + size]).view(dt).reshape(-1)
           for key, dt, off, size in k.fields}
    # param_offsets / sizes describe the layout
    assert t.column(T.PARAM_OFFSETS)[0].as_py() == k.offsets
    assert t.column(T.PARAM_SIZES)[0].as_py() == k.sizes
    return ids, out


def _truth_rows(tr: T.Trace, ids: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """Truth rows of launches `ids` whose address lies in [lo[i], hi[i]) of their launch i."""
    lid = tr.truth.column(T.LAUNCH_ID).to_numpy()
    addr = tr.truth.column(T.ADDRESS).to_numpy().astype(np.int64)
    nb = tr.truth.column(T.BYTES).to_numpy()
    pos = np.searchsorted(ids, lid)
    ok = (pos < len(ids)) & (ids[np.minimum(pos, len(ids) - 1)] == lid)
    i = np.where(ok, pos, 0)
    ok &= (addr >= lo[i]) & (addr < hi[i])
    return lid[ok], addr[ok], nb[ok], pos[ok]


def test_layouts_follow_natural_alignment():
    k = _kernel("stream", "stream_triad")
    assert k.mangled == "_Z12stream_triadPfPKfS1_fl"
    assert k.offsets == [0, 8, 16, 24, 32] and k.sizes == [8, 8, 8, 4, 8]
    conv = _kernel("cnn-infer", "conv2d_implicit_gemm")
    assert conv.sizes == [40, 40, 40, 8, 32] and conv.offsets == [0, 40, 80, 120, 128]


@pytest.mark.parametrize("name", sorted(registry.WORKLOADS))
def test_pointer_arguments_land_in_live_allocations(small, name):
    tr = small[name]
    al = tr.allocations
    aa = al.column(T.ADDRESS).to_numpy().astype(np.int64)
    ae = aa + al.column(T.BYTES).to_numpy()
    af = al.column(T.FIRST_LAUNCH).to_numpy()
    alast = pc.fill_null(al.column(T.LAST_LAUNCH), 1 << 62).to_numpy()
    seen = 0
    for k in registry.WORKLOADS[name].kernels:
        if not pc.any(pc.equal(tr.launches.column(T.KERNEL), k.mangled)).as_py():
            continue
        ids, args = _args(tr, k)
        for key in k.classes:
            p = args[key].astype(np.int64)
            inside = (p[:, None] >= aa[None]) & (p[:, None] < ae[None]) \
                & (ids[:, None] >= af[None]) & (ids[:, None] <= alast[None])
            assert inside.any(axis=1).all(), (k.name, key)
            seen += 1
    assert seen > 0
    # and every truth range lies inside an allocation live at its launch
    lid = tr.truth.column(T.LAUNCH_ID).to_numpy()
    ta = tr.truth.column(T.ADDRESS).to_numpy().astype(np.int64)
    te = ta + tr.truth.column(T.BYTES).to_numpy()
    order = np.argsort(aa)
    j = np.searchsorted(aa[order], ta, side="right") - 1
    # allocations reusing an address: check each candidate with the same address too
    ok = np.zeros(len(ta), bool)
    for shift in range(0, 8):
        jj = np.clip(j - shift, 0, len(aa) - 1)
        a = order[jj]
        ok |= (ta >= aa[a]) & (te <= ae[a]) & (lid >= af[a]) & (lid <= alast[a])
    assert ok.all()


def test_jacobi_reads_a_halo_row_before_its_pointer(small):
    tr = small["jacobi2d"]
    ids, a = _args(tr, _kernel("jacobi2d", "jacobi2d_sweep"))
    nx, ny = a["nx"].astype(np.int64), a["ny"].astype(np.int64)
    src = a["in"].astype(np.int64)
    lid, addr, nb, i = _truth_rows(tr, ids, src - 4 * nx, src + 4 * nx * (ny + 1))
    assert len(lid) == len(ids)
    assert (addr == src[i] - 4 * nx[i]).all() and (nb == 4 * nx[i] * (ny[i] + 2)).all()
    assert len(np.unique(nx)) >= 3            # several multigrid levels: sizes vary in the trace
    assert np.allclose(a["omega"], 0.8)       # a float parameter that looks like one


def test_attention_reads_per_head_strided_slices_growing_with_pos(small):
    tr = small["llm-decode"]
    ids, a = _args(tr, _kernel("llm-decode", "attention_decode"))
    pos, ms, hk, hd = (a[k].astype(np.int64) for k in ("pos", "max_seq", "n_kv_heads", "head_dim"))
    kp = a["k_cache"].astype(np.int64)
    lid, addr, nb, i = _truth_rows(tr, ids, kp, kp + hk * ms * hd * 2)
    assert len(lid) == hk.sum()
    assert (nb == (pos[i] + 1) * hd[i] * 2).all()
    assert (((addr - kp[i]) % (ms[i] * hd[i] * 2)) == 0).all()
    assert len(np.unique(pos)) >= 10
    # the weights' pointers are not at the start of their allocation
    ids_g, g = _args(tr, _kernel("llm-decode", "gemv_bf16"))
    w0 = tr.allocations.column(T.ADDRESS).to_numpy()
    assert (~np.isin(g["W"], w0)).mean() > 0.9


def test_grid_following_and_allocation_footprints(small):
    tr = small["stream"]
    ids, a = _args(tr, _kernel("stream", "stream_init"))
    gx = tr.launches.column(T.GRID_X).to_numpy()[ids].astype(np.int64)
    bx = tr.launches.column(T.BLOCK_X).to_numpy()[ids].astype(np.int64)
    p = a["a"].astype(np.int64)
    lid, addr, nb, i = _truth_rows(tr, ids, p, p + 1)
    assert len(lid) == len(ids) and (nb == gx[i] * bx[i] * 4).all()
    assert len(np.unique(gx)) > 1
    tr = small["mlp-train"]
    ids, a = _args(tr, _kernel("mlp-train", "sgd_momentum"))
    al = tr.allocations
    aa = al.column(T.ADDRESS).to_numpy().astype(np.int64)
    asz = al.column(T.BYTES).to_numpy()
    for key in ("params", "grads", "momentum"):
        p = a[key].astype(np.int64)
        assert np.isin(p, aa).all()                 # at the start of their allocations
        size = asz[np.searchsorted(aa, p)]
        assert len(np.unique(size)) == 2            # two parameter groups: no fixed size fits
        lid, addr, nb, i = _truth_rows(tr, ids, p, p + 1)
        assert len(lid) == len(ids) and (addr == p[i]).all() and (nb == size[i]).all()
    assert np.allclose(a["lr"], 1e-3) and np.allclose(a["mu"], 0.9)


def test_struct_descriptors_and_channel_slices(small):
    tr = small["cnn-infer"]
    ids, a = _args(tr, _kernel("cnn-infer", "conv2d_implicit_gemm"))
    n, c, h, w, ns = (a[f"y.{f}"].astype(np.int64) for f in ("n", "c", "h", "w", "nstride"))
    yp = a["y.data"].astype(np.int64)
    sliced = ns > c * h * w
    assert sliced.any() and (~sliced).any()
    lid, addr, nb, i = _truth_rows(tr, ids, yp, yp + 4 * ((n - 1) * ns + c * h * w))
    assert np.array_equal(np.bincount(i, minlength=len(ids)), n)
    assert (nb == 4 * c[i] * h[i] * w[i]).all()
    assert (((addr - yp[i]) % (4 * ns[i])) == 0).all()


def test_moe_experts_follow_the_router(small):
    tr = small["moe-decode"]
    ids, a = _args(tr, _kernel("moe-decode", "moe_expert_ffn"))
    e = a["experts"].astype(np.int64)
    al = tr.allocations
    aa = al.column(T.ADDRESS).to_numpy().astype(np.int64)
    ae = aa + al.column(T.BYTES).to_numpy()
    end = ae[np.searchsorted(aa, e, side="right") - 1]   # the end of the experts allocation
    assert (end > e).all()
    lid, addr, nb, i = _truth_rows(tr, ids, e, end)
    assert np.array_equal(np.bincount(i, minlength=len(ids)), a["k"])
    # different tokens pick different experts
    assert len(np.unique(addr - e[i])) > 2


def test_prefill_temporaries_are_freed_and_reused(small):
    tr = small["llm-prefill-decode"]
    al = tr.allocations
    addr = al.column(T.ADDRESS).to_numpy()
    last = al.column(T.LAST_LAUNCH)
    assert last.null_count < al.num_rows
    assert len(np.unique(addr)) < len(addr)   # an address handed out again after a free


def test_driver_prefetch_switch(tmp_path):
    on = T.read_trace(registry.make_trace("llm-decode", tmp_path / "on", scale=0.03, seed=2))
    off = T.read_trace(registry.make_trace("llm-decode", tmp_path / "off", scale=0.03, seed=2,
                                           driver_prefetch=False))
    causes_on = set(on.migrations.column(T.CAUSE).to_pylist())
    causes_off = set(off.migrations.column(T.CAUSE).to_pylist())
    assert "prefetch" in causes_on and causes_off == {"coherence"}
    assert on.manifest["driver_prefetch"] is True and off.manifest["driver_prefetch"] is False
    assert off.faults.num_rows > 0


def test_roofline_times(small):
    tr = small["mlp-train"]
    dur = (tr.column(T.LAUNCHES, T.END_NS) - tr.column(T.LAUNCHES, T.START_NS)) / 1e9
    moved = np.bincount(tr.truth.column(T.LAUNCH_ID).to_numpy(), weights=tr.truth.column(T.BYTES).to_numpy(),
                        minlength=tr.n_launches)
    assert (dur >= moved / 4.8e12).all()
    assert (dur < moved / 4.8e12 + 1e-3).mean() > 0.5


def _tiny(tmp_path, mode, prefetch):
    """One 2 MiB allocation (32 big pages); launches touch big pages [0,10), [5,20), [25,32), [0,17)."""
    from pagecast.datasets.engine import BIG_PAGE, Builder, Range
    k = Kernel("touch", [("p", "float*"), ("n", "long")], {"p": "linear"})
    b = Builder("tiny", seed=1)
    buf = b.malloc(2 << 20, "buf")
    spans = [(0, 10), (5, 20), (25, 32), (0, 17)]
    for lo, hi in spans:
        b.launch(k, b.reserve(1), {"p": buf.ptr(lo * BIG_PAGE), "n": (hi - lo) * BIG_PAGE // 4}, grid=(1,),
                 touches=[Range(buf, lo * BIG_PAGE, (hi - lo) * BIG_PAGE)])
    b.write(tmp_path / f"{mode}{prefetch}", mode=mode, driver_prefetch=prefetch)
    tr = T.read_trace(tmp_path / f"{mode}{prefetch}")
    base = buf.address >> 16
    fb = (tr.faults.column(T.ADDRESS).to_numpy().astype(np.int64) >> 16) - base
    fl = pc.fill_null(tr.faults.column(T.LAUNCH_ID), -1).to_numpy()
    m = tr.migrations
    mig = [(c, int(a >> 16) - base, int(n) // BIG_PAGE) for c, a, n in zip(
        m.column(T.CAUSE).to_pylist(), m.column(T.ADDRESS).to_numpy(), m.column(T.BYTES).to_numpy())]
    return tr, fb, fl, mig


def test_driver_emulation_by_hand(tmp_path):
    # full mode: every launch faults on all its big pages (up to the ~0.1% lost records);
    # launches 0 (10/32), 1 (15/32) and 2 (7/32) stay under 51%, launch 3 (17/32 > 16.3) tips the block
    tr, fb, fl, mig = _tiny(tmp_path, "full", True)
    assert len(fb) >= 48 and len(fb) <= 10 + 15 + 7 + 17
    assert ("prefetch", 17, 15) in mig and sum(c == "prefetch" for c, _, _ in mig) == 1
    assert ("coherence", 0, 10) in mig and ("coherence", 5, 15) in mig and ("coherence", 0, 17) in mig
    tr, fb, fl, mig = _tiny(tmp_path, "full", False)
    assert all(c == "coherence" for c, _, _ in mig)
    # natural mode: first touches only; launch 1 takes residency to 20/32 > 51%: big pages 20..31 are
    # prefetched, so launch 2 (25..31) and launch 3 (0..16, all resident) never fault
    tr, fb, fl, mig = _tiny(tmp_path, "natural", True)
    assert (fl == -1).all()
    assert set(fb.tolist()) <= set(range(20)) and len(fb) >= 19 and len(np.unique(fb)) == len(fb)
    assert sorted(mig) == [("coherence", 0, 10), ("coherence", 10, 10), ("prefetch", 20, 12)]
    t_f = tr.faults.column(T.TIME_NS).to_numpy()
    s, e = tr.column(T.LAUNCHES, T.START_NS), tr.column(T.LAUNCHES, T.END_NS)
    assert ((t_f >= s[0]) & (t_f <= e[1])).all()
    # without the prefetcher, launch 2's big pages fault at their first touch
    tr, fb, fl, mig = _tiny(tmp_path, "natural", False)
    assert set(fb.tolist()) <= set(range(20)) | set(range(25, 32)) and len(fb) >= 26
    assert sorted(mig) == [("coherence", 0, 10), ("coherence", 10, 10), ("coherence", 25, 7)]


_CXXFILT = __import__("shutil").which("c++filt")
_BASES = ["float", "double", "int", "unsigned int", "long", "unsigned long", "char", "bool",
          "__nv_bfloat16", "TensorDesc", "ConvParams"]


@pytest.mark.skipif(_CXXFILT is None, reason="c++filt (binutils) is not installed")
def test_mangling_round_trips_through_cxxfilt():
    import subprocess

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from pagecast.datasets.mangle import mangle

    def spell(base, stars, const, east):
        """(C spelling, c++filt's spelling) of a parameter type."""
        if stars == 0:
            return base, base
        ptrs = "*" * stars
        if not const:
            return base + ptrs, base + ptrs
        return ((base + " const" if east else "const " + base) + ptrs, base + " const" + ptrs)

    ctype = st.builds(spell, st.sampled_from(_BASES), st.integers(0, 2), st.booleans(), st.booleans())

    @settings(max_examples=80, deadline=None)
    @given(st.lists(ctype, min_size=1, max_size=7),
           st.one_of(st.none(), st.lists(st.integers(-5, 4096), min_size=1, max_size=2)))
    def check(params, tmpl):
        name = mangle("kern", [c for c, _ in params], tmpl)
        out = subprocess.run([_CXXFILT, name], capture_output=True, text=True).stdout.strip()
        targs = "" if tmpl is None else "<" + ", ".join(str(v) for v in tmpl) + ">"
        prefix = "void " if tmpl is not None else ""
        assert out == f"{prefix}kern{targs}({', '.join(w for _, w in params)})", (params, name, out)

    check()
