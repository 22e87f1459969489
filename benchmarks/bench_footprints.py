"""Footprints of a trace touching 10^8 pages: time and peak memory, beside the per-page reference.

The reference expands every touched page to its own int64 and deduplicates with
np.unique (what a straightforward implementation does); pagecast keeps merged
intervals. Both run on the same truth table in this process, one after the
other, each in a fresh subprocess so peak RSS is measured separately.

    python benchmarks/bench_footprints.py [--pages 1e8] [--launches 1e6]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import numpy as np
sys.path.insert(0, {repo!r})
from pagecast import trace as T
from pagecast.footprints import truth_footprints, page_span
t0 = time.perf_counter()
tr = T.read_trace({path!r})
t1 = time.perf_counter()
if {mode!r} == "intervals":
    fp = truth_footprints(tr)
    pages = fp.total_pages()
else:
    lid = tr.truth.column(T.LAUNCH_ID).to_numpy()
    s, e = page_span(tr.truth.column(T.ADDRESS).to_numpy(), tr.truth.column(T.BYTES).to_numpy(), tr.page_size)
    n = e - s
    off = np.cumsum(n) - n
    page = np.repeat(s - off, n) + np.arange(n.sum())
    key = (np.repeat(lid, n) << 40) | (page - page.min())
    pages = len(np.unique(key))
t2 = time.perf_counter()
print(json.dumps({{"read_s": t1 - t0, "footprint_s": t2 - t1, "pages": int(pages),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def make_trace(path: Path, n_launches: int, pages: int) -> None:
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pagecast import trace as T

    rng = np.random.default_rng(0)
    per = pages // n_launches
    # Three ranges per launch (two operands and a result), overlapping in part, as a GEMM-like kernel would.
    lid = np.repeat(np.arange(n_launches), 3)
    base = np.uint64(0x7F00_0000_0000)
    slot = rng.integers(0, 64, len(lid)).astype(np.uint64)
    addr = base + slot * np.uint64(per * 4096 // 2)
    size = np.full(len(lid), per * 4096 // 3 + 4096, np.int64)
    T.write_trace(path, T.new_manifest(workload={"name": "bench-footprints"}), {
        T.LAUNCHES: {T.LAUNCH_ID: np.arange(n_launches), T.KERNEL: np.full(n_launches, "k", object),
                     T.DEVICE: np.zeros(n_launches, np.int32), T.STREAM: np.zeros(n_launches),
                     **{c: np.ones(n_launches, np.int32) for c in T.GRID_COLUMNS},
                     T.SHARED_MEM_BYTES: np.zeros(n_launches, np.int32),
                     T.PARAM_OFFSETS: [[]] * n_launches, T.PARAM_SIZES: [[]] * n_launches,
                     T.PARAM_DATA: [b""] * n_launches},
        T.TRUTH: {T.LAUNCH_ID: lid, T.ADDRESS: addr, T.BYTES: size, T.ACCESS: np.full(len(lid), "read", object)},
    })


def run(path: Path, mode: str) -> dict:
    code = CHILD.format(repo=str(Path(__file__).resolve().parents[1]), path=str(path), mode=mode)
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=float, default=1e8)
    ap.add_argument("--launches", type=float, default=1e6)
    ap.add_argument("--reference-pages", type=float, default=1e7,
                    help="size at which the per-page reference also runs (it needs ~30 B/page)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for pages, modes in ((a.reference_pages, ("intervals", "per-page")), (a.pages, ("intervals",))):
            p = Path(d) / f"t{int(pages)}.pctrace"
            make_trace(p, int(a.launches), int(pages))
            for mode in modes:
                r = run(p, mode)
                rows.append({"touched_pages": int(pages), "method": mode, **r})
    print("| touched pages (requested) | method | distinct launch-pages | read s | footprint s | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['touched_pages']:.0e} | {r['method']} | {r['pages']:,} | {r['read_s']:.2f} | "
              f"{r['footprint_s']:.2f} | {r['peak_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
