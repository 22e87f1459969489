"""Workload models: traces read back, driver emulation invariants, determinism, CLI."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pyarrow.compute as pc
import pytest

from pagecast import trace as T
from pagecast.cli import main
from pagecast.datasets import registry
from pagecast.datasets.engine import BIG_SHIFT, CLASSES
from pagecast.footprints import truth_footprints

SMALL = 0.05


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Every workload at a small scale, in full and natural mode (made once per test module)."""
    root = tmp_path_factory.mktemp("ds")
    out = {}
    for name in registry.WORKLOADS:
        for mode in ("full", "natural"):
            out[name, mode] = T.read_trace(registry.make_trace(name, root / f"{name}-{mode}.pctrace",
                                                               scale=SMALL, seed=3, mode=mode))
    return out


def _touched_bigpages(tr: T.Trace):
    """(launch, big page) pairs the truth touched, as one sorted int64 key array, plus the key maker."""
    lid = tr.truth.column(T.LAUNCH_ID).to_numpy()
    a = tr.truth.column(T.ADDRESS).to_numpy().astype(np.int64)
    e = a + tr.truth.column(T.BYTES).to_numpy()
    b0, b1 = a >> BIG_SHIFT, ((e - 1) >> BIG_SHIFT) + 1
    n = b1 - b0
    rep = np.repeat(np.arange(len(a)), n)
    bp = b0[rep] + np.arange(len(rep)) - np.repeat(np.cumsum(n) - n, n)
    lo = int(bp.min())

    def key(l, b):
        return np.asarray(l, np.int64) * (1 << 32) + (np.asarray(b, np.int64) - lo)
    return np.unique(key(lid[rep], bp)), key, np.unique(bp)


def _fault_launch(tr: T.Trace) -> np.ndarray:
    if tr.mode == "full":
        return tr.faults.column(T.LAUNCH_ID).to_numpy()
    from pagecast.footprints import attribute_by_time
    return attribute_by_time(tr, np.full(tr.faults.num_rows, -1), tr.faults.column(T.TIME_NS).to_numpy())


@pytest.mark.parametrize("name", sorted(registry.WORKLOADS))
def test_reads_back_with_truth(traces, name):
    for mode in ("full", "natural"):
        tr = traces[name, mode]
        assert tr.complete and tr.mode == mode and tr.truth is not None
        assert tr.manifest["source"] == "synthetic"
        assert tr.n_launches > 0 and tr.truth.num_rows > 0 and tr.faults.num_rows > 0
        fp = truth_footprints(tr)
        assert fp.total_pages() > 0
        # managed allocations are 2 MiB aligned
        assert (tr.allocations.column(T.ADDRESS).to_numpy() % (2 << 20) == 0).all()
        # timestamps: serialized launches, faults inside their launch
        s, e = tr.column(T.LAUNCHES, T.START_NS), tr.column(T.LAUNCHES, T.END_NS)
        assert (e > s).all() and (s[1:] > e[:-1]).all()


@pytest.mark.parametrize("name", sorted(registry.WORKLOADS))
def test_faults_lie_in_touched_big_pages(traces, name):
    for mode in ("full", "natural"):
        tr = traces[name, mode]
        keys, key, _ = _touched_bigpages(tr)
        fl = _fault_launch(tr)
        assert (fl >= 0).all()
        fa = tr.faults.column(T.ADDRESS).to_numpy().astype(np.int64)
        assert (fa % 4096 == 0).all()
        assert np.isin(key(fl, fa >> BIG_SHIFT), keys).all()


