"""`pagecast calibrate`: measure this GPU's fault cost and bulk bandwidth, fit a cost profile.

Two halves:
- `measure(cuda, monitor)` runs the experiments on the GPU through
  driver.py's `CudaIface` (and nothing else): it returns plain numbers (`Measurements`);
- `fit_profile(measurements)` turns those numbers into a `CostProfile`
  (pure: least-squares lines, tested on the CPU with synthetic measurements).

Experiments (all sized from `cuMemGetInfo` free memory, never more than a
quarter of it, so the GPU is never oversubscribed):
- cost per fault: a kernel touching N pages, one word per 64 KiB (the driver's
  big page, so one fault each), on managed memory that was moved to the host
  first, for several N; the slope of kernel time against the GPU page faults
  CUPTI counted (against N when the counters are unavailable). The driver's tree
  prefetcher may bring in the rest of a 2 MiB block once half of it is resident;
  counting faults rather than N keeps the slope per fault. This is the whole
  per-fault cost a profile without `block_service_s` charges.
- the fault path split three ways (the driver services a batch of faults once,
  then each 2 MiB VA block of it once, then each fault's pages; docs/cost-model.md):
  * page runs: N big pages (64 KiB apart) of ONE 2 MiB block, N = 1, 2, 4, 8, 16
    (at most half the block, so the tree prefetcher adds nothing); the slope of
    time against faults is the marginal cost of one more fault in a block being
    serviced (`fault_time_s`);
  * block runs: one word in each of N different 2 MiB blocks; the slope against N
    is one block's service plus its one fault (`block_service_s` + `fault_time_s`);
  * the lone fault (the page run with N = 1) less the launch overhead is one batch,
    one block and one fault; what is left after the two slopes is the per-batch
    cost (`batch_overhead_s`). A block run's faults may reach the driver in more
    than one batch; that share of batch cost lands in the block slope (documented).
- bulk prefetch bandwidth, each way: `cuMemPrefetchAsync` of several sizes (64 MiB to 1 GiB);
  bandwidth is 1 / slope of time against bytes. The intercept of those lines is NOT a per-call
  cost (a 164 us "per call" read that way on an H200 is at odds with runs making a call every
  25 us): it is what the fit leaves at zero bytes of transfers thousands of times larger;
- the per-call cost at the sizes plans use: runs of k `cuMemPrefetchAsync` calls of 4 KiB,
  64 KiB, 2 MiB and 32 MiB each way (one range per 2 MiB block, so the driver merges none),
  fitted as time = fixed + k x per-call + bytes / bandwidth (`fit_calls`, weighted by 1/time so
  that the small runs weigh as much as the big ones); the batched calls of CUDA 13.0's driver
  (`cuMemPrefetchBatchAsync`, `cuMemDiscardBatchAsync`, `cuMemDiscardAndPrefetchBatchAsync`),
  where this driver has them, one call of n ranges, fitted as time = fixed + n x per-range +
  bytes / bandwidth;
- the host time of the GPU runner's launch callback (its `Engine.on_launch`, demand at an
  emulated capacity, on a launch that needs no call: the decision alone);
- the planned callback's host time by kind (`planned_callback_times`, given a planner: the
  simulator's oracle plan of a small trace, PROBE_WORKLOAD, carried out by the engine's planned
  path on managed buffers of the trace's sizes with this driver's calls, each callback timed by
  callback_timing.py as benchmarks/bench_child_callback.py times it): quiet launches
  (`host_quiet_s`), light ones (`host_wait_s`), and the others' base + per range
  (`host_base_s`, `host_call_s`);
- overlap: one buffer evicted to the host on one stream while another is
  populated on a second stream; `duplex` when that takes clearly less than
  the two one after the other (two copy engines), `pipelined_bandwidth` the
  combined bytes over the combined time.
- launch overhead: a one-thread kernel on resident memory; device bandwidth: a
  copy kernel between two resident buffers.

Long because each experiment and the fit that reads its numbers are kept side by side: the
measuring half and the fitting half share `Measurements`' fields one for one, and splitting them
would put every experiment's meaning in two files.
"""

from __future__ import annotations

import json
import statistics
import struct
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from pagecast import trace as T
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.datasets.registry import make_trace
from pagecast.errors import ProfileError
from pagecast.uvm import BIG_PAGE, VA_BLOCK

from ..costs import CostProfile, load_profile, profile_from_dict
from ..online.planned import PlannedCalls, schedule_from_plan
from ..online.relocate import Relocator
from .callback_timing import CallbackTimes, CountingCuda, fit_callbacks, time_callbacks, trace_launches
from .cuda_engine import Engine

