"""Natural mode's launch buffer (collect/launch_ring.py): the launch callback records into a
preallocated buffer and nothing else; the launches come out of it, off the callback, exactly as
the decoding callback (`LaunchHook` without a ring) delivers them, and the traces the collector
writes either way are the same."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast import trace as T
from pagecast.collect import convert as C
from pagecast.collect import launch_hook as lh
from pagecast.collect import managed as M
from pagecast.collect.collector import Collector
from pagecast.collect.launch_ring import LaunchRing

import collect_standin as S

HERE = Path(__file__).resolve().parent

cupti_mod = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")


# ---- a stand-in program: kernels with their layouts, launched through every launch API ----------

def _aligned(sizes):
    offsets, at = [], 0
    for n in sizes:
        a = min(n, 8)
        at = -(-at // a) * a
        offsets.append(at)
        at += n
    return tuple(offsets), tuple(sizes)


def _struct(dtype_name: str, **fields):
    dt = getattr(cupti_mod, dtype_name)
    rec = np.zeros(1, dtype=dt)
    for k, v in fields.items():
        if isinstance(v, tuple):  # dim3
            rec[k] = np.frombuffer(struct.pack("<3I", *v), dtype=dt.fields[k][0])
        else:
            rec[k] = v
    return rec


class Program:
    """Kernels (function handle -> layout) and their launches as CUPTI calls the hook: each
    `launch` plays one launch API's callbacks with real parameter structs."""

    HOST_STUB = 0x40_0000   # a runtime launch's host stub for function f is HOST_STUB + f

    def __init__(self, layouts: dict[int, tuple[tuple, tuple]]) -> None:
        self.layouts = layouts
        self.corr = 1000
        self._keep: list = []

    def info(self, calls: list | None = None) -> lh.ParamInfo:
        def layout(h):
            if calls is not None:
                calls.append(("layout", h))
            return self.layouts[h]

        def name(h):
            if calls is not None:
                calls.append(("name", h))
            return f"<function {h:#x}>" if h % 5 == 0 else f"_Z6kernel{h}"

        return lh.ParamInfo(layout_fn=layout, name_fn=name, symbol_fn=lambda host: host - self.HOST_STUB)

    def _cb(self, site, corr, ptr, func, context=0x5000):
        return SimpleNamespace(callback_site=site, correlation_id=corr, function_params=ptr,
                               symbol_name=f"sym{func}", context=context)

    def launch(self, hooks, func: int, values: list[bytes], api: str, grid=(2, 1, 1), block=(64, 1, 1),
               stream=0x77) -> None:
        """Play one launch through every hook in `hooks` (the same calls, in the same order)."""
        bufs = [ctypes.create_string_buffer(v, len(v)) for v in values]
        arr = (ctypes.c_void_p * max(1, len(bufs)))(*[ctypes.addressof(b) for b in bufs])
        kp = ctypes.addressof(arr)
        keep = [bufs, arr]
        calls = []
        self.corr += 2
        c = self.corr
        if api in ("driver", "driver_ptsz"):
            cbid = lh.CB_cuLaunchKernel if api == "driver" else lh.CB_cuLaunchKernel_ptsz
            rec = _struct("cu_launch_kernel_params_dtype", f=func, grid_dim_x=grid[0], grid_dim_y=grid[1],
                          grid_dim_z=grid[2], block_dim_x=block[0], block_dim_y=block[1], block_dim_z=block[2],
                          shared_mem_bytes=48, h_stream=stream, kernel_params=kp)
            calls = [(lh.DOMAIN_DRIVER, cbid, lh.API_ENTER, c, rec), (lh.DOMAIN_DRIVER, cbid, lh.API_EXIT, c, rec)]
        elif api == "driver_extra":   # cuLaunchKernelEx with the parameters packed in `extra`
            off, _ = self.layouts[func]
            blob = bytearray(max([o + len(v) for o, v in zip(off, values)] or [0]))
            for o, v in zip(off, values):
                blob[o:o + len(v)] = v
            buf = ctypes.create_string_buffer(bytes(blob), len(blob))
            size = ctypes.c_size_t(len(blob))
            ex = (ctypes.c_void_p * 5)(lh.CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buf),
                                       lh.CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size), lh.CU_LAUNCH_PARAM_END)
            cfg = lh.CUlaunchConfig(*grid, *block, 0, stream, None, 0)
            rec = _struct("cu_launch_kernel_ex_params_dtype", config=ctypes.addressof(cfg), f=func,
                          kernel_params=0, extra=ctypes.addressof(ex))
            keep += [buf, size, ex, cfg]
            cbid = lh.CB_cuLaunchKernelEx
            calls = [(lh.DOMAIN_DRIVER, cbid, lh.API_ENTER, c, rec), (lh.DOMAIN_DRIVER, cbid, lh.API_EXIT, c, rec)]
        else:   # runtime: cudaLaunchKernel, with (runtime+driver) or without (runtime) a driver call inside
            rt = _struct("cuda_launch_kernel_v7000params_dtype", func=self.HOST_STUB + func, grid_dim=grid,
                         block_dim=block, args=kp, shared_mem=16, stream=stream)
            calls = [(lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, lh.API_ENTER, c, rt)]
            if api == "runtime+driver":
                drv = _struct("cu_launch_kernel_params_dtype", f=func, grid_dim_x=grid[0], grid_dim_y=grid[1],
                              grid_dim_z=grid[2], block_dim_x=block[0], block_dim_y=block[1],
                              block_dim_z=block[2], shared_mem_bytes=16, h_stream=stream, kernel_params=kp)
                calls += [(lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, lh.API_ENTER, c + 1, drv),
                          (lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, lh.API_EXIT, c + 1, drv)]
            calls.append((lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, lh.API_EXIT, c, rt))
        self._keep = [keep, calls]
        for hook in hooks:
            for domain, cbid, site, corr, rec in calls:
                hook._callback(None, domain, cbid, self._cb(site, corr, rec.ctypes.data, func))

    def values(self, rnd: random.Random, func: int) -> list[bytes]:
        return [bytes(rnd.getrandbits(8) for _ in range(n)) for n in self.layouts[func][1]]