@pytest.mark.parametrize("name", sorted(registry.WORKLOADS))
def test_full_mode_covers_every_touched_big_page(traces, name):
    tr = traces[name, "full"]
    keys, key, _ = _touched_bigpages(tr)
    m = tr.migrations
    coh = pc.equal(m.column(T.CAUSE), "coherence").to_numpy(zero_copy_only=False)
    ma = m.column(T.ADDRESS).to_numpy().astype(np.int64)[coh]
    mb = m.column(T.BYTES).to_numpy()[coh]
    ml = m.column(T.LAUNCH_ID).to_numpy()[coh]
    n = ((ma + mb - 1) >> BIG_SHIFT) - (ma >> BIG_SHIFT) + 1
    rep = np.repeat(np.arange(len(ma)), n)
    bp = (ma >> BIG_SHIFT)[rep] + np.arange(len(rep)) - np.repeat(np.cumsum(n) - n, n)
    fa = tr.faults.column(T.ADDRESS).to_numpy().astype(np.int64)
    covered = np.union1d(key(ml[rep], bp), key(tr.faults.column(T.LAUNCH_ID).to_numpy(), fa >> BIG_SHIFT))
    assert np.isin(keys, covered).all()
    # coherence migrations cover exactly the touched big pages; only a few fault records are lost
    assert len(np.unique(key(ml[rep], bp))) == len(keys)
    assert tr.faults.num_rows >= 0.99 * len(keys)
    assert (tr.faults.column(T.COUNT).to_numpy() >= 1).all()
    # records carry their launch and lie inside it in time, in time order
    s, e = tr.column(T.LAUNCHES, T.START_NS), tr.column(T.LAUNCHES, T.END_NS)
    fl, ft = tr.faults.column(T.LAUNCH_ID).to_numpy(), tr.faults.column(T.TIME_NS).to_numpy()
    assert ((ft >= s[fl]) & (ft <= e[fl])).all() and (np.diff(ft) >= 0).all()
    ml_all = m.column(T.LAUNCH_ID).to_numpy()
    ms, me = m.column(T.START_NS).to_numpy(), m.column(T.END_NS).to_numpy()
    assert ((ms >= s[ml_all]) & (me <= e[ml_all]) & (me >= ms)).all()
    assert set(m.column(T.DIRECTION).to_pylist()) == {"htod"}


@pytest.mark.parametrize("name", sorted(registry.WORKLOADS))
def test_natural_mode_faults_once_per_big_page(traces, name):
    tr = traces[name, "natural"]
    assert tr.faults.column(T.LAUNCH_ID).null_count == tr.faults.num_rows
    assert tr.migrations.column(T.LAUNCH_ID).null_count == tr.migrations.num_rows
    # per allocation instance: key the big page by the allocation live at the fault
    fa = tr.faults.column(T.ADDRESS).to_numpy().astype(np.int64)
    fl = _fault_launch(tr)
    al = tr.allocations
    aa = al.column(T.ADDRESS).to_numpy().astype(np.int64)
    ab = al.column(T.BYTES).to_numpy()
    af = al.column(T.FIRST_LAUNCH).to_numpy()
    alast = pc.fill_null(al.column(T.LAST_LAUNCH), 1 << 62).to_numpy()
    inside = (fa[:, None] >= aa[None]) & (fa[:, None] < aa[None] + ab[None]) \
        & (fl[:, None] >= af[None]) & (fl[:, None] <= alast[None])
    assert (inside.sum(axis=1) == 1).all()
    owner = inside.argmax(axis=1)
    k = owner.astype(np.int64) * (1 << 40) + (fa >> BIG_SHIFT)
    assert len(np.unique(k)) == len(k)
    full = traces[name, "full"]
    assert tr.faults.num_rows < full.faults.num_rows


def _tables(tr):
    return {t: tr.table(t) for t in (T.LAUNCHES, T.ALLOCATIONS, T.FAULTS, T.MIGRATIONS, T.TRUTH)}


@pytest.mark.parametrize("name", sorted(registry.WORKLOADS))
def test_deterministic_and_seed_dependent(tmp_path, traces, name):
    again = T.read_trace(registry.make_trace(name, tmp_path / "a", scale=SMALL, seed=3))
    for t, tab in _tables(again).items():
        assert tab.equals(_tables(traces[name, "full"])[t]), t
    other = T.read_trace(registry.make_trace(name, tmp_path / "b", scale=SMALL, seed=4))
    assert not other.launches.column(T.PARAM_DATA).equals(again.launches.column(T.PARAM_DATA))


