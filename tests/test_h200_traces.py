"""Traces collected on a real GPU (an H200, driver 580.159, CUPTI 13.5, the driver's prefetcher on;
tests/data/h200/README.md): the readers, the observed footprints and the pipeline on what CUPTI
really delivers, not on records pagecast made itself."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from pagecast import footprints as FP
from pagecast import trace as T
from pagecast.cli import main

DATA = Path(__file__).parent / "data" / "h200"
TRACES = sorted(p.name for p in DATA.glob("*.pctrace"))


def _read(name: str) -> T.Trace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", T.TraceWarning)
        return T.read_trace(DATA / name)


def test_there_are_real_traces():
    assert len(TRACES) == 7, TRACES


@pytest.mark.parametrize("name", TRACES)
def test_a_real_trace_reads_as_a_complete_full_mode_cupti_trace(name):
    t = _read(name)
    m = t.manifest
    assert t.complete and t.mode == "full" and m["source"] == "cupti" and m["driver_prefetch"] is True
    assert m["device"]["name"] == "NVIDIA H200" and m["dropped_records"] == 0
    assert t.launches.num_rows == m["table_rows"]["launches"] > 100
    # every fault record inside a kernel's run is attributed to a launch; the others fall outside every
    # kernel's run (before the first, between two): GPU faults no kernel caused, most likely the
    # workload's memsets and copies into managed memory
    f = t.faults.to_pandas()
    lo = t.launches.column(T.START_NS).to_numpy()
    hi = t.launches.column(T.END_NS).to_numpy()
    order = np.argsort(lo)
    k = np.searchsorted(lo[order], f.time_ns.to_numpy(), side="right") - 1
    inside = (k >= 0) & (f.time_ns.to_numpy() <= hi[order][np.maximum(k, 0)])
    assert inside.sum() > 0.5 * len(f)
    assert f.launch_id[inside].notna().all()
    # and every launch carries its arguments (the hook saw every launch)
    assert all(len(d) > 0 for d in t.launches.column(T.PARAM_DATA).to_pylist())


def _covered(fp: FP.Footprints, launch: int, lo: int, hi: int) -> float:
    s, e = fp.of(launch)
    s, e = np.maximum(s, lo), np.minimum(e, hi)
    return float(np.clip(e - s, 0, None).sum()) / (hi - lo)


def _argument_buffers(t: T.Trace, launch: int) -> list[tuple[int, int]]:
    """(first page, end page) of each allocation a pointer argument of `launch` points into."""
    a = t.allocations.to_pandas().sort_values("address")
    lo, hi = a.address.to_numpy(), (a.address + a["bytes"]).to_numpy()
    data = t.launches.column(T.PARAM_DATA)[launch].as_py()
    sizes = t.launches.column(T.PARAM_SIZES)[launch].as_py()
    offs = t.launches.column(T.PARAM_OFFSETS)[launch].as_py()
    out = []
    for o, z in zip(offs, sizes):
        if z == 8:
            p = int.from_bytes(data[o:o + 8], "little")
            k = int(np.searchsorted(lo, p, side="right")) - 1
            if k >= 0 and p < hi[k]:
                out.append((int(lo[k]) // t.page_size, -(-int(hi[k]) // t.page_size)))
    return out


def test_with_the_prefetcher_on_the_faults_show_a_fraction_of_what_a_sweep_touches():
    """What the fitter is up against on a real GPU (docs/gpu-validation.md, 'Results'): a Jacobi sweep
    reads one grid and writes the other, whole; in full mode both migrate, but most of them as the
    driver's speculative prefetch. The certain evidence (faults and coherence migrations) covers
    well under half of each grid; with the prefetch migrations, nearly all of it."""
    t = _read("jacobi2d-0.5.pctrace")
    seen = FP.observed_footprints(t)
    maybe = FP.observed_footprints(t, include_prefetch=True)
    sweeps = [i for i, k in enumerate(t.launches.column(T.KERNEL).to_pylist()) if k == "jacobi2d_sweep"]
    first = sweeps[0]
    grids = _argument_buffers(t, first)        # the grid it reads and the one it writes
    assert len(grids) == 2
    for lo, hi in grids:
        assert _covered(seen, first, lo, hi) < 0.5
        assert _covered(maybe, first, lo, hi) > 0.95
    # the certain pages are always among the maybe-touched ones
    assert all(set(seen.pages(i)) <= set(maybe.pages(i)) for i in sweeps[:6])


def test_fit_and_evaluate_run_on_real_traces(tmp_path, capsys):
    model = tmp_path / "m.json"
    assert main(["fit", str(DATA / "jacobi2d-0.25.pctrace"), "-o", str(model)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(model), str(DATA / "jacobi2d-0.5.pctrace"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    o = doc["overall"]
    assert 0 <= o["precision"] <= 1 and 0 <= o["recall"] <= 1
    assert {k["kernel"] for k in doc["kernels"]} == {"jacobi2d_sweep", "jacobi2d_restrict", "jacobi2d_prolong",
                                                     "jacobi2d_residual", "jacobi2d_halo", "reduce_sum"}


def test_a_fit_from_real_traces_finds_the_sweeps_ranges_at_an_unseen_scale():
    """The holes the prefetcher fills are no holes (fit.region._hull_covered): fitted on the 0.25 and
    0.5 runs, the grid kernels (each reads and writes whole grids) are ranges of their arguments, and
    at scale 1 they predict their grids' pages, no page outside them. Before, with the faults alone
    as the evidence, every kernel was `irregular` and the sweep's prediction held 56% of its grids."""
    from pagecast.predict.fit import fit_model
    from pagecast.predict.predictor import predict_with_unseen

    model = fit_model([_read("jacobi2d-0.25.pctrace"), _read("jacobi2d-0.5.pctrace")])
    dense = ("jacobi2d_sweep", "jacobi2d_restrict", "jacobi2d_prolong", "jacobi2d_residual")
    assert all(model.kernels[k].cls in ("fixed", "linear") for k in dense), \
        {k: model.kernels[k].cls for k in dense}
    t = _read("jacobi2d-1.pctrace")
    pred, unseen = predict_with_unseen(model, t)
    assert not unseen.any()
    names = t.launches.column(T.KERNEL).to_pylist()
    got = want = 0
    for i, k in enumerate(names):
        if k not in dense:
            continue
        bufs = _argument_buffers(t, i)
        p = pred.pages(i)
        want += sum(hi - lo for lo, hi in bufs)
        inside_i = np.zeros(len(p), bool)
        for lo, hi in bufs:
            inside_i |= (p >= lo) & (p < hi)
            got += int(((p >= lo) & (p < hi)).sum())
        assert inside_i.all(), (i, k)          # nothing predicted outside the kernel's own grids
    assert got / want >= 0.98, got / want