FAULT_NS = (256, 1024, 2048, 4096)       # pages touched per fault run
PAGE_NS = (1, 2, 4, 8, 16)               # big pages of one 2 MiB block per page run (<= half the block)
BLOCK_NS = (8, 32, 64, 128)              # 2 MiB blocks touched once each per block run
REPEATS = 3
CALL_SIZES = (4096, 64 * 1024, 2 * 2**20, 32 * 2**20)   # cuMemPrefetchAsync sizes plans use
CALLS_PER_RUN = 32                       # calls per timed run (at most; a quarter of it too)
CALLBACK_LAUNCHES = 200                  # launches timed through the runner's callback
PROBE_WORKLOAD = ("jacobi2d", 0.01)      # the planned-callback probe's trace (84 launches, 12.8 MiB managed)
PROBE_RUNS = 10                          # runs of the planned probe over that trace (each a fresh engine)
DUPLEX_RATIO = 0.8                       # overlap when both together take < 80% of one after the other
MAX_FRACTION_OF_FREE = 0.25
SETTLE_QUIET_S = 0.02                    # fault counts read once two flushes this far apart agree ...
SETTLE_TIMEOUT_S = 2.0                   # ... or after this long (counted in Measurements.unsettled)


@dataclass
class Measurements:
    """What calibrate measured; every time in seconds, every size in bytes."""

    device: dict = field(default_factory=dict)
    fault_runs: list = field(default_factory=list)   # [touched pages, faults counted or None, seconds]
    page_runs: list = field(default_factory=list)    # [big pages of one block, faults counted or None, seconds]
    block_runs: list = field(default_factory=list)   # [blocks touched once each, faults counted or None, seconds]
    htod: list = field(default_factory=list)         # [bytes, seconds]
    dtoh: list = field(default_factory=list)         # [bytes, seconds]
    duplex: list | None = None                       # [htod bytes, dtoh bytes, seconds] both at once
    launch_s: list = field(default_factory=list)     # seconds of a one-thread kernel
    copy: list = field(default_factory=list)         # [bytes copied, seconds]
    prefetch_calls: list = field(default_factory=list)  # [htod|dtoh, bytes per call, calls, seconds]
    batch_calls: list = field(default_factory=list)     # [driver function, bytes per range, ranges, seconds]
    callback_s: list = field(default_factory=list)      # host seconds of the runner's launch callback
    planned_callbacks: list = field(default_factory=list)  # [host seconds, ranges, events] per planned callback
    planned_note: str | None = None                     # why the planned probe did not run, where it did not
    driver_prefetch: bool | None = None
    unsettled: int = 0                               # fault counts read before they stopped changing
    elapsed_s: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Measurements":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


# ---------------------------------------------------------------------------
# Fitting (pure)
# ---------------------------------------------------------------------------

def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares y = slope * x + intercept; returns (slope, intercept, r^2)."""
    n = len(xs)
    if n != len(ys) or n < 2:
        raise ProfileError(f"need at least two measurements to fit a line, got {n}")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ProfileError("all measurements were taken at the same size; cannot fit a slope")
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = my - slope * mx
    syy = sum((y - my) ** 2 for y in ys)
    r2 = 1.0 if syy == 0 else (sxy * sxy) / (sxx * syy)
    return slope, intercept, r2


def run_x(runs: Sequence[Sequence]) -> tuple[list[float], bool, str]:
    """The x to fit time against, from [touched, faults|None, seconds] rows: CUPTI's fault counts
    where every run has one and they vary, else what was touched; (xs, counted, what x is).

    Where CUPTI counted the same faults at every size (seen on an H200 with the driver's prefetcher
    on: it serves the rest), the counts say nothing of the cost; the sizes touched still do."""
    counted = all(r[1] is not None and r[1] > 0 for r in runs)
    what = "GPU page faults counted by CUPTI" if counted else "pages touched (no CUPTI counts)"
    if counted and len({int(r[1]) for r in runs}) == 1 and len({int(r[0]) for r in runs}) > 1:
        counted = False
        what = f"pages touched (CUPTI counted {int(runs[0][1])} faults at every size)"
    return [float(r[1] if counted else r[0]) for r in runs], counted, what


def fit_faults(runs: Sequence[Sequence]) -> tuple[float, float, float, str]:
    """(seconds per fault, intercept, r^2, what x was) from [touched, faults|None, seconds] rows."""
    if not runs:
        raise ProfileError("no fault measurements")
    xs, counted, x_is = run_x(runs)
    ys = [float(r[2]) for r in runs]
    slope, icpt, r2 = linear_fit(xs, ys)
    if not slope > 0:
        raise ProfileError(f"kernel time did not grow with the number of faults (slope {slope:.3g} s/fault);"
                           " demand paging may be off (is this memory really managed?)")
    return slope, icpt, r2, x_is


@dataclass(frozen=True)
class FaultSplit:
    """The fault path's three costs, in seconds (see the module doc)."""

    fault_s: float         # one more fault in a block being serviced
    block_s: float         # one more 2 MiB block serviced in a batch
    batch_s: float         # one more batch (the lone fault less one block and one fault)
    lone_s: float          # one lone fault: batch + block + fault
    page_r2: float
    block_r2: float
    counted: bool          # x was CUPTI's fault count (else pages or blocks touched)
    page_x: str = ""       # what x was in the page runs, and in the block runs (`run_x`)
    block_x: str = ""


def _runs_xy(runs: Sequence[Sequence], what: str) -> tuple[list[float], list[float], bool, str]:
    if not runs:
        raise ProfileError(f"no {what} measurements")
    xs, counted, x_is = run_x(runs)
    return xs, [float(r[2]) for r in runs], counted, x_is


