"""Simulator throughput beside libCacheSim's, on the same page sequence, in one run.

    python benchmarks/bench_sim.py [--requests 20000000] [--pages 2000000] [--out docs/simulator-performance.md]

The sequence: launches that each touch a range of consecutive 4 KiB pages
(ascending), starting at Zipf-distributed offsets; the page sequence is every
launch's pages in order. libCacheSim (PyPI `libcachesim`) reads it from its own
binary format (oracleGeneral: 24-byte records with the next access time) and
runs LRU and Belady in C (`process_trace`); pagecast's simulator runs the same
sequence through its numba core (`sim/kernels.py`'s `run_engine`, the demand policy's
path, and `belady_plan` + `run_engine`, the oracle's). Both answer the same
miss counts (checked). Compile time is excluded (warm-up on a small input);
the time to read the binary trace is included for libCacheSim, the time to
build the CSR arrays is not included for pagecast (it reads footprints as
intervals, never as a per-request file). Peak memory is the process's maximum
RSS after each stage.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pagecast.replay.sim import kernels as C  # noqa: E402
from pagecast.uvm import FAULT_BATCH, PREFETCH_THRESHOLD  # noqa: E402
from pagecast.replay.sim import uvm_driver as D  # noqa: E402
from pagecast.replay.plan import belady as PB  # noqa: E402
from pagecast.replay.sim import stack as ST  # noqa: E402

PS = 4096
I64 = np.int64


def make_sequence(n_req: int, n_pages: int, mean_len: int, seed: int = 0):
    """Launch CSR (ptr, pages) with about n_req page touches over n_pages pages."""
    rng = np.random.default_rng(seed)
    n_launch = max(n_req // mean_len, 1)
    lens = np.minimum(rng.geometric(1 / mean_len, n_launch), 4 * mean_len).astype(I64)
    lens = np.maximum(lens, 1)
    lens = lens[: np.searchsorted(np.cumsum(lens), n_req) + 1]
    n_launch = len(lens)
    # Zipf-distributed region starts: a hot set reused often, a long tail
    hot = rng.zipf(1.2, n_launch) % max(n_pages // mean_len, 1)
    perm = rng.permutation(max(n_pages // mean_len, 1))
    starts = np.minimum(perm[hot] * mean_len, n_pages - lens)
    ptr = np.zeros(n_launch + 1, I64)
    np.cumsum(lens, out=ptr[1:])
    total = int(ptr[-1])
    pages = np.repeat(starts - ptr[:-1], lens) + np.arange(total, dtype=I64)
    return ptr, pages


def write_oracle_general(path: Path, seq: np.ndarray) -> None:
    """libCacheSim's oracleGeneral binary trace: <u4 time, <u8 id, <u4 size, <i8 next access (-1: never)>."""
    n = len(seq)
    order = np.lexsort((np.arange(n), seq))
    s = seq[order]
    same = s[1:] == s[:-1]
    nxt = np.full(n, -1, I64)
    nxt[order[:-1][same]] = order[1:][same]
    rec = np.dtype([("t", "<u4"), ("id", "<u8"), ("sz", "<u4"), ("nx", "<i8")])
    with open(path, "wb") as f:
        for a in range(0, n, 1 << 22):
            b = min(n, a + (1 << 22))
            r = np.zeros(b - a, rec)
            r["t"] = np.arange(a, b)
            r["id"] = seq[a:b]
            r["sz"] = PS
            r["nx"] = nxt[a:b]
            f.write(r.tobytes())
    del order, s, same, nxt


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Geometry:
    """Unit -> chunk / VA block arrays for n_units contiguous units."""

    def __init__(self, n_units: int, units_per_chunk: int, units_per_block: int):
        u = np.arange(n_units, dtype=I64)
        self.key = u
        self.unit_chunk = u // units_per_chunk
        nc = int(self.unit_chunk[-1]) + 1
        c = np.arange(nc, dtype=I64)
        self.n_chunks = nc
        self.chunk_lo = c * units_per_chunk
        self.chunk_hi = np.minimum((c + 1) * units_per_chunk, n_units)
        b = u // units_per_block
        self.block_lo = b * units_per_block
        self.block_hi = np.minimum((b + 1) * units_per_block, n_units)
        self.upb = units_per_block
        self.n_units = n_units
        self.chunk_weight = np.full(nc, units_per_chunk, I64)   # a chunk takes its whole size (sim/uvm_driver.py)