def _clock():
    n = iter(range(10**9))
    return lambda: 1_000_000 + next(n)


def _hooks(prog: Program, ring: LaunchRing, calls: list | None = None):
    kw = dict(stream_id_fn=lambda ctx, s, ptsz: (s % 97) * 2 + int(ptsz), device_fn=lambda ctx: ctx % 3)
    got: list[lh.LaunchArgs] = []

    def delivered(a):   # as delivered: the hook adds a driver call nested later to the same object
        got.append(dataclasses.replace(a, correlation_ids=list(a.correlation_ids)))

    old = lh.LaunchHook(delivered, param_info=prog.info(), clock=_clock(), **kw)
    new = lh.LaunchHook(None, param_info=prog.info(calls), clock=_clock(), ring=ring, **kw)
    return old, new, got


# ---- the hook and the ring ------------------------------------------------------------------------

_SIZES = st.lists(st.sampled_from([1, 2, 4, 8, 8, 8, 16, 24, 40, 72]), min_size=0, max_size=20)
_APIS = ("driver", "driver_ptsz", "driver_extra", "runtime+driver", "runtime")


@settings(max_examples=60, deadline=None)
@given(st.lists(_SIZES, min_size=1, max_size=6), st.integers(1, 6), st.sampled_from([0, 16, 64, 256]),
       st.randoms(use_true_random=False))
def test_the_ring_hands_over_what_the_decoding_callback_delivers(kernels, slots, slot_bytes, rnd):
    """Any kernels and launch APIs, launches taken at any points, a buffer that wraps, fills
    (launches kept beside it) and holds parameter buffers larger than its slots: what comes out
    is, launch for launch, what the decoding callback delivers."""
    prog = Program({0xF00 + 7 * i: _aligned(sizes) for i, sizes in enumerate(kernels)})
    ring = LaunchRing(slots=slots, slot_bytes=slot_bytes)
    old, new, got = _hooks(prog, ring)
    funcs = list(prog.layouts)
    out = []
    for _ in range(rnd.randrange(1, 40)):
        f = rnd.choice(funcs)
        api = rnd.choice(_APIS)
        prog.launch([old, new], f, prog.values(rnd, f), api, grid=(rnd.randrange(1, 9), 1, 2),
                    stream=rnd.choice([0, 0x77, 0x99]))
        if rnd.random() < 0.3:
            out += ring.take()
    out += ring.take()
    # (a runtime launch with no driver call inside, after one with: an error on both paths)
    assert (old.errors, old.last_error) == (new.errors, new.last_error)
    assert out == got and len(out) == new.launches
    assert ring.pending() == 0