def fit_fault_split(page_runs: Sequence[Sequence], block_runs: Sequence[Sequence], launch_s: float) -> FaultSplit:
    """Per-fault, per-block and per-batch costs from page runs, block runs and the launch overhead."""
    xs, ys, pc, page_x = _runs_xy(page_runs, "page-run")
    fault_s, _icpt, page_r2 = linear_fit(xs, ys)
    bx, by, bc, block_x = _runs_xy(block_runs, "block-run")
    per_block, _bicpt, block_r2 = linear_fit(bx, by)
    if not per_block > 0:
        raise ProfileError(f"kernel time did not grow with the blocks touched (slope {per_block:.3g} s/block);"
                           " demand paging may be off (is this memory really managed?)")
    ones = [float(r[2]) for r in page_runs if int(r[0]) == 1]
    if not ones:
        raise ProfileError("no lone-fault measurement (a page run of one page)")
    lone = max(0.0, statistics.median(ones) - launch_s)
    fault_s = max(0.0, fault_s)
    block_s = max(0.0, per_block - fault_s)
    batch_s = max(0.0, lone - block_s - fault_s)
    return FaultSplit(fault_s, block_s, batch_s, lone, page_r2, block_r2, pc and bc, page_x,
                      block_x.replace("pages touched", "blocks touched"))


def fit_bandwidth(points: Sequence[Sequence], what: str) -> tuple[float, float, float]:
    """(bytes per second, latency seconds, r^2) from [bytes, seconds] rows."""
    pts = [(float(b), float(s)) for b, s in points if b > 0 and s > 0]
    if not pts:
        raise ProfileError(f"no {what} measurements")
    if len({b for b, _ in pts}) == 1:
        b = pts[0][0]
        s = statistics.median(p[1] for p in pts)
        return b / s, 0.0, 1.0
    slope, icpt, r2 = linear_fit([b for b, _ in pts], [s for _, s in pts])
    if not slope > 0:
        raise ProfileError(f"{what} time did not grow with the bytes moved (slope {slope:.3g} s/B)")
    return 1.0 / slope, max(0.0, icpt), r2


@dataclass(frozen=True)
class CallFit:
    """time = fixed + calls x per_call + bytes / bandwidth, fitted (`fit_calls`)."""

    per_call_s: float
    bandwidth: float
    fixed_s: float
    r2: float
    n: int


def fit_calls(rows: Sequence[Sequence]) -> CallFit:
    """Per-call cost and bandwidth from [bytes per call, calls, seconds] rows: least squares on
    time = fixed + calls x per_call + calls x bytes / bandwidth, each row weighted by 1 / its time
    (relative errors: a run of 32 x 4 KiB calls pins the per-call cost as a run of 32 x 32 MiB pins
    the bandwidth). `fixed` is what timing one run costs (the events), not part of a call."""
    pts = [(float(b), float(k), float(t)) for b, k, t in rows if k > 0 and t > 0]
    if len(pts) < 3:
        raise ProfileError(f"need at least three call measurements to fit a per-call cost, got {len(pts)}")
    a = np.array([[1.0, k, k * b] for b, k, _ in pts])
    y = np.array([t for _, _, t in pts])
    if np.linalg.matrix_rank(a) < 3:
        raise ProfileError("the call measurements do not vary both the calls and the bytes; cannot separate"
                           " a per-call cost from the bandwidth")
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    fixed, per_call, inv_bw = (float(c) for c in coef)
    if not inv_bw > 0:
        raise ProfileError(f"call time did not grow with the bytes moved ({inv_bw:.3g} s/B)")
    pred = a @ coef
    rel = (y - pred) / y
    r2 = 1.0 - float(np.sum(rel ** 2)) / max(float(np.sum(((y - y.mean()) / y) ** 2)), 1e-300)
    return CallFit(max(0.0, per_call), 1.0 / inv_bw, fixed, r2, len(pts))


def _per_call_by_size(rows: Sequence[Sequence]) -> str:
    """`4 KiB: 11.2 us, ...`: the median time per call at each size measured (for the source)."""
    by: dict[int, list[float]] = {}
    for b, k, t in rows:
        if k > 0:
            by.setdefault(int(b), []).append(float(t) / float(k))
    return ", ".join(f"{_size(b)}: {statistics.median(v) * 1e6:.1f} us" for b, v in sorted(by.items()))


def _size(b: int) -> str:
    return f"{b // 2**20} MiB" if b >= 2**20 else f"{b // 1024} KiB"