@pytest.mark.parametrize("name", sorted(registry.WORKLOADS))
def test_scale_changes_sizes(tmp_path, name):
    a = T.read_trace(registry.make_trace(name, tmp_path / "a", scale=0.02, seed=1))
    b = T.read_trace(registry.make_trace(name, tmp_path / "b", scale=0.2, seed=1))
    assert b.n_launches > a.n_launches
    assert pc.max(b.allocations.column(T.BYTES)).as_py() > pc.max(a.allocations.column(T.BYTES)).as_py()


def test_kernel_classes_and_names():
    every = set()
    cxxfilt = shutil.which("c++filt")
    for w in registry.WORKLOADS.values():
        kc = w.kernel_classes()
        assert kc and set(kc.values()) <= set(CLASSES)
        every |= set(kc.values())
        for k in w.kernels:
            assert k.mangled.startswith("_Z")
            if cxxfilt:
                out = subprocess.run([cxxfilt, k.mangled], capture_output=True, text=True).stdout.strip()
                assert out.split("(")[0].split()[-1].split("<")[0] == k.name, (k.mangled, out)
    if len(registry.WORKLOADS) >= 8:
        # every class but irregular among the demo's models: their data-dependent kernels (expert
        # routing, embedding rows, CSR gathers, paged KV blocks) are indexed by values the traces
        # record (pointer chasing, which nothing records, is predict/synth.py's); the validation
        # suites' XSBench and BFS models are irregular (random energies, a graph nothing records)
        demo = {c for n in registry.DEMO_WORKLOADS for c in registry.WORKLOADS[n].kernel_classes().values()}
        assert demo == set(CLASSES) - {"irregular"} and every == set(CLASSES)


def test_mangling_matches_the_abi():
    from pagecast.datasets.mangle import mangle
    assert mangle("stream_triad", ["float*", "const float*", "const float*", "float", "long"]) \
        == "_Z12stream_triadPfPKfS1_fl"
    assert mangle("rmsnorm", ["__nv_bfloat16*", "const __nv_bfloat16*", "const __nv_bfloat16*", "float"],
                  [1024]) == "_Z7rmsnormILi1024EEvP13__nv_bfloat16PKS0_S3_f"


def test_mixes_name_known_workloads():
    assert set(registry.MIXES) == {"scientific", "multi-dnn", "multi-llm"}
    for names in registry.MIXES.values():
        assert names and set(names) <= set(registry.WORKLOADS)