def test_the_callback_asks_the_driver_once_per_kernel_and_records_into_the_buffer():
    prog = Program({0xF01: _aligned([8, 8, 4]), 0xF02: _aligned([8] * 12 + [4, 4])})
    calls = []
    ring = LaunchRing(slots=8)
    _, new, _ = _hooks(prog, ring, calls)
    rnd = random.Random(1)
    for i in range(20):
        f = 0xF01 if i % 3 else 0xF02
        prog.launch([new], f, prog.values(rnd, f), "driver")
    # the layout and the name: once per kernel, at its first launch; nothing else asked per launch
    assert sorted(calls) == [("layout", 0xF01), ("layout", 0xF02), ("name", 0xF01), ("name", 0xF02)]
    assert ring.pending() == 8 + 12 and ring.spilled == 12   # nobody took: the rest kept beside it
    got = ring.take()
    assert len(got) == 20 and [a.kernel for a in got[:3]] == ["_Z6kernel3842", "_Z6kernel3841", "_Z6kernel3841"]
    assert ring.take() == [] and ring.pending() == 0


def test_a_launch_that_fails_to_record_leaves_no_hole():
    prog = Program({0xF01: _aligned([8, 4])})
    ring = LaunchRing(slots=4)
    old, new, got = _hooks(prog, ring)
    rnd = random.Random(2)
    prog.launch([old, new], 0xF01, prog.values(rnd, 0xF01), "driver")
    # null kernelParams entries: counted by both paths, never raised into CUDA, nothing recorded
    nulls = (ctypes.c_void_p * 2)(0, 0)
    rec = _struct("cu_launch_kernel_params_dtype", f=0xF01, grid_dim_x=1, grid_dim_y=1, grid_dim_z=1,
                  block_dim_x=1, block_dim_y=1, block_dim_z=1, kernel_params=ctypes.addressof(nulls))
    for h in (old, new):
        for site in (lh.API_ENTER, lh.API_EXIT):
            h._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, prog._cb(site, 5, rec.ctypes.data, 0xF01))
    assert old.errors == new.errors == 1 and "is null" in new.last_error
    prog.launch([old, new], 0xF01, prog.values(rnd, 0xF01), "driver")
    out = ring.take()
    # (the recording path took its timestamp before the gather failed: the clocks count apart)
    assert [dataclasses.replace(a, host_ns=0) for a in out] == [dataclasses.replace(a, host_ns=0) for a in got]
    assert len(got) == 2 and new.launches == 2 and ring.pending() == 0


def test_launching_threads_share_the_buffer_without_mixing_launches():
    """Two threads launching at once through one hook: every launch comes out once, with its
    own bytes, in the order the hook numbered them."""
    prog = Program({0xF01: _aligned([8, 8, 4]), 0xF02: _aligned([8] * 16)})
    ring = LaunchRing(slots=16, slot_bytes=64)
    hook = lh.LaunchHook(None, param_info=prog.info(), clock=_clock(), ring=ring)
    progs = [Program(prog.layouts) for _ in range(2)]
    progs[1].corr = 10**6
    taken: list[lh.LaunchArgs] = []
    done = threading.Event()

    def run(p, tag):
        for i in range(150):
            f = 0xF01 if i % 2 else 0xF02
            vals = [struct.pack("<Q", (tag << 32) | i)] + [bytes([tag]) * n for n in p.layouts[f][1][1:]]
            p.launch([hook], f, vals, "driver")

    def consume():
        while not done.is_set():
            taken.extend(ring.take(0.01))
        taken.extend(ring.take(1.0))

    ts = [threading.Thread(target=run, args=(p, k + 1)) for k, p in enumerate(progs)]
    c = threading.Thread(target=consume)
    c.start()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    done.set()
    c.join()
    assert hook.errors == 0, hook.last_error
    assert len(taken) == 300 and ring.pending() == 0
    seen = set()
    for a in taken:
        word = int.from_bytes(a.param(0), "little")
        tag, i = word >> 32, word & 0xFFFFFFFF
        assert all(a.param(k) == bytes([tag]) * a.param_sizes[k] for k in range(1, len(a.param_sizes)))
        seen.add((tag, i))
    assert len(seen) == 300
    for tag in (1, 2):   # each thread's launches in its own order
        assert [i for t, i in ((int.from_bytes(a.param(0), "little") >> 32,
                                int.from_bytes(a.param(0), "little") & 0xFFFFFFFF) for a in taken) if t == tag] \
            == list(range(150))