def fit_profile(m: Measurements, name: str = "calibrated", base: Any = None):
    """A CostProfile from measurements; fields not measured come from `base` (msched-rtx5080)."""
    base = load_profile(base or "msched-rtx5080")
    dev = m.device.get("name") or "this GPU"
    fault_s, fault_icpt, fault_r2, fault_x = fit_faults(m.fault_runs)
    h_bw, h_lat, h_r2 = fit_bandwidth(m.htod, "host-to-device prefetch")
    d_bw, d_lat, d_r2 = fit_bandwidth(m.dtoh, "device-to-host prefetch")
    latency = (h_lat + d_lat) / 2
    src: dict[str, Any] = dict(base.source)
    ns = sorted({int(r[0]) for r in m.fault_runs})
    src["fault_time_s"] = (f"calibrate on {dev}: slope of kernel time vs {fault_x}, touching one word per 64 KiB"
                           f" of host-resident managed memory, N = {ns} ({len(m.fault_runs)} runs, r^2 = {fault_r2:.3f})"
                           + (f"; {m.unsettled} fault count(s) still changing when read" if m.unsettled else ""))
    src["htod_bandwidth"] = f"calibrate on {dev}: 1/slope of cuMemPrefetchAsync time vs bytes, host to device (r^2 = {h_r2:.3f})"
    src["dtoh_bandwidth"] = f"calibrate on {dev}: 1/slope of cuMemPrefetchAsync time vs bytes, device to host (r^2 = {d_r2:.3f})"
    # the bulk lines' intercept is no per-call cost (the module doc): the per-call runs give it
    src["transfer_latency_s"] = (f"not measured on {dev}: {base.name}'s (the bulk lines' zero-byte intercept,"
                                 f" {latency * 1e6:.1f} us, is not a per-call cost)")
    latency = base.transfer_latency_s
    calls = {d: [r[1:] for r in m.prefetch_calls if r[0] == d] for d in ("htod", "dtoh")}
    fits = {}
    for d, rows in calls.items():
        if rows:
            try:
                fits[d] = fit_calls(rows)
            except ProfileError as e:
                src[f"{d}_calls"] = f"calibrate on {dev}: the per-call fit failed ({e})"
    if fits:
        latency = statistics.mean(f.per_call_s for f in fits.values())
        src["transfer_latency_s"] = (
            f"calibrate on {dev}: per cuMemPrefetchAsync call, fitted as time = fixed + calls x per-call +"
            f" bytes / bandwidth on runs of up to {CALLS_PER_RUN} calls at 4 KiB to 32 MiB, weighted by 1/time; "
            + "; ".join(f"{d}: {f.per_call_s * 1e6:.2f} us a call, {f.bandwidth / 1e9:.1f} GB/s, fixed"
                        f" {f.fixed_s * 1e6:.1f} us a run (r^2 = {f.r2:.3f}, {f.n} runs); time per call by size: "
                        f"{_per_call_by_size(calls[d])}" for d, f in fits.items()))
    batch = {}
    for fn in sorted({r[0] for r in m.batch_calls}):
        rows = [r[1:] for r in m.batch_calls if r[0] == fn]
        try:
            f = fit_calls(rows)   # here `calls` are the ranges of one call
            batch[fn] = f
            src[fn] = (f"calibrate on {dev}: one call of n ranges: {f.per_call_s * 1e6:.2f} us per range,"
                       f" {f.bandwidth / 1e9:.1f} GB/s, {f.fixed_s * 1e6:.1f} us per call with its timing"
                       f" (r^2 = {f.r2:.3f}, {f.n} runs)")
        except ProfileError as e:
            src[fn] = f"calibrate on {dev}: not fitted ({e})"
    host_launch = statistics.median(m.callback_s) if m.callback_s else base.host_launch_s
    if m.callback_s:
        src["host_launch_s"] = (f"calibrate on {dev}: median host time of the GPU runner's launch callback"
                                f" (demand at an emulated capacity, no call needed) over {len(m.callback_s)} launches")
    host = planned_host(m, dev, base, src)
    src["batch_overhead_s"] = "0: calibrate's per-fault slope already includes the batch overhead"

    if m.duplex:
        hb, db, both = (float(x) for x in m.duplex)
        serial = hb / h_bw + db / d_bw + 2 * latency
        duplex = both < DUPLEX_RATIO * serial
        pipelined = (hb + db) / both
        src["duplex"] = (f"calibrate on {dev}: eviction and population on two streams took {both * 1e3:.2f} ms"
                         f" vs {serial * 1e3:.2f} ms one after the other ({'overlap' if duplex else 'no overlap'})")
        src["pipelined_bandwidth"] = f"calibrate on {dev}: (htod + dtoh bytes) / time with both directions at once"
    else:
        duplex, pipelined = base.duplex, base.pipelined_bandwidth
    if not duplex:
        pipelined = max(pipelined, 1.0)
    launch = statistics.median(m.launch_s) if m.launch_s else base.launch_overhead_s
    if m.launch_s:
        src["launch_overhead_s"] = f"calibrate on {dev}: median time of a one-thread kernel on resident memory"
    if m.copy:
        # the copy kernel's time less one launch overhead (never below half the time)
        bw = statistics.median(2.0 * float(b) / max(float(s) - launch, 0.5 * float(s)) for b, s in m.copy if s > 0)
        src["device_bandwidth"] = (f"calibrate on {dev}: copy kernel between resident buffers,"
                                   " read + write bytes / (time - launch overhead)")
    else:
        bw = base.device_bandwidth
    src["measurements"] = json.dumps(m.to_dict(), default=str)
    desc = f"calibrated on {dev}" + (f" (driver CUDA {m.device['driver_cuda_version']})"
                                     if m.device.get("driver_cuda_version") else "")
    if m.driver_prefetch is not None:
        desc += f", driver prefetcher {'on' if m.driver_prefetch else 'off'}"
    d = base.to_dict()
    d.update(name=name, description=desc, fault_time_s=fault_s, batch_overhead_s=0.0,
             htod_bandwidth=h_bw, dtoh_bandwidth=d_bw, duplex=bool(duplex), pipelined_bandwidth=pipelined,
             transfer_latency_s=latency, launch_overhead_s=max(0.0, launch), device_bandwidth=bw,
             host_launch_s=host_launch, charges=True, source=src, **host)
    if m.page_runs and m.block_runs and _HAS_BLOCK_FIELD:
        sp = fit_fault_split(m.page_runs, m.block_runs, launch if m.launch_s else 0.0)
        pn = sorted({int(r[0]) for r in m.page_runs})
        bn = sorted({int(r[0]) for r in m.block_runs})
        d.update(fault_time_s=sp.fault_s, block_service_s=sp.block_s, batch_overhead_s=sp.batch_s)
        src["fault_time_s"] = (f"calibrate on {dev}: slope of kernel time vs {sp.page_x}, touching N = {pn}"
                               f" big pages of one 2 MiB block of host-resident managed memory"
                               f" (r^2 = {sp.page_r2:.3f})")
        src["block_service_s"] = (f"calibrate on {dev}: slope of kernel time vs {sp.block_x} touching one word"
                                  f" in each of N = {bn} 2 MiB blocks (r^2 = {sp.block_r2:.3f}), less fault_time_s")
        src["batch_overhead_s"] = (f"calibrate on {dev}: one lone fault ({sp.lone_s * 1e6:.2f} us: a one-page kernel"
                                   " less the launch overhead) less block_service_s and fault_time_s")
        d["source"] = src
    prof = profile_from_dict(d, f"calibrated profile {name}")
    assert isinstance(prof, CostProfile)
    return prof


