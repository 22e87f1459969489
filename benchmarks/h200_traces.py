"""Fits from the traces collected on an H200 (tests/data/h200/), the figures docs/gpu-validation.md
and docs/template-model.md quote:

    python benchmarks/h200_traces.py [--data tests/data/h200]

- jacobi2d: fitted on scales 0.25 and 0.5, scored at 1. Each grid kernel (sweep, restrict,
  prolong, residual) reads and writes its grids whole, so it is scored against the allocations its
  pointer arguments name, beside `evaluate`'s scores against the observed footprint.
- llm_decode: fitted on its one trace, `gemv_bf16`'s prediction inside the weights allocation
  against its slice [W, W + 2*rows*cols).
- spmv_cg: fitted at 0.5, scored at 1 against the observed footprint.

Only public calls (fit_model, predict_with_unseen, evaluate), so the same script measures an older
checkout of pagecast for a before/after.
"""

from __future__ import annotations

import argparse
import struct
import time
import warnings
from pathlib import Path

import numpy as np

from pagecast import trace as T
from pagecast.predict.evaluate import evaluate
from pagecast.predict.fit import fit_model
from pagecast.predict.predictor import predict_with_unseen

GRID_KERNELS = ("jacobi2d_sweep", "jacobi2d_restrict", "jacobi2d_prolong", "jacobi2d_residual")


def _read(data: Path, name: str) -> T.Trace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return T.read_trace(data / f"{name}.pctrace")


def _fit(traces):
    t0 = time.perf_counter()
    m = fit_model(traces)
    return m, time.perf_counter() - t0


def argument_allocations(t: T.Trace, launch: int) -> list[tuple[int, int]]:
    """(first page, end page) of each allocation an 8-byte argument of `launch` points into."""
    a = t.allocations.to_pandas().sort_values("address")
    lo, hi = a.address.to_numpy(), (a.address + a["bytes"]).to_numpy()
    row = t.launches.slice(launch, 1).to_pylist()[0]
    out = []
    for o, z in zip(row[T.PARAM_OFFSETS], row[T.PARAM_SIZES]):
        if z == 8:
            p = int.from_bytes(row[T.PARAM_DATA][o:o + 8], "little")
            k = int(np.searchsorted(lo, p, side="right")) - 1
            if k >= 0 and p < hi[k]:
                out.append((int(lo[k]) // t.page_size, -(-int(hi[k]) // t.page_size)))
    return out


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.2f}%"


def jacobi(data: Path) -> list[str]:
    model, fit_s = _fit([_read(data, "jacobi2d-0.25"), _read(data, "jacobi2d-0.5")])
    t = _read(data, "jacobi2d-1")
    pred, _ = predict_with_unseen(model, t)
    names = t.launches.column(T.KERNEL).to_pylist()
    lines = [f"jacobi2d, fitted at 0.25 and 0.5 ({fit_s:.1f} s), scored at 1 against the allocations its"
             " arguments name:", "", "| kernel | class | precision | recall |", "|---|---|---:|---:|"]
    for k in GRID_KERNELS:
        hit = pred_n = want = 0
        for i in (j for j, n in enumerate(names) if n == k):
            p = pred.pages(i)
            # two allocations can share a page at their edges: count it once
            touched = np.unique(np.concatenate([np.arange(lo, hi) for lo, hi in argument_allocations(t, i)]))
            hit += int(np.isin(p, touched).sum())
            pred_n += len(p)
            want += len(touched)
        lines.append(f"| {k} | {model.kernels[k].cls} | {_pct(hit / max(pred_n, 1))} | {_pct(hit / max(want, 1))} |")
    ev = evaluate(model, t)
    o, b = ev["overall"], ev["baseline"]
    lines += ["", f"against the observed footprint: model precision {_pct(o['precision'])} (at most"
              f" {_pct(o.get('precision_at_most'))}), recall {_pct(o['recall'])}; allocation baseline precision"
              f" {_pct(b['precision'])} (at most {_pct(b.get('precision_at_most'))})"]
    return lines


def llm_decode(data: Path) -> list[str]:
    t = _read(data, "llm_decode-0.5")
    model, fit_s = _fit([t])
    pred, _ = predict_with_unseen(model, t)
    launches = [i for i, n in enumerate(t.launches.column(T.KERNEL).to_pylist()) if n == "gemv_bf16"]
    w_lo, w_hi = argument_allocations(t, launches[0])[0]
    exact = hit = pred_n = want = 0
    for i in launches:
        row = t.launches.slice(i, 1).to_pylist()[0]
        d = row[T.PARAM_DATA]
        p0 = int.from_bytes(d[0:8], "little")
        rows, cols = struct.unpack("<ii", d[24:32])
        lo, hi = p0 // t.page_size, -(-(p0 + 2 * rows * cols) // t.page_size)
        p = pred.pages(i)
        p = p[(p >= w_lo) & (p < w_hi)]
        inside = int(((p >= lo) & (p < hi)).sum())
        hit, pred_n, want = hit + inside, pred_n + len(p), want + hi - lo
        exact += int(inside == len(p) == hi - lo)
    predicted = int(pred.pages_per_launch()[launches].sum()) * t.page_size
    return [f"llm_decode, fitted on its one trace ({fit_s:.1f} s): gemv_bf16 `{model.kernels['gemv_bf16'].cls}`,"
            f" {predicted / 2**20:.1f} MiB predicted over {len(launches)} launches; in the weights allocation"
            f" precision {_pct(hit / max(pred_n, 1))}, recall {_pct(hit / max(want, 1))} against the slice,"
            f" exact at {exact} of {len(launches)} launches"]


def spmv(data: Path) -> list[str]:
    model, fit_s = _fit([_read(data, "spmv_cg-0.5")])
    o = evaluate(model, _read(data, "spmv_cg-1"))["overall"]
    return [f"spmv_cg, fitted at 0.5 ({fit_s:.1f} s), scored at 1 against the observed footprint: precision"
            f" {_pct(o['precision'])} (at most {_pct(o.get('precision_at_most'))}), recall {_pct(o['recall'])}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "tests" / "data" / "h200"))
    a = ap.parse_args(argv)
    data = Path(a.data)
    for part in (jacobi(data), llm_decode(data), spmv(data)):
        print("\n".join(part) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
