"""The GPU runner reading an indexed launch's values before predicting it (replay/gpu/cuda_engine.py),
on the CPU with the stand-in GPU (tests/cuda_standin.py's FakeCuda). Not run on a GPU.

The hand-made gather of tests/index_workload.py: write_ids writes a few row ids, an unrelated
kernel runs, gather_rows reads the table rows they name. The engine must, at the gather's launch,
wait for the work queued before it on its stream (the producer's completion), copy the ids, and
only then prefetch exactly those rows, before the kernel."""

from __future__ import annotations

import numpy as np
import pytest

from pagecast import trace as T
from pagecast import values as V
from pagecast.collect.launch_hook import LaunchArgs
from pagecast.predict.fit import fit_model
from pagecast.replay.gpu import cuda_engine as E
from pagecast.replay.online import prediction as GP

import index_workload as IW
from cuda_standin import FakeCuda

STREAM = 7


@pytest.fixture(scope="module")
def gather(tmp_path_factory):
    d = tmp_path_factory.mktemp("gather-runner")
    fit_on = IW.build(seed=1).write(d / "fit.pctrace")
    model = IW.with_indexed(fit_model([T.read_trace(fit_on)]))
    run = T.read_trace(IW.build(seed=5).write(d / "run.pctrace"))
    return model, run


def _setup(model, run, **kw):
    fake = FakeCuda()
    for a in run.allocations.to_pylist():
        fake.add_allocation(a[T.ADDRESS], a[T.BYTES])
    eng = E.Engine(fake, "template", predict=GP.make_online_predict(model, "none", **kw))
    return fake, eng


def _drive(fake, eng, run, *, write=True):
    """Feed the run's launches; the ids the trace recorded are written into the stand-in's memory
    when their writer launches (as write_ids would). Returns per launch its slice of the call log."""
    im = V.image(run)
    rows = run.launches.to_pylist()
    ids_ptr = {}
    for r in rows:
        if "gather_rows" in r[T.KERNEL]:
            d = bytes(r[T.PARAM_DATA])
            ids_ptr[r[T.LAUNCH_ID]] = int.from_bytes(d[16:24], "little")
    out = []
    for r in rows:
        lid = r[T.LAUNCH_ID]
        if write and lid + 2 in ids_ptr:              # write_ids: two launches before its gather
            p = ids_ptr[lid + 2]
            fake.write(p, im.data(int(im.find([lid + 2], [p])[0])))
        mark = len(fake.log)
        eng.on_launch(LaunchArgs.from_row(r, stream=STREAM))
        out.append((r, fake.log[mark:]))
    return out, ids_ptr


@pytest.mark.parametrize("compiled", [True, False])
def test_the_gather_waits_for_its_values_then_prefetches_exactly_the_rows_they_name(gather, compiled):
    model, run = gather
    fake, eng = _setup(model, run, compiled=compiled)
    steps, ids_ptr = _drive(fake, eng, run)
    im = V.image(run)
    table = next(a for a in run.allocations.to_pylist() if a[T.BYTES] == 4 * 4096 * 2048)[T.ADDRESS]
    row = 4 * 2048
    for r, log in steps:
        kinds = [e[0] for e in log]
        if "gather_rows" not in r[T.KERNEL]:
            assert "event_sync" not in kinds and "dtoh" not in kinds
            continue
        lid = r[T.LAUNCH_ID]
        v = im.ints(int(im.find([lid], [ids_ptr[lid]])[0]), 3)
        # the event on the launch's stream, the host's wait, the copy on that stream, then prefetches
        ev = next(e for e in log if e[0] == "record")
        assert ev[2] == E.LEGACY_STREAM or ev[2] == STREAM
        i_sync, i_copy = kinds.index("event_sync"), kinds.index("dtoh")
        assert kinds.index("record") < i_sync < i_copy
        assert log[i_copy][1:] == (ids_ptr[lid], 12, ev[2])
        gpu = [(e[1], e[2]) for e in log if e[0] == "gpu"]
        assert gpu and kinds.index("gpu") > i_copy
        got = {p for a, n in gpu if table <= a < table + 4 * 4096 * 2048 for p in range(a // 4096, (a + n) // 4096)}
        want = {p for x in v for p in range((table + x * row) // 4096, (table + (x + 1) * row) // 4096)}
        assert got == want
    assert eng.stats.values_launches == 24 and eng.stats.values_bytes == 24 * 12 and eng.stats.values_errors == 0


def test_what_the_buffer_holds_is_what_is_prefetched(gather):
    """Nothing written into the ids buffer: the copy reads zeros, and row 0 is prefetched (the
    prediction follows the values read at run time, not the trace's)."""
    model, run = gather
    fake, eng = _setup(model, run)
    steps, _ = _drive(fake, eng, run, write=False)
    table = next(a for a in run.allocations.to_pylist() if a[T.BYTES] == 4 * 4096 * 2048)[T.ADDRESS]
    for r, log in steps:
        if "gather_rows" in r[T.KERNEL]:
            gpu = [(e[1], e[2]) for e in log if e[0] == "gpu" and table <= e[1] < table + 4 * 4096 * 2048]
            assert gpu == [(table, 4 * 2048)]


def test_a_failed_copy_is_counted_and_the_launch_goes_on(gather):
    model, run = gather
    fake, eng = _setup(model, run)

    def refuse(addr, nbytes, stream=0):
        raise RuntimeError("cuMemcpyDtoHAsync: CUDA_ERROR_ILLEGAL_ADDRESS")

    fake.copy_to_host = refuse
    _drive(fake, eng, run)
    st = eng.stats
    assert st.values_errors == 24 and st.errors == 0 and st.launches == run.n_launches
    assert "ILLEGAL_ADDRESS" in st.last_error


def test_policies_that_do_not_prefetch_predictions_read_no_values(gather):
    model, run = gather
    fake = FakeCuda()
    for a in run.allocations.to_pylist():
        fake.add_allocation(a[T.ADDRESS], a[T.BYTES])
    eng = E.Engine(fake, "demand", predict=GP.make_online_predict(model, "none"))
    _drive(fake, eng, run)
    assert not any(e[0] in ("event_sync", "dtoh") for e in fake.log) and eng.stats.values_launches == 0
    np.testing.assert_equal(eng.stats.prefetches, 0)