def planned_host(m: Measurements, dev: str, base, src: dict) -> dict:
    """host_quiet_s, host_wait_s, host_base_s and host_call_s from the planned probe's callbacks
    (`fit_callbacks`: medians by kind, the medians' line for the launches with calls), each with its
    source; those the probe did not measure (or fitted at or below 0) are left to `base`, and say why."""
    if not m.planned_callbacks:
        for k in ("host_quiet_s", "host_wait_s", "host_base_s", "host_call_s"):
            src[k] = f"not measured on {dev}: {m.planned_note or 'the planned probe did not run'}; {base.name}'s"
        return {}
    s, c, e = (list(x) for x in zip(*m.planned_callbacks))
    f = fit_callbacks(CallbackTimes(s, c, e))
    how = (f"calibrate on {dev}: the planned runner's callback (cuda_engine.py's planned path carrying out the"
           f" simulator's oracle plan of {PROBE_WORKLOAD[0]} at scale {PROBE_WORKLOAD[1]}, half its managed memory,"
           f" with this driver's calls; {len(s)} callbacks), ")
    got = {"host_quiet_s": (f.quiet_s, f"median of the {f.quiet_n} launches with nothing due"),
           "host_wait_s": (f.wait_s, f"median of the {f.wait_n} launches with a stream wait and no call"),
           "host_base_s": (f.median_base_s, f"base of the {f.calls_n} launches with calls ({f.calls_mean or 0:.2f}"
                                              " ranges each on average): the line through the medians per range"
                                              " count, weighted by their launches"),
           "host_call_s": (f.median_per_call_s, "per range of that line")}
    out = {}
    for k, (v, what) in got.items():
        if v is not None and v > 0:
            out[k] = float(v)
            src[k] = how + what
        else:
            kept = f"{base.name}'s (0: the runner takes host_launch_s)"
            src[k] = how + f"{what}: {'none' if v is None else f'{v * 1e6:.2f} us'}, not > 0; {kept} kept"
    return out


# Whether this simulator's cost profile charges a per-block service (the driver model's field).
_HAS_BLOCK_FIELD = "block_service_s" in CostProfile.__dataclass_fields__


# ---------------------------------------------------------------------------
# Measuring (needs a GPU through driver.py)
# ---------------------------------------------------------------------------

def driver_prefetch_enabled() -> bool | None:
    """nvidia-uvm's uvm_perf_prefetch_enable module parameter, where readable."""
    p = Path("/sys/module/nvidia_uvm/parameters/uvm_perf_prefetch_enable")
    try:
        return p.read_text().strip() not in ("0", "N", "n")
    except OSError:
        return None


