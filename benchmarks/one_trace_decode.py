"""A decode loop over head-major K/V caches fitted from one trace, scored at another seed's prompt
lengths (docs/template-model.md, "What the fit does not know"): per (heads, seed) the attention
kernel's precision and recall by pages, its regions and whether the fit says it is pinned.
The program is tests/test_fit_once.py's `_decode_program`: 20 decode steps from one prompt of
200-400 tokens (the K/V extent grows by 2.5 KiB, under a big page), scored on two prompts of
20-150 and 1000-3000 tokens, 4 steps each.

    python benchmarks/one_trace_decode.py [--heads 1,2,4] [--seeds 0,1,2,3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from pagecast import trace as T
    from pagecast.predict.fit import fit_model
    from tests.test_fit_once import _decode_program, _pages_scores

    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default="1,2,4")
    ap.add_argument("--seeds", default="0,1,2,3")
    a = ap.parse_args()
    head_dim, max_seq = 64, 4096
    ps, rs = [], []
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        for heads in [int(x) for x in a.heads.split(",")]:
            for seed in [int(x) for x in a.seeds.split(",")]:
                rng = np.random.default_rng(seed)
                fit_tr = T.read_trace(_decode_program([int(rng.integers(200, 400))], 20, heads, head_dim, max_seq,
                                                      2).write(d / "fit.pctrace", seed=seed))
                test_tr = T.read_trace(_decode_program([int(rng.integers(20, 150)), int(rng.integers(1000, 3000))],
                                                       4, heads, head_dim, max_seq, 2).write(d / "test.pctrace",
                                                                                             seed=seed + 1))
                t0 = time.process_time()
                m = fit_model([fit_tr])
                t = time.process_time() - t0
                km = m.kernels["attn"]
                p, r = _pages_scores(m, test_tr)
                ps.append(p)
                rs.append(r)
                print(f"heads {heads} seed {seed}: precision {100 * p:.2f}% recall {100 * r:.2f}% "
                      f"pinned {km.pinned.pinned} ({t:.1f} s CPU) regions {[x.text() for x in km.regions]}",
                      flush=True)
    print(f"precision {100 * min(ps):.2f}-{100 * max(ps):.2f}%, recall {100 * min(rs):.2f}-{100 * max(rs):.2f}% "
          f"over {len(ps)} fits")


if __name__ == "__main__":
    main()