# ---- the collector: natural mode records in the callback, decodes and writes off it -------------

def _collector(out, prog: Program, *, ring, calls: list | None = None):
    source = S.StandInSource(interval_s=0.02)
    device = S.StandInDevice()
    manifest = T.new_manifest(mode="natural", source="cupti", workload={"name": "standin", "argv": ["standin"]})
    c = Collector(out, mode="natural", source=source, device=device, budget=M.ManagedBudget(None),
                  hook_cls=S.StandInHook, hook_kwargs={"param_info": prog.info(calls), "clock": _clock(),
                                                       "stream_id_fn": lambda ctx, s, p: 3, "device_fn": lambda ctx: 0},
                  part_seconds=0.05, tick_s=0.01, manifest=manifest, install_signals=False, ring=ring)
    return c, source


def _workload(c, source, prog: Program, n: int, seed: int):
    rnd = random.Random(seed)
    funcs = list(prog.layouts)
    t = 10_000

    def run():
        for i in range(n):
            f = funcs[i % len(funcs)]
            api = ("driver", "runtime+driver", "driver_extra")[i % 3]
            prog.launch([c.hook], f, prog.values(rnd, f), api, grid=(1 + i % 5, 1, 1))
            corr = prog.corr   # the outermost launch call's correlation id
            source.emit(S.kernel_record(name=c.hook.params.name(f) if f % 5 else f"sym{f}", start=t, end=t + 50,
                                        grid=(1 + i % 5, 1, 1), block=(64, 1, 1), smem=48, corr=corr),
                        S.um_record(counter_kind=C.UM_GPU_PAGE_FAULT, value=1, start=t + 10, end=0,
                                    address=0x7F00_0000_0000 + 4096 * i, flags=1))
    return run


def _tables(path):
    t = S.read_quiet(path)
    return {name: getattr(t, name).to_pylist() for name in (T.LAUNCHES, T.FAULTS, T.ALLOCATIONS)}


def test_natural_mode_writes_the_same_trace_as_the_decoding_callback(tmp_path):
    layouts = {0xF00 + i: _aligned(s) for i, s in enumerate([[8, 8, 4], [8] * 14 + [4, 4], [8, 4, 4, 8, 8],
                                                             [8] * 40])}   # the last: past a slot
    traces = []
    # the decoding path; the default buffer; a buffer of 4 slots of 64 bytes (it wraps, and fills
    # whenever the ticker or the source's thread is late: launches kept beside it)
    for k, ring in enumerate((False, None, LaunchRing(slots=4, slot_bytes=64))):
        prog = Program(layouts)
        c, source = _collector(tmp_path / f"{k}.pctrace", prog, ring=ring)
        assert (c.ring is None) == (ring is False)
        assert c.run(_workload(c, source, prog, 120, seed=3)) == 0
        assert c.hook.errors == 0, c.hook.last_error
        traces.append(_tables(tmp_path / f"{k}.pctrace"))
    assert traces[0] == traces[1] == traces[2]
    assert len(traces[1][T.LAUNCHES]) == 120 and all(r[T.START_NS] is not None for r in traces[1][T.LAUNCHES])
    m = S.read_quiet(tmp_path / "1.pctrace").manifest["collection"]
    assert m["launch_buffer_spilled"] == 0 and m["rows_launches_without_args"] == 0
    assert "us per launch decoded off the callback" in c.overhead_line()


