"""The collector's launch callback in natural mode, on the CPU: the recording path (the callback
records into collect/launch_ring.py's buffer; names, layouts and rows are made off the callback)
beside the decoding path it replaced, in one run.

    python benchmarks/bench_collect.py [--launches 4000] [--rounds 3] [--baseline-rev REV]
                                       [--json FILE] [--markdown FILE]

A `Collector` in natural mode runs on the stand-ins of tests/collect_standin.py (a CUPTI
activity source that delivers kernel records from its own thread, a device, a hook without the
CUPTI subscription) and writes a real trace (Parquet parts every 2 s, its ticker every 0.2 s),
while the benchmark plays launches through the hook's callback as CUPTI would call it: through
cupti-python's own C callback wrapper (`callbackFuncWrapper`, which wraps CUPTI's
`CUpti_CallbackData` in a `cupti.CallbackData` and calls the subscribed Python function) where
this cupti-python has it reachable, with cupti-python's parameter structs over real memory and a
real `void** kernelParams`. Every launch's kernel record (and a fault) goes to the source, so the
row builder joins launches and kernels as on a GPU. CUPTI's stream-id and device lookups are
stand-in functions (they need a driver).

Two mixes of launches:
- `h200`: every launch of the seven traces in tests/data/h200 (the parameter layouts and bytes
  their kernels were launched with: 1 to 11 parameters, 8 to 60 bytes), through cuLaunchKernel
  with `kernelParams`, as CuPy launches them, repeated to `--launches`;
- `serving`: 32 kernels with 10 to 20 parameters each (pointers, ints, now and then a struct
  passed by value: 28 to 200 bytes), in a seeded random order, through CUDA 13's runtime entry
  `__cudaLaunchKernel` with the driver's cuLaunchKernel inside it (four callbacks a launch).

Paths, each a fresh collection of `--launches` launches, alternating round by round so that they
share the machine's load (after one untimed short collection each):
- `recording`: this tree's natural mode (`Collector(ring=None)`, the default);
- `decoding`: this tree with `ring=False`: the callback decodes the launch into `LaunchArgs` and
  adds it to the row builder under the collector's lock (what natural mode did before);
- `decoding@REV`: collect/collector.py and collect/launch_hook.py as they were at git revision
  REV (default: the revision before the recording path), loaded from git into temporary modules.

Per launch: the host time from its first callback's enter to its last callback's exit
(`callback_us`: median, p90, p99, mean), and, for the recording path, the CPU time `take` spent
turning its slots into LaunchArgs off the callback (`decode_us_per_launch`); per collection, wall
and process CPU time (all threads: the stand-in source's too) from start to the trace written,
per launch (`run_us_per_launch`, `cpu_us_per_launch`). Every round checks that the paths wrote
the same launches table (its columns but the kernels' times). `wrapper_only_us`: the median
per launch of the same calls through cupti-python's wrapper into a Python function that does
nothing (what any Python CUPTI callback pays before its first line).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import glob
import importlib.util
import json
import os
import platform
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))   # the CUPTI stand-ins

import collect_standin as S  # noqa: E402  (after the path)

from pagecast import trace as T  # noqa: E402
from pagecast.collect import convert as C  # noqa: E402
from pagecast.collect import launch_hook as lh  # noqa: E402
from pagecast.collect import managed as M  # noqa: E402
from pagecast.collect.collector import Collector  # noqa: E402

DEFAULT_BASELINE = "be8dda6"   # the last revision whose natural mode decoded in the callback


# ---- the launches ------------------------------------------------------------------------------

class Kernel:
    def __init__(self, name: str, func: int, offsets: tuple, sizes: tuple) -> None:
        self.name, self.func, self.offsets, self.sizes = name, func, tuple(offsets), tuple(sizes)


def h200_launches(n: int) -> tuple[list[Kernel], list[tuple[Kernel, bytes, tuple]]]:
    kernels: dict[tuple, Kernel] = {}
    seq = []
    for d in sorted(glob.glob(str(ROOT / "tests/data/h200/*.pctrace"))):
        t = pq.read_table(Path(d) / T.LAUNCHES, columns=[T.KERNEL, T.PARAM_OFFSETS, T.PARAM_SIZES, T.PARAM_DATA,
                                                        T.GRID_X, T.BLOCK_X])
        for k, o, s, data, gx, bx in zip(*[t.column(i).to_pylist() for i in range(t.num_columns)]):
            key = (Path(d).name, k, tuple(o), tuple(s))
            if key not in kernels:
                kernels[key] = Kernel(k, 0x10_0000 + 0x100 * len(kernels), o, s)
            seq.append((kernels[key], bytes(data), (gx, bx)))
    return list(kernels.values()), [seq[i % len(seq)] for i in range(n)]


def serving_launches(n: int, seed: int = 7) -> tuple[list[Kernel], list[tuple[Kernel, bytes, tuple]]]:
    rnd = random.Random(seed)
    kernels = []
    for k in range(32):
        sizes = []
        for _ in range(rnd.randint(10, 20)):
            r = rnd.random()
            sizes.append(8 if r < 0.6 else 4 if r < 0.92 else rnd.choice([16, 32, 64]))
        offsets, at = [], 0
        for s in sizes:
            a = min(s, 8)
            at = -(-at // a) * a
            offsets.append(at)
            at += s
        kernels.append(Kernel(f"_Z{k}serving_kernel", 0x20_0000 + 0x100 * k, offsets, sizes))
    weights = [rnd.random() ** 2 for _ in kernels]
    seq = []
    for _ in range(n):
        k = rnd.choices(kernels, weights)[0]
        data = bytearray(max(o + s for o, s in zip(k.offsets, k.sizes)))
        for o, s in zip(k.offsets, k.sizes):
            data[o:o + s] = rnd.getrandbits(8 * s).to_bytes(s, "little")
        seq.append((k, bytes(data), (rnd.randint(1, 4096), rnd.choice([128, 256]))))
    return kernels, seq


# ---- CUPTI's side: callback data through cupti-python's own wrapper ------------------------------

def cupti_wrapper():
    """cupti-python's C callback wrapper and its dict of Python callbacks, or None (then the
    callback gets a plain object with the same attributes)."""
    try:
        import cupti.callback_wrappers as cw
        import cupti.globals as cg
        get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
        get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        get_name = ctypes.pythonapi.PyCapsule_GetName
        get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]

        def ptr(mod, name):
            cap = mod.__pyx_capi__[name]
            return get_ptr(cap, get_name(cap))

        fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)(
            ptr(cw, "callbackFuncWrapper"))
        callbacks = ctypes.cast(ctypes.c_void_p.from_address(ptr(cg, "pythonCallbacks")).value,
                                ctypes.py_object).value
        assert isinstance(callbacks, dict)
        return fn, callbacks
    except Exception:  # noqa: BLE001 - internals of one cupti-python version
        return None


def _struct(dtype_name: str, **fields):
    from cupti import cupti

    dt = getattr(cupti, dtype_name)
    rec = np.zeros(1, dtype=dt)
    for k, v in fields.items():
        if isinstance(v, tuple):
            rec[k] = np.frombuffer(struct.pack("<3I", *v), dtype=dt.fields[k][0])
        else:
            rec[k] = v
    return rec


class Played:
    """One launch prepared before the clock starts: its parameter memory, structs and callback data."""

    KERNEL_HANDLE = 0x800_0000   # the CUkernel a runtime launch names is KERNEL_HANDLE + the CUfunction

    def __init__(self, k: Kernel, data: bytes, cfg: tuple, corr: int, api: str, wrapped: bool) -> None:
        from cupti import cupti

        self.k, self.corr = k, corr
        self.bufs = [ctypes.create_string_buffer(data[o:o + s], s) for o, s in zip(k.offsets, k.sizes)]
        self.arr = (ctypes.c_void_p * max(1, len(self.bufs)))(*[ctypes.addressof(b) for b in self.bufs])
        kp = ctypes.addressof(self.arr)
        gx, bx = cfg
        drv = _struct("cu_launch_kernel_params_dtype", f=k.func, grid_dim_x=gx, grid_dim_y=1, grid_dim_z=1,
                      block_dim_x=bx, block_dim_y=1, block_dim_z=1, shared_mem_bytes=0, h_stream=0x77,
                      kernel_params=kp)
        self.recs = [drv]
        if api == "driver":
            calls = [(lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, lh.API_ENTER, corr, drv),
                     (lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, lh.API_EXIT, corr, drv)]
        else:   # CUDA 13's runtime entry with the driver's launch inside it
            rt = _struct("cuda_launch_kernel_v7000params_dtype", func=self.KERNEL_HANDLE + k.func,
                         grid_dim=(gx, 1, 1), block_dim=(bx, 1, 1), args=kp, shared_mem=0, stream=0x77)
            self.recs.append(rt)
            calls = [(lh.DOMAIN_RUNTIME, lh.CB___cudaLaunchKernel, lh.API_ENTER, corr, rt),
                     (lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, lh.API_ENTER, corr + 1, drv),
                     (lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, lh.API_EXIT, corr + 1, drv),
                     (lh.DOMAIN_RUNTIME, lh.CB___cudaLaunchKernel, lh.API_EXIT, corr, rt)]
        self.calls = []
        for domain, cbid, site, c, rec in calls:
            if wrapped:
                cbd = cupti.CallbackData()
                cbd.callback_site, cbd.correlation_id = site, c
                cbd.function_params, cbd.context = rec.ctypes.data, 0x5000
                self.calls.append((domain, cbid, cbd, cbd.ptr))
            else:
                cbd = types.SimpleNamespace(callback_site=site, correlation_id=c, function_params=rec.ctypes.data,
                                            symbol_name=k.name, context=0x5000)
                self.calls.append((domain, cbid, cbd, None))


def prepare(seq, api: str, wrapped: bool) -> list[Played]:
    return [Played(k, data, cfg, 1000 + 2 * i, api, wrapped) for i, (k, data, cfg) in enumerate(seq)]


# ---- the collector and the paths -------------------------------------------------------------------

def load_baseline(rev: str):
    """(Collector, LaunchHook) of collect/collector.py and collect/launch_hook.py at `rev`."""
    mods = {}
    tmp = Path(tempfile.mkdtemp(prefix="pagecast-bench-"))
    for name in ("launch_hook", "collector"):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:collect/{name}.py"], check=True,
                             capture_output=True, text=True).stdout
        if name == "collector":   # its hook: the baseline's
            src = src.replace("from .launch_hook import", f"from .bench_{rev}_launch_hook import")
        path = tmp / f"bench_{rev}_{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"pagecast.collect.bench_{rev}_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods["collector"].Collector, mods["launch_hook"].LaunchHook


def make_collector(out: Path, kernels: list[Kernel], path: str, baseline):
    by_func = {k.func: k for k in kernels}
    by_func.update({Played.KERNEL_HANDLE + k.func: k for k in kernels})
    info = lh.ParamInfo(layout_fn=lambda h: (by_func[h].offsets, by_func[h].sizes),
                        name_fn=lambda h: by_func[h].name, symbol_fn=lambda h: h)
    source = S.StandInSource(interval_s=0.05)
    device = S.StandInDevice()
    manifest = T.new_manifest(mode="natural", source="cupti", workload={"name": "bench", "argv": ["bench"]})
    clock = time.monotonic_ns
    kw = dict(param_info=info, clock=clock, stream_id_fn=lambda ctx, s, ptsz: 7, device_fn=lambda ctx: 0)
    common = dict(mode="natural", source=source, device=device, budget=M.ManagedBudget(None),
                  part_seconds=2.0, tick_s=0.2, manifest=manifest, install_signals=False)
    if path.startswith("decoding@"):
        coll_cls, hook_cls = baseline
        hook = type("StandInBaselineHook", (hook_cls,), {"start": lambda self: self, "stop": lambda self: None})
        return coll_cls(out, hook_cls=hook, hook_kwargs=kw, **common), source
    return Collector(out, hook_cls=S.StandInHook, hook_kwargs=kw, ring=None if path == "recording" else False,
                     **common), source


def run_path(out: Path, kernels, played: list[Played], path: str, baseline, wrapper) -> dict:
    c, source = make_collector(out, kernels, path, baseline)
    hook = c.hook
    times = np.zeros(len(played), np.int64)
    saved = dict(wrapper[1]) if wrapper else None

    def workload():
        if wrapper:
            wrapper[1]["callbackFunc"] = hook._callback   # what cupti.subscribe(hook._callback, None) stores
            fn = wrapper[0]
        cb = hook._callback
        userdata = id(None)   # the userdata pointer subscribe was given (None), as CUPTI hands it back
        t = 10_000
        clock = time.perf_counter_ns
        for i, p in enumerate(played):
            if wrapper:
                t0 = clock()
                for domain, cbid, _, ptr in p.calls:
                    fn(userdata, domain, cbid, ptr)
                times[i] = clock() - t0
            else:
                t0 = clock()
                for domain, cbid, cbd, _ in p.calls:
                    cb(None, domain, cbid, cbd)
                times[i] = clock() - t0
            # the kernel ran: its record (and a fault) reach CUPTI's buffers
            source.emit(S.kernel_record(name=p.k.name, start=t, end=t + 500, grid=(1, 1, 1), block=(1, 1, 1),
                                        smem=0, corr=p.corr),
                        S.um_record(counter_kind=C.UM_GPU_PAGE_FAULT, value=1, start=t + 10, end=0,
                                    address=0x7F00_0000_0000 + 4096 * (i % 1000), flags=1))
            t += 1000

    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        code = c.run(workload)
    finally:
        if wrapper:
            wrapper[1].clear()
            wrapper[1].update(saved)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert code == 0 and hook.errors == 0, (code, hook.errors, hook.last_error)
    us = times / 1e3
    ring = getattr(c, "ring", None)
    return {"callback_us": float(np.median(us)), "p90_us": float(np.percentile(us, 90)),
            "p99_us": float(np.percentile(us, 99)), "mean_us": float(us.mean()),
            "run_us_per_launch": wall / len(played) * 1e6, "cpu_us_per_launch": cpu / len(played) * 1e6,
            **({"decode_us_per_launch": ring.info()["decode_us_per_launch"], "spilled": ring.spilled}
               if ring is not None else {})}


def wrapper_only(played: list[Played], wrapper) -> float:
    fn, callbacks = wrapper
    saved = dict(callbacks)
    callbacks["callbackFunc"] = lambda userdata, domain, cbid, cbdata: None
    userdata, clock = id(None), time.perf_counter_ns
    times = np.zeros(len(played), np.int64)
    try:
        for i, p in enumerate(played):
            t0 = clock()
            for domain, cbid, _, ptr in p.calls:
                fn(userdata, domain, cbid, ptr)
            times[i] = clock() - t0
    finally:
        callbacks.clear()
        callbacks.update(saved)
    return float(np.median(times)) / 1e3


def launches_table(out: Path):
    t = S.read_quiet(out)
    return t.launches.drop_columns([T.START_NS, T.END_NS]).to_pylist(), t.n_launches


def bench(args) -> dict:
    from pagecast.collect.param_gather import warm

    warm()   # LaunchHook.start does this; the stand-in hook's start does not
    wrapper = cupti_wrapper()
    paths = ["recording", "decoding"]
    baseline = None
    if args.baseline_rev:
        baseline = load_baseline(args.baseline_rev)
        paths.append(f"decoding@{args.baseline_rev}")
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_avg_1m": os.getloadavg()[0]},
              "launches": args.launches, "rounds": args.rounds,
              "callback_data": "cupti-python's C callback wrapper" if wrapper else "plain objects", "mixes": {}}
    for mix, (maker, api) in {"h200": (h200_launches, "driver"), "serving": (serving_launches, "runtime")}.items():
        kernels, seq = maker(args.launches)
        played = prepare(seq, api, wrapper is not None)
        # The prepared launches stand in for memory the driver holds in C: keep Python's cyclic
        # collector from walking them (it runs on whichever thread allocates, and would be timed there).
        gc.collect()
        gc.freeze()
        per_path: dict[str, list[dict]] = {p: [] for p in paths}
        same = True
        for p in paths:   # once each, untimed: the process's first Parquet write, first LaunchArgs, ...
            with tempfile.TemporaryDirectory() as d:
                run_path(Path(d) / "w.pctrace", kernels, played[:300], p, baseline, wrapper)
        for r in range(args.rounds):
            tables = {}
            for p in (paths if r % 2 == 0 else paths[::-1]):
                with tempfile.TemporaryDirectory() as d:
                    out = Path(d) / "t.pctrace"
                    per_path[p].append(run_path(out, kernels, played, p, baseline, wrapper))
                    tables[p] = launches_table(out)
            rows = [tables[p] for p in paths]
            same = same and all(x == rows[0] for x in rows) and rows[0][1] == len(played)
        entry = {"kernels": len(kernels), "params_per_launch": round(statistics.mean(len(k.sizes) for k, _, _ in seq), 1),
                 "param_bytes_per_launch": round(statistics.mean(len(d) for _, d, _ in seq), 1),
                 "api": api, "same_launches_table": same}
        for p, runs in per_path.items():
            entry[p] = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
            entry[p]["rounds_callback_us"] = [round(r["callback_us"], 2) for r in runs]
        if wrapper:   # cupti-python's wrapper alone: the same calls into a Python function that does nothing
            entry["wrapper_only_us"] = round(wrapper_only(played, wrapper), 2)
        base = entry["decoding"]["callback_us"]
        entry["speedup_median"] = round(base / entry["recording"]["callback_us"], 2)
        result["mixes"][mix] = entry
        print(json.dumps({mix: entry}), flush=True)
    result["machine"]["load_avg_1m_end"] = os.getloadavg()[0]
    return result


def markdown(res: dict) -> str:
    paths = [p for p in next(iter(res["mixes"].values())) if p.startswith(("recording", "decoding"))]
    lines = ["| mix | path | callback us: median | p90 | p99 | mean | decoded off the callback, CPU us |"
             " whole collection: wall us / CPU us a launch |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for mix, e in res["mixes"].items():
        for p in paths:
            x = e[p]
            lines.append(f"| {mix} | {p} | {x['callback_us']:.1f} | {x['p90_us']:.1f} | {x['p99_us']:.1f} | "
                         f"{x['mean_us']:.1f} | {x.get('decode_us_per_launch', '-')} | {x['run_us_per_launch']:.0f} / "
                         f"{x['cpu_us_per_launch']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-rev", default=DEFAULT_BASELINE, help="git revision of the decoding path to load "
                    "beside this tree's ('' to skip)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args(argv)
    res = bench(args)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    print(md)
    if args.markdown:
        args.markdown.write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