def engine(ptr, units, geo: Geometry, cap: int, *, lru: bool, tree: bool, plan=None, pages_per_unit: int = 1):
    """Run the simulator core over every step; returns counters summed (faults: fault-buffer entries,
    `pages_per_unit` per missing unit). Victims in LRU order, else the driver's."""
    n = len(ptr) - 1
    resident = np.zeros(geo.n_units, np.uint8)
    planned = np.zeros(geo.n_units, np.uint8)
    cc = np.zeros(geo.n_chunks, I64)
    prev = np.full(geo.n_chunks + 1, -1, I64)
    nxt = np.full(geo.n_chunks + 1, -1, I64)
    prev[-1] = nxt[-1] = geo.n_chunks
    st = np.zeros(3, I64)
    uq = np.zeros(geo.n_units, I64)
    counters = np.zeros((n, C.N_COUNTERS), I64)
    missed = np.zeros(int(np.diff(ptr).max()) + 1, I64)
    if plan is None:
        z = np.zeros(n + 1, I64)
        plan = (z, np.zeros(0, I64), z, np.zeros(0, I64), np.zeros(n, I64))
        has = False
    else:
        has = True
    sp = C.Space(geo.unit_chunk, geo.chunk_lo, geo.chunk_hi, geo.key, geo.block_lo, geo.block_hi, int(geo.upb),
                 geo.chunk_weight)
    mem = C.Mem(cap, st, resident, planned, cc, prev, nxt, uq, np.full(geo.n_units, -1, I64), np.zeros(geo.n_units, I64))
    rules = C.Rules(D.VICTIM_LRU if lru else D.VICTIM_DRIVER, tree, PREFETCH_THRESHOLD, has, False, False, FAULT_BATCH)
    C.run_engine(0, n, C.Steps(ptr, units, np.zeros(1, np.int64), np.full(len(units), pages_per_unit, I64)),
                 C.PlanArrays(*plan, 0), sp, mem, rules, missed, counters)
    return counters.sum(axis=0)


def to_units(ptr, pages, per_unit: int):
    """Pages -> units of `per_unit` pages, deduplicated within each launch (pages ascending)."""
    u = pages // per_unit
    new = np.ones(len(u), bool)
    new[1:] = u[1:] != u[:-1]
    new[ptr[:-1][np.diff(ptr) > 0]] = True
    keep = np.flatnonzero(new)
    launch = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))[keep]
    p2 = np.zeros(len(ptr), I64)
    np.cumsum(np.bincount(launch, minlength=len(ptr) - 1), out=p2[1:])
    return p2, u[keep]