def plan_sizes(free: int, fault_ns: Sequence[int] = FAULT_NS) -> dict:
    """Buffer sizes for the experiments, within a quarter of the free memory (pure)."""
    budget = int(free * MAX_FRACTION_OF_FREE)
    if budget < 64 * 2**20:
        raise ProfileError(f"only {free} bytes of GPU memory are free; calibrate needs at least {4 * 64} MiB free")
    ns = [n for n in fault_ns if n * BIG_PAGE <= budget // 2] or [max(2, budget // 2 // BIG_PAGE // 4)]
    if len(ns) < 2:
        ns = [max(1, ns[0] // 4), ns[0]]
    # two bulk buffers (duplex needs both at once); each at most 1 GiB
    bulk = min(2**30, budget // 4)
    bulk -= bulk % (2 * 2**20)
    fault_bytes = max(ns) * BIG_PAGE
    # block runs touch one word per 2 MiB block of the same buffer
    blocks = fault_bytes // VA_BLOCK
    bns = [n for n in BLOCK_NS if n <= blocks] or [blocks]
    if len(bns) < 2:
        bns = sorted({max(1, bns[0] // 4), bns[0]})
    return {"fault_ns": ns, "fault_bytes": fault_bytes, "bulk_bytes": bulk,
            "bulk_sizes": sorted({bulk // 16, bulk // 4, bulk}), "page_ns": list(PAGE_NS), "block_ns": bns}


def settled_faults(monitor, quiet_s: float | None = None, timeout_s: float | None = None,
                   sleep=time.sleep, clock=time.monotonic) -> tuple[int, bool]:
    """The monitor's fault count once every record has arrived: (faults, settled).

    Call it with the GPU idle (after a synchronize). CUPTI delivers unified-memory records in
    buffers, some after the kernel has ended, so one flush right after it can miss some; this
    flushes (forced: with the GPU idle every record is complete) until two flushes `quiet_s`
    apart agree, or `timeout_s` has passed (settled = False).
    """
    quiet_s = SETTLE_QUIET_S if quiet_s is None else quiet_s
    timeout_s = SETTLE_TIMEOUT_S if timeout_s is None else timeout_s
    end = clock() + timeout_s
    last = monitor.poll(force=True).faults
    while True:
        sleep(quiet_s)
        now = monitor.poll(force=True).faults
        if now == last:
            return now, True
        last = now
        if clock() >= end:
            return now, False


def measure(cuda, monitor=None, *, repeats: int = REPEATS, progress=None, start_monitor: bool = True,
            plan_for: Planner | None = None) -> Measurements:
    """Run the calibration experiments; never allocates more than a quarter of the free memory.

    `plan_for` (trace, capacity) -> plan: the planner the planned-callback probe carries out
    (`planned_callback_times`; the calibrate command passes the simulator's oracle planner, which
    this layer may not import); None: that probe is left out (`Measurements.planned_note`).

    `monitor` (a UvmMonitor, or None to fit against pages touched) is started
    here unless `start_monitor` is false (the caller started it before the
    CUDA context existed); it is stopped here either way.
    """
    t_start = time.perf_counter()
    m = Measurements(device=cuda.device_info(), driver_prefetch=driver_prefetch_enabled())
    free, _total = cuda.mem_info()
    sz = plan_sizes(free)
    stream = cuda.new_stream()
    stream2 = cuda.new_stream()
    ev0, ev1 = cuda.new_event(timing=True), cuda.new_event(timing=True)
    step = progress.advance if progress is not None else (lambda n=1: None)

    def timed(fn) -> float:
        cuda.record_event(ev0, stream)
        fn()
        cuda.record_event(ev1, stream)
        return cuda.event_elapsed_s(ev0, ev1)

    if monitor is not None and start_monitor:
        monitor.start(keep_records=False)
    bufs: list[int] = []
    try:
        # -- the planned callback's host time by kind (its buffers freed before the rest) ----
        if plan_for is None:
            m.planned_note = "no planner given"
        else:
            got = planned_callback_times(cuda, plan_for, int(free * MAX_FRACTION_OF_FREE))
            if isinstance(got, str):
                m.planned_note = got
            else:
                m.planned_callbacks = [list(r) for r in zip(got.seconds, got.calls, got.events)]
        step()
        # -- cost per fault ---------------------------------------------------
        fb = cuda.alloc_managed(sz["fault_bytes"])
        bufs.append(fb)
        cuda.prefetch_to_host(fb, sz["fault_bytes"], stream)
        cuda.synchronize()
        cuda.launch_touch(fb, 1, BIG_PAGE, stream)   # JIT-compile and load the module outside the timing
        cuda.synchronize()
        for _ in range(repeats):
            for n in sz["fault_ns"]:
                cuda.prefetch_to_host(fb, sz["fault_bytes"], stream)
                cuda.synchronize()
                faults = None
                if monitor is not None:   # the earlier runs' records all in before counting this one's
                    before, ok = settled_faults(monitor)
                    m.unsettled += not ok
                s = timed(lambda: cuda.launch_touch(fb, n, BIG_PAGE, stream))
                if monitor is not None:
                    cuda.synchronize()
                    after, ok = settled_faults(monitor)
                    m.unsettled += not ok
                    faults = after - before
                m.fault_runs.append([n, faults, s])
                step()
        # -- the fault path split: pages of one block, one page of many blocks --------
        for _ in range(repeats):
            for kind, ns, stride in (("page", sz["page_ns"], BIG_PAGE), ("block", sz["block_ns"], VA_BLOCK)):
                for n in ns:
                    cuda.prefetch_to_host(fb, sz["fault_bytes"], stream)
                    cuda.synchronize()
                    before = monitor.poll().faults if monitor is not None else None
                    s = timed(lambda: cuda.launch_touch(fb, n, stride, stream))
                    faults = (monitor.poll().faults - before) if monitor is not None else None
                    (m.page_runs if kind == "page" else m.block_runs).append([n, faults, s])
            step()
        # -- launch overhead on resident memory ---------------------------------
        cuda.prefetch_to_gpu(fb, BIG_PAGE, stream)
        cuda.synchronize()
        for _ in range(10):
            m.launch_s.append(timed(lambda: cuda.launch_touch(fb, 1, BIG_PAGE, stream)))
        step()
        # -- bulk bandwidth each way ----------------------------------------------
        bulk = sz["bulk_bytes"]
        a = cuda.alloc_managed(bulk)
        bufs.append(a)
        b = cuda.alloc_managed(bulk)
        bufs.append(b)
        for buf in (a, b):
            cuda.prefetch_to_host(buf, bulk, stream)
        cuda.synchronize()
        for _ in range(repeats):
            for size in sz["bulk_sizes"]:
                cuda.prefetch_to_host(a, bulk, stream)
                cuda.synchronize()
                m.htod.append([size, timed(lambda: cuda.prefetch_to_gpu(a, size, stream))])
                m.dtoh.append([size, timed(lambda: cuda.prefetch_to_host(a, size, stream))])
            step()
        # -- per-call cost at the sizes plans use (one range per 2 MiB block) -------
        for size in CALL_SIZES:
            stride = max(size, VA_BLOCK)
            kmax = min(CALLS_PER_RUN, bulk // stride)
            for k in sorted({max(1, kmax // 4), kmax}):
                if k < 1:
                    continue
                ranges = [(a + i * stride, size) for i in range(k)]
                for _ in range(repeats):
                    cuda.prefetch_to_host(a, bulk, stream)
                    cuda.synchronize()
                    m.prefetch_calls.append(["htod", size, k, timed(lambda: [cuda.prefetch_to_gpu(x, n, stream)
                                                                           for x, n in ranges])])
                    m.prefetch_calls.append(["dtoh", size, k, timed(lambda: [cuda.prefetch_to_host(x, n, stream)
                                                                           for x, n in ranges])])
        step()
        # -- the batched calls, where this driver has them -------------------------
        have = cuda.batch_calls() if hasattr(cuda, "batch_calls") else frozenset()
        for size in CALL_SIZES:
            stride = max(size, VA_BLOCK)
            kmax = min(CALLS_PER_RUN, bulk // stride)
            for k in sorted({max(1, kmax // 4), kmax}):
                ranges = [(a + i * stride, size) for i in range(k)]
                for _ in range(repeats):
                    if "cuMemPrefetchBatchAsync" in have:
                        cuda.prefetch_to_host(a, bulk, stream)
                        cuda.synchronize()
                        m.batch_calls.append(["cuMemPrefetchBatchAsync", size, k,
                                              timed(lambda: cuda.prefetch_batch(ranges, True, stream))])
                    if "cuMemDiscardBatchAsync" in have:   # resident data, declared dead: nothing copied
                        cuda.prefetch_to_gpu(a, bulk, stream)
                        cuda.synchronize()
                        m.batch_calls.append(["cuMemDiscardBatchAsync", size, k,
                                              timed(lambda: cuda.discard_batch(ranges, stream))])
                    if "cuMemDiscardAndPrefetchBatchAsync" in have:
                        cuda.prefetch_to_host(a, bulk, stream)
                        cuda.synchronize()
                        m.batch_calls.append(["cuMemDiscardAndPrefetchBatchAsync", size, k,
                                              timed(lambda: cuda.discard_and_prefetch_batch(ranges, True, stream))])
        step()
        # -- the runner's launch callback: host time of one decision --------------------
        m.callback_s = callback_times(cuda, a, bulk)
        step()
        # -- device bandwidth (copy between resident buffers) ---------------------
        cuda.prefetch_to_gpu(a, bulk, stream)
        cuda.prefetch_to_gpu(b, bulk, stream)
        cuda.synchronize()
        cuda.launch_copy(b, a, bulk, stream)
        cuda.synchronize()
        for _ in range(repeats):
            m.copy.append([bulk, timed(lambda: cuda.launch_copy(b, a, bulk, stream))])
        step()
        # -- eviction and population at once (two streams) -------------------------
        both = []
        ev2 = cuda.new_event()
        for _ in range(repeats):
            cuda.prefetch_to_gpu(a, bulk, stream)
            cuda.prefetch_to_host(b, bulk, stream)
            cuda.synchronize()
            cuda.record_event(ev0, stream)
            cuda.stream_wait_event(stream2, ev0)
            cuda.prefetch_to_host(a, bulk, stream)      # eviction on one stream ...
            cuda.prefetch_to_gpu(b, bulk, stream2)      # ... population on the other
            cuda.record_event(ev2, stream2)
            cuda.stream_wait_event(stream, ev2)
            cuda.record_event(ev1, stream)
            both.append(cuda.event_elapsed_s(ev0, ev1))
        m.duplex = [bulk, bulk, statistics.median(both)]
        step()
    finally:
        try:
            cuda.synchronize()
        finally:
            for buf in bufs:
                cuda.free(buf)
            if monitor is not None:
                monitor.stop()
    m.elapsed_s = time.perf_counter() - t_start
    return m


def callback_times(cuda, buf: int, nbytes: int, n: int = CALLBACK_LAUNCHES) -> list[float]:
    """Host seconds of the GPU runner's launch callback (`Engine.on_launch`), demand at an emulated
    capacity the launch fits in, on `n` launches of one pointer into `buf`: the decision alone,
    no call (the first launch's eviction bookkeeping is left out)."""
    e = Engine(cuda, "demand", capacity=max(2 * nbytes, VA_BLOCK))
    data = struct.pack("<QQ", int(buf), int(nbytes))
    la = LaunchArgs(kernel="calibrate_probe", function=0, grid_x=1, grid_y=1, grid_z=1, block_x=1, block_y=1,
                    block_z=1, shared_mem_bytes=0, stream=0, correlation_id=0, param_offsets=(0, 8),
                    param_sizes=(8, 8), param_data=data, cbid=0)
    out = []
    for i in range(n + 1):
        t0 = time.perf_counter()
        e.on_launch(la)
        if i:
            out.append(time.perf_counter() - t0)
    return out


Planner = Callable[[Any, int], Any]   # (trace, capacity in bytes) -> a plan (plan_io.Plan)


def planned_callback_times(cuda, plan_for: Planner, budget: int, runs: int | None = None,
                           workload: tuple[str, float] = PROBE_WORKLOAD) -> CallbackTimes | str:
    """Host time of the planned runner's callback, launch by launch, on this driver: the trace of
    `workload` (made here, in a temporary folder), `plan_for`'s plan of it at half its managed
    memory, and `runs` (None: PROBE_RUNS) fresh engines carrying that plan out (cuda_engine.py's planned path, quiet
    launches included) over its launches, pointers moved to managed buffers of the trace's sizes
    allocated here (freed before returning). Each callback's calls are real (prefetches, events,
    stream waits); no kernel runs. -> the times (callback_timing.py), or why there are none (a
    string: more than `budget` bytes needed, or a callback failed)."""
    with tempfile.TemporaryDirectory(prefix="pagecast-calibrate-") as d:
        # the trace's tables may be read when first asked for: the folder lives as long as the probe
        tr = T.read_trace(make_trace(workload[0], Path(d) / "probe.pctrace", scale=workload[1], seed=1))
        al = tr.allocations
        sizes = {int(a): int(n) for a, n in zip(al.column(T.ADDRESS).to_pylist(), al.column(T.BYTES).to_pylist())}
        need = sum(-(-n // VA_BLOCK) * VA_BLOCK for n in sizes.values())
        if need > budget:
            return f"its trace needs {need} bytes of managed memory, more than the {budget} allowed"
        capacity = max(1, sum(sizes.values()) // 2)
        plan = plan_for(tr, capacity)
        counting = CountingCuda(cuda)
        moved: dict[int, int] = {}
        out = CallbackTimes()
        runs = PROBE_RUNS if runs is None else runs
        try:
            for a, n in sizes.items():
                moved[a] = cuda.alloc_managed(n)
            stream = cuda.new_stream()
            las = trace_launches(tr, moved, stream=stream)
            for _ in range(runs):
                for a, n in sizes.items():   # each run from the same start: the data on the host
                    cuda.prefetch_to_host(moved[a], n, stream)
                cuda.synchronize()
                rel = Relocator(tr)
                e = Engine(counting, "template", capacity=capacity, predict=lambda la, allocs: [],
                           planned=PlannedCalls(schedule_from_plan(plan.table, plan.launches, tr, rel), rel))
                time_callbacks(e.on_launch, las, counting, out)
                cuda.synchronize()
                if e.stats.errors or e.stats.failed_calls:   # the probe left out (measure says why)
                    return (f"its callback failed on {e.stats.errors} launch(es), the driver refused"
                            f" {e.stats.failed_calls} call(s): {e.stats.last_error}")
        finally:
            try:
                cuda.synchronize()
            finally:
                for base in moved.values():
                    cuda.free(base)
        return out


def steps(repeats: int = REPEATS, n_fault_sizes: int = len(FAULT_NS)) -> int:
    """How many progress steps measure() reports."""
    return repeats * n_fault_sizes + repeats + 1 + repeats + 3 + 1 + 1 + 1


def summary(profile) -> dict:
    """The numbers a user wants to see after calibrating (for the table and --json)."""
    return {
        "name": profile.name, "description": profile.description,
        "fault_time_us": profile.fault_time_s * 1e6,
        "block_service_us": getattr(profile, "block_service_s", 0.0) * 1e6,
        "batch_overhead_us": profile.batch_overhead_s * 1e6,
        "lone_fault_us": (profile.fault_time_s + getattr(profile, "block_service_s", 0.0)
                          + profile.batch_overhead_s) * 1e6,
        "htod_GBps": profile.htod_bandwidth / 1e9, "dtoh_GBps": profile.dtoh_bandwidth / 1e9,
        "duplex": profile.duplex, "pipelined_GBps": profile.pipelined_bandwidth / 1e9,
        "transfer_latency_us": profile.transfer_latency_s * 1e6,
        "host_launch_us": getattr(profile, "host_launch_s", 0.0) * 1e6,
        "host_base_us": getattr(profile, "host_base_s", 0.0) * 1e6,
        "host_call_us": getattr(profile, "host_call_s", 0.0) * 1e6,
        "host_quiet_us": getattr(profile, "host_quiet_s", 0.0) * 1e6,
        "host_wait_us": getattr(profile, "host_wait_s", 0.0) * 1e6,
        "launch_overhead_us": profile.launch_overhead_s * 1e6,
        "device_GBps": profile.device_bandwidth / 1e9,
    }

