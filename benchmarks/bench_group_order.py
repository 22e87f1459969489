"""The planner's ordering of a plan's transfer lists: np.lexsort (what belady_plan did) against
belady.group_order (what it does), on the same arrays in one process.

    python benchmarks/bench_group_order.py --n 10000000 --groups 100000

Transfers come nearly in group order (a plan issues most in its current step's group), units at
random, 70% of them their own step's; each path makes the order, the groups' pointers and the
per-group counts of own entries. Exits 1 where the orders differ.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from pagecast.replay.plan import belady as B


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--groups", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    n, G = args.n, args.groups
    g = np.sort(rng.integers(0, G, n))
    g = np.clip(g + (rng.random(n) < 0.1) * rng.integers(-5, 5, n), 0, G - 1).astype(np.int32)
    u = rng.integers(0, 2 * G, n).astype(np.int32)
    own = rng.random(n) < 0.7
    B.group_order(g[:100], ~own[:100], u[:100], G)   # compiled (or loaded) before timing
    for _ in range(args.repeat):
        t = time.perf_counter()
        o = np.lexsort((u, ~own, g))
        sg = g[o]
        B._group_ptr(sg, G)
        B._own_counts(sg, own[o], G)
        a = time.perf_counter() - t
        t = time.perf_counter()
        o2, _, _ = B.group_order(g, ~own, u, G)
        b = time.perf_counter() - t
        same = np.array_equal(o, o2)
        print(f"lexsort {a:.2f} s, group_order {b:.2f} s, x{a / b:.1f}, same order: {same}")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