def timed(fn, *a, **k):
    gc.collect()
    t = time.perf_counter()
    r = fn(*a, **k)
    return r, time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000_000)
    ap.add_argument("--pages", type=int, default=2_000_000, help="distinct pages (4 KiB) in the address range")
    ap.add_argument("--launch-pages", type=int, default=64, help="mean pages per launch")
    ap.add_argument("--cache", type=float, default=0.5, help="capacity as a share of the distinct pages touched")
    ap.add_argument("--belady-requests", type=int, default=None,
                    help="requests for the Belady comparison (default: --requests)")
    ap.add_argument("--out", help="write the markdown table here")
    args = ap.parse_args(argv)
    import libcachesim as lcs

    # warm-up: compile every numba function on a tiny input
    wp, wu = make_sequence(5000, 2000, 16, seed=1)
    g = Geometry(2000, 1, 1)
    engine(wp, wu, g, 500, lru=True, tree=False)
    ST.lru_stack_distances(wu, 2000)
    PB.belady_plan(np.arange(len(wu) + 1, dtype=I64), wu, 2000, 500, 0, np.zeros(2000, np.uint8), 1, 1)

    ptr, pages = make_sequence(args.requests, args.pages, args.launch_pages)
    n_req = len(pages)
    uniq = np.unique(pages)
    dense = np.searchsorted(uniq, pages)       # dense page ids 0..U-1 (same order as addresses)
    U = len(uniq)
    cap = int(U * args.cache)
    rows = []
    print(f"sequence: {n_req:,} page touches, {len(ptr) - 1:,} launches, {U:,} distinct pages; "
          f"capacity {cap:,} pages ({cap * PS / 2**30:.2f} GiB)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "seq.oracleGeneral.bin"
        write_oracle_general(path, dense.astype(np.uint64))
        # libCacheSim LRU
        reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
        cache = lcs.LRU(cache_size=cap * PS)
        (mr, _), t = timed(cache.process_trace, reader)
        lcs_lru_miss = round(mr * n_req)
        rows.append(("libCacheSim LRU (C, oracleGeneral binary trace)", n_req, t, f"{lcs_lru_miss:,}", rss_mib()))
        del cache, reader
        # pagecast demand/LRU at 4 KiB, one capacity, step by step
        geo = Geometry(U, 1, 1)
        c, t = timed(engine, ptr, dense, geo, cap, lru=True, tree=False)
        assert int(c[C.C_FAULTS]) == lcs_lru_miss or abs(int(c[C.C_FAULTS]) - mr * n_req) < 1, \
            (int(c[C.C_FAULTS]), mr * n_req)
        rows.append(("pagecast demand/LRU, 4 KiB units (run_engine)", n_req, t, f"{int(c[C.C_FAULTS]):,}", rss_mib()))
        # pagecast LRU, all of 4 capacities in one pass
        caps = [cap // 4, cap // 2, cap, min(U, cap * 3 // 2)]
        def one_pass():
            dist = ST.lru_stack_distances(dense, U)
            return [int((dist > c_).sum()) for c_ in caps]
        m4, t = timed(one_pass)
        assert m4[2] == int(c[C.C_FAULTS])
        rows.append(("pagecast LRU, 4 capacities in one pass (stack distances)", n_req, t,
                     " / ".join(f"{x:,}" for x in m4), rss_mib()))
        # pagecast demand at its default geometry: 64 KiB units, 2 MiB chunks in the driver's order, the
        # prefetcher at each batch's end
        p64, u64 = to_units(ptr, dense, 16)
        geo64 = Geometry(int(u64.max()) + 1, 32, 32)
        c64, t = timed(engine, p64, u64, geo64, cap // 16, lru=False, tree=True, pages_per_unit=16)
        rows.append(("pagecast demand, 64 KiB units, 2 MiB chunks (driver order, batches), tree prefetch", n_req, t,
                     f"{int(c64[C.C_FAULTS]):,} fault entries", rss_mib()))
        del geo64, p64, u64
        # Belady: per request (a launch of one page each), libCacheSim vs the planner + engine
        nb = args.belady_requests or n_req
        bseq = dense[:nb]
        bpath = Path(d) / "belady.oracleGeneral.bin"
        if nb != n_req:
            write_oracle_general(bpath, bseq.astype(np.uint64))
        else:
            bpath = path
        Ub = int(bseq.max()) + 1
        capb = int(len(np.unique(bseq)) * args.cache)
        reader = lcs.TraceReader(str(bpath), lcs.TraceType.ORACLE_GENERAL_TRACE)
        cache = lcs.Belady(cache_size=capb * PS)
        (mrb, _), t = timed(cache.process_trace, reader)
        lcs_b = round(mrb * nb)
        rows.append(("libCacheSim Belady (C, oracleGeneral binary trace)", nb, t, f"{lcs_b:,}", rss_mib()))
        del cache, reader
        bptr = np.arange(nb + 1, dtype=I64)
        geob = Geometry(Ub, 1, 1)

        def plan():
            return PB.belady_plan(bptr, bseq, Ub, capb, 0, np.zeros(Ub, np.uint8), 1 << 20, capb)
        (ev_ptr, ev, pf_ptr, pf, nn, *_), t = timed(plan)
        assert len(pf) == lcs_b, (len(pf), lcs_b)
        rows.append(("pagecast Belady: the oracle's planner (belady_plan; misses = its fetches)", nb, t,
                     f"{len(pf):,}", rss_mib()))
        cb, t2 = timed(engine, bptr, bseq, geob, capb, lru=False, tree=False, plan=(ev_ptr, ev, pf_ptr, pf, nn))
        moved = int(cb[C.C_PREFETCH_IN] + cb[C.C_FAULT_IN])
        assert moved == lcs_b and int(cb[C.C_FAULTS]) == 0, (moved, lcs_b)
        rows.append(("pagecast oracle: planner + replaying its plan, one launch per page", nb, t + t2, f"{moved:,}",
                     rss_mib()))
    lines = ["| simulator | requests | seconds | M requests/s | misses | peak RSS MiB |", "|---|---:|---:|---:|---:|---:|"]
    for name, n, t, miss, rss in rows:
        lines.append(f"| {name} | {n:,} | {t:.2f} | {n / t / 1e6:.1f} | {miss} | {rss:.0f} |")
    table = "\n".join(lines)
    head = (f"Sequence: {n_req:,} page touches in {len(ptr) - 1:,} launches over {U:,} distinct 4 KiB pages, "
            f"capacity {cap:,} pages; {os.cpu_count()} CPUs, one thread.")
    print(head)
    print(table)
    if args.out:
        Path(args.out).write_text(
            "# Simulator performance\n\nWritten by `python benchmarks/bench_sim.py"
            f" --requests {args.requests} --pages {args.pages} --out {args.out}`"
            " (see the script's docstring for what is timed).\n\n" + head + "\n\n" + table + "\n\n" + NOTES + "\n")
    return 0


NOTES = """\
The rows come from one run on the same sequence, so they compare with each other; the
machine is shared with other jobs, so absolute rates vary from run to run by a factor of
two or more (ratios between rows are what the figures mean). Misses agree exactly with
libCacheSim's in every row (the script asserts it). "Peak RSS" is the process's
high-water mark so far, dominated by generating the 20 M request sequence and its binary
file (24 bytes a request); the simulator's own state is a few arrays of one int64 per
unit plus its per-launch counters."""


if __name__ == "__main__":
    sys.exit(main())