def test_what_full_mode_evicts_after_a_launch_is_evidence_of_what_it_moved():
    """On the H200, a decode step's weights read again in a later step migrated with no host-to-device
    record and few faults; the collector's eviction after the launch showed them moved
    (footprints.resident_after, possible pages). With that, gemv_bf16's weight slice is a range of its
    arguments, [W, W + 2*rows*cols), exact at every launch; without it the kernel was `irregular` and
    predicted 7.1 GiB over the trace for a 38 MiB footprint. One scale was collected, so this is the
    fit's own trace: the template, not its reach to other sizes."""
    from pagecast.predict.fit import fit_model
    from pagecast.footprints import resident_after
    from pagecast.predict.predictor import predict_with_unseen

    t = _read("llm_decode-0.5.pctrace")
    lid, s, e = resident_after(t)
    assert len(lid) and (e > s).all()
    natural = T.Trace.__new__(T.Trace)
    natural.__dict__.update(t.__dict__, manifest={**t.manifest, "mode": "natural"})
    assert len(resident_after(natural)[0]) == 0          # only full mode evicts everything first
    model = fit_model([t])
    assert model.kernels["gemv_bf16"].cls in ("fixed", "linear")
    pred, _ = predict_with_unseen(model, t)
    L = t.launches.to_pandas()
    w_lo, w_hi = _argument_buffers(t, int(L.index[L.kernel == "gemv_bf16"][0]))[0]
    for i in L.index[L.kernel == "gemv_bf16"]:
        d = L.param_data[i]
        p0 = int.from_bytes(d[0:8], "little")
        rows, cols = int.from_bytes(d[24:28], "little"), int.from_bytes(d[28:32], "little")
        lo, hi = p0 // t.page_size, -(-(p0 + 2 * rows * cols) // t.page_size)
        p = pred.pages(i)
        in_w = p[(p >= w_lo) & (p < w_hi)]
        assert len(in_w) == hi - lo and in_w.min() == lo and in_w.max() == hi - 1, i


def test_evaluate_bounds_the_precision_where_faults_show_part_of_what_launches_touched(tmp_path, capsys):
    """Against the faults, a model exact on the grids scores under 30% on real traces; the records of
    the prefetcher and the evictions bound the rest: the real precision lies in a range."""
    from pagecast.predict.evaluate import evaluate
    from pagecast.predict.fit import fit_model

    model = fit_model([_read("jacobi2d-0.25.pctrace"), _read("jacobi2d-0.5.pctrace")])
    doc = evaluate(model, _read("jacobi2d-1.pctrace"))
    o = doc["overall"]
    assert o["precision"] < 0.3 < 0.99 < o["precision_at_most"] <= 1.0
    assert doc["baseline"]["precision"] <= doc["baseline"]["precision_at_most"]
    sweep = next(k for k in doc["kernels"] if k["kernel"] == "jacobi2d_sweep")
    assert sweep["precision"] <= sweep["precision_at_most"]
    path = tmp_path / "m.json"
    from pagecast.predict.model_io import save_model
    save_model(model, path)
    assert main(["evaluate", str(path), str(DATA / "jacobi2d-1.pctrace")]) == 0
    assert "precision between" in capsys.readouterr().out