def test_cli_list_json(capsys):
    assert main(["datasets", "list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    from pagecast.datasets.corpus import CORPUS
    assert {d["name"] for d in doc} == set(registry.WORKLOADS) | set(CORPUS)
    for d in doc:
        assert d["category"] in ("scientific", "deep-learning", "llm", "triton") and d["description"]
        assert (d["category"] == "triton") == (d["name"] in CORPUS)


def test_cli_list_text(capsys):
    assert main(["datasets", "list"]) == 0
    out = capsys.readouterr().out
    for name in registry.WORKLOADS:
        assert name in out


def test_cli_make_and_refuse_overwrite(tmp_path, capsys):
    out = tmp_path / "s.pctrace"
    assert main(["datasets", "make", "stream", "-o", str(out), "--scale", "0.02", "--seed", "5"]) == 0
    err = capsys.readouterr().err
    assert "s.pctrace" in err and "pagecast summary" in err
    tr = T.read_trace(out)
    assert tr.manifest["workload"]["name"] == "stream" and tr.manifest["workload"]["seed"] == 5
    assert main(["datasets", "make", "stream", "-o", str(out), "--scale", "0.02"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--force" in err
    assert main(["datasets", "make", "stream", "-o", str(out), "--scale", "0.02", "--force",
                 "--mode", "natural", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "natural" and doc["launches"] == T.read_trace(out).n_launches


@pytest.mark.parametrize("argv", [
    ["datasets", "make", "no-such-workload", "-o", "X"],
    ["datasets", "make", "stream", "-o", "X", "--scale", "0"],
    ["datasets", "make", "stream", "-o", "X", "--scale", "nan"],
    ["datasets", "make", "stream", "-o", "X", "--mode", "lazy"],
    ["datasets", "make", "stream", "-o", "X", "--drop", "0.9"],
    ["datasets", "make", "stream", "-o", "X", "--drop", "-0.01"],
    ["datasets", "make", "stream", "-o", "X", "--drop", "lots"],
    ["datasets", "make", "stream", "-o", "X", "--drop", "nan"],
])
def test_cli_bad_input(tmp_path, capsys, argv):
    argv = [a if a != "X" else str(tmp_path / "x") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_unknown_name_lists_known():
    from pagecast.errors import UsageError
    with pytest.raises(UsageError, match="jacobi2d"):
        registry.make_trace("nope", "/nonexistent/x")


def test_a_kept_trace_is_reused_only_if_made_as_asked(tmp_path, monkeypatch):
    p = tmp_path / "s.pctrace"
    registry.reuse_or_make("stream", p, scale=0.02, seed=1)
    made = (p / "manifest.json").stat().st_mtime_ns
    assert json.loads((p / "manifest.json").read_text())["workload"]["revision"] == registry.REVISION
    assert registry.reuse_or_make("stream", p, scale=0.02, seed=1) == p
    assert (p / "manifest.json").stat().st_mtime_ns == made          # reused, not made again

    def remade(**kw):
        before = (p / "manifest.json").stat().st_mtime_ns
        registry.reuse_or_make("stream", p, **{"scale": 0.02, "seed": 1, **kw})
        return (p / "manifest.json").stat().st_mtime_ns != before
    assert remade(seed=2) and remade(seed=1)                          # another seed, then back
    assert remade(mode="natural") and T.read_trace(p).mode == "natural"
    assert remade()
    monkeypatch.setattr(registry, "REVISION", registry.REVISION + 1)  # the models changed since
    assert remade()
    (p / "launches").rename(tmp_path / "gone")                        # a damaged trace is made again
    assert remade() and T.read_trace(p).n_launches > 0


def test_drop_loses_fault_and_migration_records_and_counts_them(tmp_path, capsys):
    """--drop RATE: the clean trace of the same seed minus records, each record kind lost at about
    RATE independently, the count in the manifest's dropped_records (as CUPTI's collector writes it)."""
    clean = T.read_trace(registry.make_trace("jacobi2d", tmp_path / "c", scale=0.05, seed=2))
    assert main(["datasets", "make", "jacobi2d", "-o", str(tmp_path / "l"), "--scale", "0.05", "--seed", "2",
                 "--drop", "0.05"]) == 0
    lossy = T.read_trace(tmp_path / "l")
    assert clean.manifest["dropped_records"] == 0 and lossy.manifest["workload"]["drop"] == 0.05
    assert "--drop" in lossy.manifest["workload"]["argv"]
    for table in (T.FAULTS, T.MIGRATIONS):
        a, b = clean.table(table), lossy.table(table)
        # every record kept is one of the clean trace's (same times, addresses, sizes)
        key = T.TIME_NS if table == T.FAULTS else T.START_NS
        ka = set(zip(a.column(key).to_pylist(), a.column(T.ADDRESS).to_pylist()))
        kb = list(zip(b.column(key).to_pylist(), b.column(T.ADDRESS).to_pylist()))
        assert all(k in ka for k in kb)
        assert 0.03 < 1 - len(kb) / len(ka) < 0.07
    lost = clean.faults.num_rows + clean.migrations.num_rows - lossy.faults.num_rows - lossy.migrations.num_rows
    assert lossy.manifest["dropped_records"] == lost
    # the rest of the trace is the clean one
    assert lossy.launch_fingerprint() == clean.launch_fingerprint()
    assert lossy.truth.equals(clean.truth)
    # a kept trace is reused only at the same loss
    assert registry.reuse_or_make("jacobi2d", tmp_path / "l", scale=0.05, seed=2, drop=0.05) == tmp_path / "l"
    made = (tmp_path / "l" / "manifest.json").stat().st_mtime_ns
    registry.reuse_or_make("jacobi2d", tmp_path / "l", scale=0.05, seed=2, drop=0.01)
    assert (tmp_path / "l" / "manifest.json").stat().st_mtime_ns != made
