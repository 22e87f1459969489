"""`pagecast collect --interpret` end to end: exact truth against an independent peer, the
parameter buffer, allocations, the driver emulation, bad input, crashes, and fit --from truth."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"   # before any @triton.jit (the corpus kernels below)

import numpy as np
import pyarrow as pa
import pytest
import torch

from pagecast import trace as T
from pagecast.cli import main as cli_main
from pagecast.collect.interpret import InterpretConfig, collect_interpreted
from pagecast.collect.target import Workload
from pagecast.datasets.emulate import FullModeEmulation
from pagecast.footprints import observed_footprints, truth_footprints

PAGE = 4096
VADD = textwrap.dedent("""
    import sys, torch, triton, triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)

    for n in [int(a) for a in sys.argv[1:]] or [1000, 5000, 70000]:
        x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
        add_kernel[(triton.cdiv(n, 512),)](x, y, out, n, BLOCK=512)
        assert torch.allclose(out, x + y)
""")


def _read(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", T.TraceWarning)
        return T.read_trace(path)


def _script(tmp_path, body: str, name: str = "work.py") -> Path:
    p = tmp_path / name
    p.write_text(body)
    return p


def _collect(args, cwd, timeout=240):
    return subprocess.run([sys.executable, "-m", "pagecast.cli", "collect", "--interpret", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


# ---- exact truth against a peer -------------------------------------------------------------

class _Peer:
    """Records every byte every load, store and atomic touches, one layer below the hooks (the
    interpreter's C++ memory functions), in Python sets: slow and obviously right."""

    def __init__(self):
        self.bytes: dict[str, set] = {"read": set(), "write": set()}

    def install(self):
        from triton.runtime import interpreter as I
        orig = I._interpreter
        peer = self

        class Proxy:
            def __getattr__(self, name):
                return getattr(orig, name)

            def load(self, ptrs, mask, other, dtype):
                peer._add("read", ptrs, mask, np.dtype(dtype).itemsize)
                return orig.load(ptrs, mask, other, dtype)

            def store(self, ptrs, value, mask):
                peer._add("write", ptrs, mask, value.dtype.itemsize)
                return orig.store(ptrs, value, mask)

            def atomic_rmw(self, op, ptrs, val, mask, sem):
                peer._add("read", ptrs, mask, val.dtype.itemsize)
                peer._add("write", ptrs, mask, val.dtype.itemsize)
                return orig.atomic_rmw(op, ptrs, val, mask, sem)

            def atomic_cas(self, ptrs, cmp, val, sem):
                peer._add("read", ptrs, None, val.dtype.itemsize)
                peer._add("write", ptrs, None, val.dtype.itemsize)
                return orig.atomic_cas(ptrs, cmp, val, sem)

        I._interpreter = Proxy()
        return lambda: setattr(I, "_interpreter", orig)

    def _add(self, kind, ptrs, mask, es):
        a = ptrs.reshape(-1) if mask is None else ptrs[np.broadcast_to(mask, ptrs.shape)]
        for x in a.tolist():
            self.bytes[kind].update(range(x, x + es))


def test_truth_is_exact_against_a_peer(tmp_path):
    """Tutorial kernels with masks, loops, dots, atomics and locks: the pages of the truth are the
    pages of the bytes the peer saw, translated with the pointer values in the parameter buffer."""
    from pagecast.datasets.corpus import gather_kernels as G
    from pagecast.datasets.corpus import tutorial_kernels as K
    keep = []

    def workload():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(3001, generator=g)
        y = torch.randn(3001, generator=g)
        K.add(x, y, torch.empty(3001))
        a, b = torch.randn(70, 40, generator=g), torch.randn(40, 90, generator=g)
        K.matmul(a, b, torch.empty(70, 90))
        xs = torch.randn(37, 200, generator=g)
        w, bb = torch.randn(200, generator=g), torch.randn(200, generator=g)
        yy, mean, rstd = torch.empty(37, 200), torch.empty(37), torch.empty(37)
        block, warps = K.layer_norm_fwd(xs, w, bb, 1e-5, yy, mean, rstd)
        K.layer_norm_bwd(torch.randn(37, 200, generator=g), xs, w, mean, rstd, torch.empty(37, 200),
                         torch.empty(200), torch.empty(200), block, warps)
        idx = torch.randint(0, 500, (20,), generator=g)
        G.scatter_add(idx, torch.randn(20, 48, generator=g), torch.zeros(500, 48))
        keep.extend([x, y, a, b, xs, w, bb, yy, mean, rstd, idx])

    peer = _Peer()
    cfg = InterpretConfig(tmp_path / "t.pctrace", Workload("script", "peer", [], ["peer"]), part_seconds=0.0)
    seen = []
    from pagecast.collect import interpret as IM
    orig_begin = IM.InterpretRecorder.begin

    def begin(self, fn, args, kwargs):     # note each launch's tensors as the kernel gets them
        orig_begin(self, fn, args, kwargs)
        seen.append([a for a in args if isinstance(a, torch.Tensor)])

    IM.InterpretRecorder.begin = begin
    undo = peer.install()
    per_launch = []
    orig_end = IM.InterpretRecorder.end

    def end(self, partial=False):
        per_launch.append({k: set(v) for k, v in peer.bytes.items()})
        peer.bytes = {"read": set(), "write": set()}
        orig_end(self, partial)

    IM.InterpretRecorder.end = end
    try:
        res = collect_interpreted(cfg, workload, emulation=FullModeEmulation)
    finally:
        undo()
        IM.InterpretRecorder.begin = orig_begin
        IM.InterpretRecorder.end = orig_end
    assert res.code == 0 and res.launches == 6
    tr = _read(cfg.output)
    assert tr.complete and tr.n_launches == 6
    tru = tr.truth.to_pandas()
    for lid, (tensors, got) in enumerate(zip(seen, per_launch)):
        row = tr.launches.slice(lid, 1).to_pylist()[0]
        ptrs = [struct.unpack_from("<Q", row["param_data"], o)[0]
                for o, s in zip(row["param_offsets"], row["param_sizes"]) if s == 8]
        # the pointer words in order are the tensors in order (then the two scratch pointers)
        deltas = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), p - t.data_ptr())
                  for t, p in zip(tensors, ptrs)]
        want = {}
        for kind in ("read", "write"):
            pages = set()
            for b in got[kind]:
                d = [dl for base, n, dl in deltas if base <= b < base + n]
                assert d, f"launch {lid}: the peer saw a byte outside every argument"
                pages.add((b + d[0]) // PAGE)
            want[kind] = pages
        mine = {"read": set(), "write": set()}
        for _, r in tru[tru.launch_id == lid].iterrows():
            pages = set(range(r.address // PAGE, -(-(r.address + r.bytes) // PAGE)))
            if r.access in ("read", "readwrite"):
                mine["read"] |= pages
            if r.access in ("write", "readwrite"):
                mine["write"] |= pages
        assert mine == want, f"launch {lid} ({row['kernel']})"


# ---- the trace of a script --------------------------------------------------------------------

@pytest.fixture(scope="module")
def vadd_trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("vadd")
    _script(d, VADD, "vadd.py")
    p = _collect(["-o", "v.pctrace", "--json", "--", "python", "vadd.py"], d)
    assert p.returncode == 0, p.stderr
    return d / "v.pctrace", json.loads(p.stdout)


def test_vadd_trace_contents(vadd_trace):
    path, doc = vadd_trace
    assert doc["launches"] == 3 and doc["workload_exit_code"] == 0 and doc["kernels"] == 1
    tr = _read(path)
    m = tr.manifest
    assert tr.complete and m["source"] == "triton-interpreter" and m["mode"] == "full"
    assert m["environment"]["triton"].startswith("3.9") and m["interpreter"]["allocator"] == "direct"
    la = tr.launches.to_pylist()
    assert [r["kernel"] for r in la] == ["add_kernel"] * 3
    assert [r["grid_x"] for r in la] == [2, 10, 137] and {r["block_x"] for r in la} == {128}
    al = tr.allocations.to_pandas().sort_values("address")
    tru = tr.truth.to_pandas()
    for r, n in zip(la, (1000, 5000, 70000)):
        assert r["param_sizes"] == [8, 8, 8, 4, 8, 8]
        x, y, out, nn = struct.unpack_from("<QQQi", r["param_data"])
        assert nn == n and all(p % (2 << 20) == 0 for p in (x, y, out))
        lid = r["launch_id"]
        live = al[(al.first_launch <= lid) & ~(al.last_launch < lid)]
        assert set(live[live.address.isin([x, y, out])].bytes) == {4 * n}
        t = tru[tru.launch_id == r["launch_id"]]
        assert sorted(zip(t.address, t.bytes, t.access)) == sorted(
            [(x, 4 * n, "read"), (y, 4 * n, "read"), (out, 4 * n, "write")])
    # the fault emulation saw the truth: every observed page is a touched page's big page
    assert observed_footprints(tr).total_pages() >= truth_footprints(tr).total_pages() > 0
    assert tr.faults.column(T.LAUNCH_ID).null_count == 0


def test_fit_from_truth_and_faults(vadd_trace, tmp_path):
    path, _ = vadd_trace
    for src in ("truth", "faults"):
        model = tmp_path / f"{src}.json"
        assert cli_main(["fit", str(path), "-o", str(model), "--from", src]) == 0
        doc = json.loads(model.read_text())
        assert doc["traces"][0]["from"] == src
    assert cli_main(["fit", str(tmp_path / "none"), "-o", str(tmp_path / "m.json"), "--from", "truth"]) == 2


def test_fit_from_truth_refuses_a_trace_without_truth(hand_trace, tmp_path, capsys):
    assert cli_main(["fit", str(hand_trace), "-o", str(tmp_path / "m.json"), "--from", "truth"]) == 2
    assert "no truth table" in capsys.readouterr().err


def test_fit_from_truth_is_exact_on_a_model(tmp_path):
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.evaluate import evaluate
    from pagecast.predict.fit import fit_model
    from pagecast.predict.truth_obs import truth_observations
    fit = [_read(make_trace("stream", tmp_path / f"s{s}", scale=0.03 * s, seed=s)) for s in (1, 2)]
    test = _read(make_trace("stream", tmp_path / "s3", scale=0.05, seed=3))
    obs = truth_observations(fit[0])
    assert obs.truth is None and obs.manifest["driver_prefetch"] is False
    assert observed_footprints(obs).total_pages() == truth_footprints(fit[0]).total_pages()
    ev = evaluate(fit_model([truth_observations(t) for t in fit]), test)
    assert ev["determined"]["precision"] == 1.0 and ev["determined"]["recall"] == 1.0


@pytest.mark.parametrize("workload", [pytest.param("llm-paged-decode", marks=pytest.mark.slow), "moe-decode"])
def test_fit_from_truth_finds_the_indexed_kernels_of_a_model(tmp_path, workload):
    """Records exact to the page (`fit --from truth`) are fitted at the page's grain: the paged
    attention's blocks, the KV slot writes, embedding and rotary rows, expert weights are
    `indexed` and a third, larger run is predicted exactly. At the driver's 64 KiB grain (the
    model's big page before) those regions verified nowhere: they stayed irregular, 66% / 79%
    precise over all kernels."""
    from pagecast.datasets.registry import make_trace
    from pagecast.predict.evaluate import evaluate
    from pagecast.predict.fit import fit_model
    from pagecast.predict.truth_obs import truth_observations
    fit = [_read(make_trace(workload, tmp_path / f"s{s}", scale=0.05 * s, seed=s)) for s in (1, 2)]
    test = _read(make_trace(workload, tmp_path / "s3", scale=0.075, seed=3))
    model = fit_model([truth_observations(t) for t in fit])
    assert model.big_page == fit[0].page_size
    ev = evaluate(model, test)
    assert ev["overall"]["precision"] == 1.0 and ev["overall"]["recall"] == 1.0, \
        [(k["kernel"], k["class"], k["precision"], k["recall"]) for k in ev["kernels"]]
    assert "indexed" in {k["class"] for k in ev["kernels"]}


def test_caching_allocator_and_record_loss(tmp_path):
    _script(tmp_path, VADD, "vadd.py")
    p = _collect(["-o", "c.pctrace", "--allocator", "caching", "--drop", "0.3", "--seed", "5", "--",
                  "python", "vadd.py", "1000", "5000", "300000", "1000"], tmp_path)
    assert p.returncode == 0, p.stderr
    tr = _read(tmp_path / "c.pctrace")
    al = tr.allocations.to_pandas()
    # small tensors share a 2 MiB segment; 1.2 MB ones come from 20 MiB segments
    assert set(al.bytes) <= {2 << 20, 20 << 20} and len(al) < 12 and al.last_launch.isna().all()
    for r in tr.launches.to_pylist():
        for ptr in struct.unpack_from("<QQQ", r["param_data"]):
            assert ptr % 512 == 0 and ((al.address <= ptr) & (ptr < al.address + al.bytes)).sum() == 1
    m = tr.manifest
    assert m["dropped_records"] == sum(m["collection"]["records_dropped"].values()) > 0
    assert m["interpreter"]["drop_rate"] == 0.3
    T.read_trace(tmp_path / "c.pctrace")   # valid: live segments never overlap


# ---- bad input, crashes ------------------------------------------------------------------------

def test_a_crash_keeps_a_partial_trace(tmp_path):
    _script(tmp_path, VADD + "\nraise RuntimeError('boom')\n", "crash.py")
    p = _collect(["-o", "x.pctrace", "--", "python", "crash.py", "1000", "2000"], tmp_path)
    assert p.returncode == 1 and "RuntimeError: boom" in p.stderr and "partial trace" in p.stderr
    tr = _read(tmp_path / "x.pctrace")
    assert not tr.complete and tr.n_launches == 2 and tr.truth.num_rows == 6
    assert tr.manifest["workload_exit_code"] == 1


def test_cuda_tensors_are_refused(tmp_path):
    body = VADD + textwrap.dedent("""
        x = torch.empty(100, device="meta")
        add_kernel[(1,)](x, x, x, 100, BLOCK=512)
    """)
    _script(tmp_path, body, "meta.py")
    p = _collect(["-o", "m.pctrace", "--", "python", "meta.py", "1000"], tmp_path)
    assert p.returncode == 2
    err = [x for x in p.stderr.splitlines() if "error" in x]
    assert len(err) == 1 and "tensor on meta" in err[0] and "on the CPU" in err[0]
    assert "Traceback" not in p.stderr
    tr = _read(tmp_path / "m.pctrace")        # the launch before it is kept
    assert tr.n_launches == 1 and not tr.complete


def test_a_script_without_kernels_is_bad_input(tmp_path):
    _script(tmp_path, "print('hello')\n", "none.py")
    p = _collect(["-o", "n.pctrace", "--", "python", "none.py"], tmp_path)
    assert p.returncode == 2 and not (tmp_path / "n.pctrace").exists()
    assert p.stderr.strip().splitlines()[-1].startswith("pagecast collect: error: the workload launched no Triton")
    assert "Traceback" not in p.stderr


def test_unsupported_triton_version(monkeypatch, tmp_path):
    import triton
    monkeypatch.setattr(triton, "__version__", "3.8.0")
    cfg = InterpretConfig(tmp_path / "t.pctrace", Workload("script", "w", [], ["w"]))
    from pagecast.errors import InputError
    with pytest.raises(InputError, match="found triton 3.8.0"):
        collect_interpreted(cfg, lambda: None, emulation=FullModeEmulation)
    assert not (tmp_path / "t.pctrace").exists()


@pytest.mark.parametrize("flags, message", [
    (["--interpret", "--managed", "torch"], "--managed does not apply"),
    (["--interpret", "--mode", "natural"], "full-mode traces only"),
    (["--interpret", "--drop", "2"], "--drop must be"),
    (["--interpret", "--drop", "nan"], "--drop must be"),
    (["--interpret", "--seed", "-1"], "--seed must be"),
    (["--allocator", "caching"], "applies to --interpret only"),
    (["--drop", "0.1"], "applies to --interpret only"),
])
def test_bad_flags(flags, message, tmp_path, capsys):
    _script(tmp_path, "pass\n", "w.py")
    assert cli_main(["collect", *flags, "-o", str(tmp_path / "o"), "--", "python", str(tmp_path / "w.py")]) == 2
    assert message in capsys.readouterr().err


def test_sigterm_leaves_a_readable_trace(tmp_path):
    body = VADD.replace("for n in", "import time\nfor n in") + textwrap.dedent("""
        i = 0
        while True:
            add_kernel[(1,)](x, y, out, 512, BLOCK=512)
            i += 1
            if i == 2:   # launches recorded before the signal, however loaded the machine
                print("launched", flush=True)
            time.sleep(0.05)
    """)
    _script(tmp_path, body, "loop.py")
    proc = subprocess.Popen([sys.executable, "-m", "pagecast.cli", "collect", "--interpret", "-o", "s.pctrace", "--",
                             "python", "loop.py", "1000"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "launched"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    tr = _read(tmp_path / "s.pctrace")
    assert not tr.complete and tr.n_launches >= 2
    # a launch the signal cut off is marked partial (only the last can be); every other is whole
    partial = tr.manifest.get(T.PARTIAL_KEY, [])
    assert partial in ([], [tr.n_launches - 1])
    lid = tr.truth.column(T.LAUNCH_ID).to_numpy()
    whole = np.flatnonzero(tr.whole_launches())
    assert np.array_equal(np.bincount(lid, minlength=tr.n_launches)[whole], np.full(len(whole), 3))


def test_hooks_are_removed_afterwards(tmp_path):
    from triton.runtime import interpreter as I
    run = I.InterpretedFunction.run
    builder = dict(I.interpreter_builder.__dict__)
    cfg = InterpretConfig(tmp_path / "t.pctrace", Workload("script", "w", [], ["w"]))
    from pagecast.datasets.corpus import tutorial_kernels as K
    res = collect_interpreted(cfg, lambda: K.add(torch.ones(10), torch.ones(10), torch.empty(10)),
                              emulation=FullModeEmulation)
    assert res.launches == 1
    assert I.InterpretedFunction.run is run and dict(I.interpreter_builder.__dict__).keys() == builder.keys()


def test_missing_frameworks_are_one_line(monkeypatch, tmp_path):
    from pagecast.errors import InputError
    monkeypatch.setitem(sys.modules, "triton", None)       # import triton raises ImportError
    cfg = InterpretConfig(tmp_path / "t.pctrace", Workload("script", "w", [], ["w"]))
    with pytest.raises(InputError, match=r"pagecast\[interpret\]"):
        collect_interpreted(cfg, lambda: None, emulation=FullModeEmulation)


def test_workload_command_line_errors(tmp_path, capsys):
    assert cli_main(["collect", "--interpret", "-o", str(tmp_path / "o")]) == 2
    assert "expected a workload" in capsys.readouterr().err
    assert cli_main(["collect", "--interpret", "-o", str(tmp_path / "o"), "--", "python", "nope.py"]) == 2
    assert "no such script" in capsys.readouterr().err


def test_emulation_in_chunks_is_the_emulation():
    """Where the recorder cuts the launches into flushes changes nothing: each launch's faults and
    migrations come from its own random stream, and the clock takes one draw per launch."""
    from pagecast.datasets import emulate as E
    lid = np.repeat(np.arange(50), 3)
    addr = np.tile(np.array([0, 4 << 20, 8 << 20]), 50) + 0x7F40_0000_0000 + np.repeat(np.arange(50), 3) * 4096
    nb = np.tile(np.array([1 << 20, 300_000, 4096]), 50)
    aid = np.tile(np.arange(3), 50)
    acc = np.tile(np.array([0, 1, 2], np.int8), 50)
    a_addr = np.array([0x7F40_0000_0000, 0x7F40_0040_0000, 0x7F40_0080_0000])
    a_bytes = np.array([2 << 20, 2 << 20, 2 << 20])
    moved = np.bincount(lid, weights=nb)

    def record(cuts, drop):
        emu = E.FullModeEmulation(seed=3, drop=drop)
        f, m, times = [], [], []
        for lo, hi in zip([0, *cuts], [*cuts, 50]):
            start, end = emu.times(moved[lo:hi])
            times.append(np.stack([start, end]))
            rows = (lid >= lo) & (lid < hi)
            a, b = emu.records(lo, lid[rows], aid[rows], addr[rows], nb[rows], acc[rows], start, end, a_addr, a_bytes)
            f.append(pa.table(a))
            m.append(pa.table(b))
        return pa.concat_tables(f), pa.concat_tables(m), np.concatenate(times, axis=1), emu.dropped

    for drop in (0.0, 0.2):
        whole = record([], drop)
        for cuts in ([1], [7, 8, 30], list(range(1, 50))):
            parts = record(cuts, drop)
            assert parts[0].equals(whole[0]) and parts[1].equals(whole[1]), (drop, cuts)
            assert (parts[2] == whole[2]).all() and parts[3] == whole[3], (drop, cuts)
        assert whole[0].num_rows > 100 and whole[1].num_rows > 50
        assert (whole[3]["faults"] > 0) == (drop > 0)
        if drop:   # the loss is drawn last in a launch's stream: the clean records, some removed
            clean = record([], 0.0)
            for lossy, full in zip(whole[:2], clean[:2]):
                rows = set(zip(*lossy.to_pydict().values()))
                assert rows < set(zip(*full.to_pydict().values())) and len(rows) < full.num_rows
    # one fault per touched big page, but for the ~0.1% the emulated fault buffer loses
    f = record([], 0.0)[0]
    pairs = int((((addr + nb - 1) >> 16) - (addr >> 16) + 1).sum())
    assert 0.99 * pairs <= f.num_rows <= pairs and (np.diff(f[T.TIME_NS].to_numpy()) >= 0).all()
    # another seed draws other faults
    other = E.FullModeEmulation(seed=4).records(0, lid, aid, addr, nb, acc, *E.FullModeEmulation(seed=4).times(moved),
                                                a_addr, a_bytes)
    assert not pa.table(other[0]).equals(f)


FLUSHED = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from pagecast.collect.interpret import InterpretConfig, collect_interpreted
    from pagecast.collect.target import Workload
    from pagecast.datasets.corpus import tutorial_kernels as K
    from pagecast.datasets.emulate import FullModeEmulation

    def workload():
        g = torch.Generator().manual_seed(0)
        for n in (3001, 70_000, 5000, 140_000, 900):
            K.add(torch.randn(n, generator=g), torch.randn(n, generator=g), torch.empty(n))

    cfg = InterpretConfig(Path(sys.argv[1]), Workload("script", "adds", [], ["adds"]), seed=11, drop=0.05,
                          part_seconds=float(sys.argv[2]), flush_launches=int(sys.argv[3]))
    sys.exit(collect_interpreted(cfg, workload, emulation=FullModeEmulation).code)
""")


def test_a_recording_is_the_same_however_it_is_flushed(tmp_path):
    """One workload and seed recorded, each in a process of its own, with a flush after every
    launch and with one flush at the end (the recorder also flushes on wall time, which no two
    runs share): the same launch times, truth, faults and migrations, at 5% of records lost."""
    _script(tmp_path, FLUSHED, "flushed.py")
    got = []
    for i, (secs, every) in enumerate((("0", "1"), ("1e9", str(1 << 20)))):
        p = subprocess.run([sys.executable, "flushed.py", f"t{i}.pctrace", secs, every], cwd=tmp_path,
                           capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stderr
        got.append(_read(tmp_path / f"t{i}.pctrace"))
    a, b = got
    assert a.n_launches == b.n_launches == 5 and a.faults.num_rows > 20
    for table in (T.ALLOCATIONS, T.TRUTH, T.FAULTS, T.MIGRATIONS):
        assert getattr(a, table).to_pydict() == getattr(b, table).to_pydict(), table
    for col in (T.START_NS, T.END_NS):
        assert a.column(T.LAUNCHES, col).tolist() == b.column(T.LAUNCHES, col).tolist()


ROWS = textwrap.dedent("""
    import sys, torch, triton, triton.language as tl

    @triton.jit
    def take_rows(out_ptr, x_ptr, idx_ptr, ROW: tl.constexpr, HAS_IDX: tl.constexpr):
        i = tl.program_id(0)
        if HAS_IDX:
            r = tl.load(idx_ptr + i)
        else:
            r = i
        offs = tl.arange(0, ROW)
        tl.store(out_ptr + i * ROW + offs, tl.load(x_ptr + r * ROW + offs))

    ROW = 16384   # 64 KiB rows: a row a big page
    x = torch.randn(256, ROW)
    g = torch.Generator().manual_seed(int(sys.argv[1]))
    for n in [int(a) for a in sys.argv[2:]]:
        out = torch.empty(n, ROW)
        take_rows[(n,)](out, x, None, ROW=ROW, HAS_IDX=False)           # the first n rows
        assert torch.equal(out, x[:n])
        idx = torch.randint(0, 256, (n,), generator=g)
        take_rows[(n,)](out, x, idx, ROW=ROW, HAS_IDX=True)             # rows the indices choose
        assert torch.equal(out, x[idx])
""")


@pytest.mark.slow
def test_a_kernel_specialized_on_a_none_argument_is_fitted_per_parameter_layout(tmp_path):
    """Triton drops an argument passed as None from the parameter buffer (it is a constant of
    that specialization), so one kernel name launches with two layouts (vLLM's fused MoE takes its
    sorted token ids as None for sparse batches). Each layout is fitted from its own launches
    (`KernelModel.variants`) and predicted by its own templates: a larger run at 100% / 100%,
    online as in batch, through the model file. Fitted from the majority layout alone, the
    other's launches were unseen (the fallback)."""
    from pagecast.predict.evaluate import evaluate
    from pagecast.predict.fit import fit_model
    from pagecast.predict.model_io import load_model, save_model
    from test_fit_indexed import assert_online_is_batch
    _script(tmp_path, ROWS, "rows.py")
    for name, args in (("a", ["1", "3", "9", "5"]), ("b", ["2", "12", "4", "20", "7"]), ("c", ["3", "40", "33"])):
        p = _collect(["-o", f"{name}.pctrace", "--seed", args[0], "--", "python", "rows.py", *args], tmp_path)
        assert p.returncode == 0, p.stderr
    model = fit_model([_read(tmp_path / "a.pctrace"), _read(tmp_path / "b.pctrace")])
    km = model.kernels["take_rows"]
    assert len(km.variants) == 1 and len(km.variants[0].param_sizes) != len(km.param_sizes)
    assert {r.cls for kv in (km, *km.variants) for r in kv.regions} >= {"indexed", "linear"}
    save_model(model, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json")
    kv = again.kernels["take_rows"].variants[0]
    assert [r.text() for r in kv.regions] == [r.text() for r in km.variants[0].regions]
    test = _read(tmp_path / "c.pctrace")
    k = next(x for x in evaluate(again, test, "none")["kernels"] if x["kernel"] == "take_rows")
    assert k["precision"] == 1.0 and k["recall"] == 1.0, k
    assert_online_is_batch(again, test)
    # a variants entry that is no list of kernels, or repeats the kernel's layout: one line, exit 2
    doc = json.loads((tmp_path / "m.json").read_text())
    for bad in ("x", [doc["kernels"]["take_rows"] | {"variants": []}]):
        d = json.loads(json.dumps(doc))
        d["kernels"]["take_rows"]["variants"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(d))
        p = subprocess.run([sys.executable, "-m", "pagecast.cli", "evaluate", "bad.json", "c.pctrace"], cwd=tmp_path,
                           capture_output=True, text=True)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "variant" in p.stderr, p.stderr