def test_natural_mode_callback_neither_decodes_nor_writes(tmp_path):
    """Inside the launch callback: no LaunchArgs made, no row added, nothing written, the
    collector's lock not taken; all of that happens on other calls, off the callback."""
    prog = Program({0xF01: _aligned([8, 8, 4]), 0xF02: _aligned([8] * 12 + [4, 4])})
    c, source = _collector(tmp_path / "n.pctrace", prog, ring=True)
    inside: list[str] = []
    outside: list[str] = []

    def watch(name, fn):
        def wrapped(*a, **k):
            (inside if getattr(c.hook._tls, "busy", False) else outside).append(name)
            return fn(*a, **k)
        return wrapped

    c.builder.add_launch = watch("add_launch", c.builder.add_launch)
    real_init = lh.LaunchArgs.__init__
    lh.LaunchArgs.__init__ = watch("LaunchArgs", real_init)
    try:
        c.start()
        for name in ("append", "flush"):
            setattr(c.writer, name, watch(name, getattr(c.writer, name)))
        rnd = random.Random(4)
        for i in range(30):
            f = 0xF01 if i % 2 else 0xF02
            prog.launch([c.hook], f, prog.values(rnd, f), ("driver", "runtime+driver")[i % 2])
        # the writer holds the collector's lock (as while it writes a Parquet part): launching goes on
        with c._lock:
            t = threading.Thread(target=lambda: [prog.launch([c.hook], 0xF01, prog.values(rnd, 0xF01), "driver")
                                                 for _ in range(5)])
            t.start()
            t.join(timeout=10)
            assert not t.is_alive(), "a launch waited for the collector's lock"
        c.finish(True)
    finally:
        lh.LaunchArgs.__init__ = real_init
    assert c.hook.errors == 0, c.hook.last_error
    assert inside == []
    assert outside.count("add_launch") == 35 and outside.count("LaunchArgs") == 35 and "flush" in outside
    assert S.read_quiet(tmp_path / "n.pctrace").n_launches == 35


def test_full_mode_keeps_decoding_in_the_callback(tmp_path):
    c, gpu = S.make_collector(tmp_path / "f.pctrace", mode="full")
    assert c.ring is None and c.hook.ring is None


# ---- a killed natural-mode collection keeps what it recorded ------------------------------------

def _collecting(out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    p = subprocess.Popen([sys.executable, str(HERE / "collect_standin.py"), str(out), "--mode", "natural"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until some launch parts were closed
        if len(list((out / T.LAUNCHES).glob("part-*.parquet"))) >= 2:
            return p
        time.sleep(0.05)
    p.kill()
    raise AssertionError("the collecting subprocess closed no parts")


def _partial(out: Path) -> T.Trace:
    t = S.read_quiet(out)  # validates: dense launch ids, schemas
    assert t.n_launches > 0 and not t.complete
    ns = [struct.unpack("<QQi", d[:20])[2] for d in t.launches.column(T.PARAM_DATA).to_pylist()]
    assert ns == [1024 * (1 + i % 8) for i in range(len(ns))]   # every launch's own bytes, in order
    return t


def test_sigterm_in_natural_mode_writes_every_recorded_launch(tmp_path):
    out = tmp_path / "term.pctrace"
    p = _collecting(out)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM, err
    t = _partial(out)
    info = t.manifest["collection"]
    assert t.n_launches == info["launches_hooked"] and info["hook_errors"] == 0
    assert t.launches.column(T.START_NS).null_count <= 1


def test_sigkill_in_natural_mode_leaves_a_readable_partial_trace(tmp_path):
    out = tmp_path / "kill.pctrace"
    p = _collecting(out)
    p.kill()
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL
    assert _partial(out).manifest["collection"]["running"] is True


@settings(max_examples=30, deadline=None)
@given(st.binary(min_size=128, max_size=128))
def test_one_read_of_a_parameter_struct_gives_what_its_fields_give(raw):
    """`values` (one struct.unpack_from, what the callback reads launches with) against a ctypes
    read of each field, for every parameter struct, over any bytes."""
    from pagecast.collect import cupti_params as P

    buf = ctypes.create_string_buffer(raw, len(raw))
    at = ctypes.addressof(buf)
    for cls in P.ALL:
        view = cls.at(at)

        def field(name):
            x = view
            for part in name.split("."):
                x = getattr(x, part)
            return int(x)

        assert cls.values(at) == tuple(field(n) for n in cls.flat_fields()), cls.__name__
    with pytest.raises(ValueError, match="null parameter pointer"):
        P.CuLaunchKernelParams.values(0)
