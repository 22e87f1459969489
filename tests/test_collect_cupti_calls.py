"""The CUPTI calls the collector makes, with cupti-python's functions replaced by
recorders (its classes, enums and parameter structs are the real ones): which
callbacks the hook enables, how the unified-memory counters are configured,
what happens when CUPTI says they are unsupported, dropped-record counting."""

from __future__ import annotations

import ctypes

import pytest

from pagecast.collect import activity as A
from pagecast.collect import convert as C
from pagecast.collect import launch_hook as lh
from pagecast.collect import managed as M

from collect_standin import kernel_record, um_record

cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")


class Recorder:
    def __init__(self, monkeypatch, um_error=None, refuse=None):
        self.calls = []
        self.refuse = dict(refuse or {})   # counter kind -> the CUPTI status a call naming it gets
        self.configs = []                  # every configure call's elements
        self.callbacks = None
        self.um_error = um_error
        self.pending = []
        for name in ("activity_enable", "activity_disable", "enable_callback", "unsubscribe"):
            monkeypatch.setattr(cupti, name, self._rec(name))
        monkeypatch.setattr(cupti, "subscribe_v2", self.subscribe_v2)
        monkeypatch.setattr(cupti, "activity_register_callbacks", self.register)
        monkeypatch.setattr(cupti, "activity_configure_unified_memory_counter", self.configure)
        monkeypatch.setattr(cupti, "activity_flush_all", self.flush)
        monkeypatch.setattr(cupti, "activity_get_num_dropped_records", self.dropped)

    def _rec(self, name):
        def f(*a):
            self.calls.append((name, *[int(x) for x in a]))
        return f

    def subscribe_v2(self, callback, userdata, p_params):
        p = cupti.SubscriberParams.from_ptr(p_params, readonly=True)
        dt = cupti._subscriber_params_dtype  # the C struct's layout: read the byte CUPTI reads
        allow = ctypes.c_uint8.from_address(p_params + dt.fields["allow_multiple_subscribers"][1]).value
        self.calls.append(("subscribe_v2", p.subscriber_name, int(p.struct_size), int(allow)))
        self.callback = callback
        return 0xC0FFEE

    def register(self, requested, completed):
        self.callbacks = (requested, completed)

    def configure(self, ptr, n):
        arr = (ctypes.c_uint32 * (4 * n)).from_address(ptr)  # scope, kind, device_id, enable per element
        self.config = [tuple(arr[4 * i:4 * i + 4]) for i in range(n)]
        self.configs.append(self.config)
        if self.um_error is not None:
            raise cupti.cuptiError(self.um_error)
        for e in self.config:   # CUPTI refuses the whole call when one kind is unsupported
            if e[1] in self.refuse:
                raise cupti.cuptiError(self.refuse[e[1]])

    def flush(self, flag):
        self.calls.append(("activity_flush_all", int(flag)))
        batch, self.pending = self.pending, []
        if batch:
            self.callbacks[1](batch)

    def dropped(self, context, stream, ptr):
        ctypes.c_size_t.from_address(ptr).value = 5


def test_hook_subscribes_and_enables_exactly_the_launch_callbacks(monkeypatch):
    r = Recorder(monkeypatch)
    tracker = M.ManagedTracker(M.ManagedBudget(None))
    hook = lh.LaunchHook(lambda a: None, api_callbacks=tracker.callbacks()).start()
    sub = [c for c in r.calls if c[0] == "subscribe_v2"]
    assert sub == [("subscribe_v2", "pagecast", cupti.SUBSCRIBER_PARAMS_SIZE, 1)]
    on = sorted((c[3], c[4]) for c in r.calls if c[0] == "enable_callback" and c[1] == 1)
    want = sorted([(1, c) for c in lh.DRIVER_LAUNCH_CBIDS] + [(2, c) for c in lh.RUNTIME_LAUNCH_CBIDS]
                  + list(tracker.callbacks()))
    assert on == want
    assert all(c[2] == 0xC0FFEE for c in r.calls if c[0] == "enable_callback")
    # the cbids are cupti-python's own
    D, R = cupti.driver_api_trace_cbid, cupti.runtime_api_trace_cbid
    assert {D.cuLaunchKernel, D.cuLaunchKernel_ptsz, D.cuLaunchKernelEx, D.cuLaunchKernelEx_ptsz,
            D.cuLaunchCooperativeKernel, D.cuLaunchCooperativeKernel_ptsz} == set(lh.DRIVER_LAUNCH_CBIDS)
    # CUDA 13's __cudaLaunchKernel ids are private attributes of cupti-python's enum (name-mangled)
    v13 = {getattr(R, f"_{R.__name__}__cudaLaunchKernel_v13000"), getattr(R, f"_{R.__name__}__cudaLaunchKernel_ptsz_v13000")}
    assert {R.cudaLaunchKernel_v7000, R.cudaLaunchKernel_ptsz_v7000, R.cudaLaunchKernelExC_v11060,
            R.cudaLaunchKernelExC_ptsz_v11060, R.cudaLaunchCooperativeKernel_v9000,
            R.cudaLaunchCooperativeKernel_ptsz_v9000} | v13 == set(lh.RUNTIME_LAUNCH_CBIDS)
    assert (D.cuMemAllocManaged, D.cuMemFree_v2, R.cudaMallocManaged_v6000, R.cudaFree_v3020) == \
        (M.CB_cuMemAllocManaged, M.CB_cuMemFree_v2, M.CB_cudaMallocManaged, M.CB_cudaFree)
    assert int(cupti.CallbackDomain.DRIVER_API) == lh.DOMAIN_DRIVER
    assert int(cupti.ApiCallbackSite.API_EXIT) == lh.API_EXIT
    r.calls.clear()
    hook.stop()
    off = [c for c in r.calls if c[0] == "enable_callback"]
    assert len(off) == len(want) and all(c[1] == 0 for c in off)
    assert r.calls[-1] == ("unsubscribe", 0xC0FFEE)


class Refusing(Recorder):
    """CUPTI that cannot allow multiple subscribers here (CUPTI 13.5's beta mode on a 13.0 driver,
    once the activity API is enabled): v2 with allow=1 is refused; with `holder`, the plain subscribe is refused too (another tool holds CUPTI)."""

    def __init__(self, monkeypatch, holder=None):
        super().__init__(monkeypatch)
        self.holder = holder
        monkeypatch.setattr(cupti, "subscribe", self.subscribe)

    def subscribe_v2(self, callback, userdata, p_params):
        super().subscribe_v2(callback, userdata, p_params)
        raise cupti.cuptiError(int(cupti.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED))

    def subscribe(self, callback, userdata):
        self.calls.append(("subscribe",))
        if self.holder:
            raise cupti.cuptiError(int(cupti.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED))
        return 0xBEEF


def test_where_cupti_cannot_allow_other_subscribers_the_hook_subscribes_as_the_only_one(monkeypatch):
    r = Refusing(monkeypatch)
    hook = lh.LaunchHook(lambda a: None).start()
    try:
        assert [c[0] for c in r.calls if c[0].startswith("subscribe")] == ["subscribe_v2", "subscribe"]
        assert all(c[2] == 0xBEEF for c in r.calls if c[0] == "enable_callback")
        assert hook.subscribe_mode == "single (CUPTI could not allow others here)"
    finally:
        hook.stop()
    assert r.calls[-1] == ("unsubscribe", 0xBEEF)
    # and it can start again (the process-wide slot was released)
    lh.LaunchHook(lambda a: None).start().stop()


def test_another_tool_holding_cupti_is_one_clear_error_naming_it(monkeypatch):
    from pagecast.errors import PagecastError
    Refusing(monkeypatch, holder=True)
    with pytest.raises(PagecastError, match=r"holds CUPTI and allows no other subscriber.*Nsight Systems") as e:
        lh.LaunchHook(lambda a: None).start()
    assert e.value.exit_code == 2
    assert lh.LaunchHook._running is None


def test_a_second_hook_cannot_start_while_one_runs(monkeypatch):
    # cupti-python hands every subscriber's callbacks to the Python function subscribed
    # last (test_collect_launch_hook shows it), so a second running hook would steal the
    # first one's launches.
    Recorder(monkeypatch)
    first = lh.LaunchHook(lambda a: None).start()
    with pytest.raises(RuntimeError, match="another launch hook"):
        lh.LaunchHook(lambda a: None).start()
    first.stop()
    second = lh.LaunchHook(lambda a: None).start()  # free again once the first stopped
    second.stop()


def test_a_hook_that_fails_to_enable_its_callbacks_unsubscribes(monkeypatch):
    r = Recorder(monkeypatch)

    def enable_fails(*a):
        raise cupti.cuptiError(1)

    monkeypatch.setattr(cupti, "enable_callback", enable_fails)
    with pytest.raises(cupti.cuptiError):
        lh.LaunchHook(lambda a: None).start()
    assert ("unsubscribe", 0xC0FFEE) in r.calls
    monkeypatch.setattr(cupti, "enable_callback", r._rec("enable_callback"))
    lh.LaunchHook(lambda a: None).start().stop()  # nothing left running


def test_activity_source_configures_every_counter_and_delivers_snapshots(monkeypatch):
    r = Recorder(monkeypatch)
    drv = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install .[test])")
    monkeypatch.setattr(drv, "cuInit", lambda flags: (r.calls.append(("cuInit", flags)), (drv.CUresult(0),))[1])
    got = []
    src = A.CuptiActivitySource(device=0)
    src.start(got.extend)
    # the driver is initialized (no context) before anything is enabled: NOT_READY otherwise
    assert r.calls[0] == ("cuInit", 0)
    enabled = [c[1] for c in r.calls if c[0] == "activity_enable"]
    assert enabled == [C.KIND_CONCURRENT_KERNEL, C.KIND_MEMORY2, C.KIND_UNIFIED_MEMORY_COUNTER]
    # every element set: (scope PROCESS_SINGLE_DEVICE, kind, device 0, enable 1)
    assert [e[1] for e in r.config] == list(C.UM_COUNTER_KINDS)
    assert all(e[0] == 1 and e[2] == 0 and e[3] == 1 for e in r.config)
    assert src.info["uvm_counters"] is True
    assert r.callbacks[0]() == (A.CuptiActivitySource.BUFFER_BYTES, 0)
    r.pending = [kernel_record(name="k", start=1, end=2, grid=(1, 1, 1), block=(32, 1, 1), smem=0, corr=3),
                 um_record(counter_kind=C.UM_GPU_PAGE_FAULT, value=1, start=5, end=0, address=4096, flags=1)]
    src.flush(True)
    assert ("activity_flush_all", 1) in r.calls
    assert [type(x).__name__ for x in got] == ["KernelRec", "UMRec"]
    assert src.dropped() == 5 and src.dropped() == 10  # CUPTI counts since the previous call
    src.stop()
    assert [c[1] for c in r.calls if c[0] == "activity_disable"] == enabled[::-1]


@pytest.mark.parametrize("status", [27, 28, 29, 30, 31, 33, 35, 40, 41, 43, 1])
def test_unsupported_unified_memory_profiling_is_reported_not_fatal(monkeypatch, status):
    # 28-31: no UM profiling here; 33/40 virtualized, 35 unprivileged, 41 confidential computing,
    # 43 MIG: CUPTI refuses every kind, and kernels and allocations are still collected
    r = Recorder(monkeypatch, um_error=status)
    src = A.CuptiActivitySource()
    src.start(lambda recs: None)
    assert src.info["uvm_counters"] is False and f"CUPTI error {status}" in src.info["uvm_counters_error"]
    enabled = [c[1] for c in r.calls if c[0] == "activity_enable"]
    assert enabled == [C.KIND_CONCURRENT_KERNEL, C.KIND_MEMORY2]
    assert src.info["uvm_counters_refused"] == {str(k): status for k in sorted(C.UM_COUNTER_KINDS)}


def test_one_unsupported_counter_kind_leaves_the_others_on(monkeypatch):
    # error 30 (UM profiling not supported on non-P2P devices) for one kind refuses the whole
    # call that names it: the faults must not go with it
    refused = C.UM_BYTES_TRANSFER_DTOD
    r = Recorder(monkeypatch, refuse={refused: 30})
    src = A.CuptiActivitySource()
    src.start(lambda recs: None)
    assert src.info["uvm_counters"] is True
    assert src.info["uvm_counters_refused"] == {str(refused): 30}
    want = [k for k in C.UM_COUNTER_KINDS if k != refused]
    assert src.info["uvm_counters_enabled"] == want
    # the last call configures every kind CUPTI took, together (right whether calls add or replace)
    assert [e[1] for e in r.configs[-1]] == want and all(e[3] == 1 for e in r.configs[-1])
    assert C.KIND_UNIFIED_MEMORY_COUNTER in [c[1] for c in r.calls if c[0] == "activity_enable"]
    assert C.UM_GPU_PAGE_FAULT in want


def test_enabling_the_counters_refused_is_not_fatal(monkeypatch):
    r = Recorder(monkeypatch)

    def enable(kind):
        if int(kind) == C.KIND_UNIFIED_MEMORY_COUNTER:
            raise cupti.cuptiError(35)
        r.calls.append(("activity_enable", int(kind)))

    monkeypatch.setattr(cupti, "activity_enable", enable)
    src = A.CuptiActivitySource()
    src.start(lambda recs: None)
    assert src.info["uvm_counters"] is False and "35" in src.info["uvm_counters_error"]
    src.stop()
    assert [c[1] for c in r.calls if c[0] == "activity_disable"] == [C.KIND_MEMORY2, C.KIND_CONCURRENT_KERNEL]


def test_buffer_callback_errors_never_reach_cupti(monkeypatch):
    Recorder(monkeypatch)
    src = A.CuptiActivitySource()

    def boom(recs):
        raise ValueError("sink failed")

    src.start(boom)
    src._buffer_completed([kernel_record(name="k", start=1, end=2, grid=(1, 1, 1), block=(1, 1, 1), smem=0, corr=1)])
    assert src.callback_errors == 1 and "sink failed" in src.last_callback_error


def test_tracker_reads_driver_and_runtime_allocation_structs():
    import numpy as np
    from types import SimpleNamespace

    budget = M.ManagedBudget(1 << 20)
    seen = []
    tr = M.ManagedTracker(budget, on_violation=seen.append)
    cb = tr.callbacks()
    out = ctypes.c_uint64(0)
    ok = ctypes.c_int(0)

    def call(domain, cbid, dtype, site, **fields):
        rec = np.zeros(1, dtype=getattr(cupti, dtype))
        for k, v in fields.items():
            rec[k] = v
        cb[(domain, cbid)](site, SimpleNamespace(function_params=rec.ctypes.data,
                                                 function_return_value=ctypes.addressof(ok)))

    drv = (lh.DOMAIN_DRIVER, M.CB_cuMemAllocManaged, "cu_mem_alloc_managed_params_dtype")
    call(*drv, lh.API_ENTER, dptr=ctypes.addressof(out), bytesize=4096, flags_=1)
    out.value = 0x7000_0000
    call(*drv, lh.API_EXIT, dptr=ctypes.addressof(out), bytesize=4096, flags_=1)
    # the runtime call wrapping the same allocation is not counted twice
    call(lh.DOMAIN_RUNTIME, M.CB_cudaMallocManaged, "cuda_malloc_managed_v6000params_dtype", lh.API_EXIT,
         dev_ptr=ctypes.addressof(out), size_=4096, flags_=1)
    assert budget.ranges() == [(0x7000_0000, 4096)] and budget.live_bytes == 4096
    # a failed call adds nothing
    ok.value = 2
    out.value = 0x7100_0000
    call(*drv, lh.API_EXIT, dptr=ctypes.addressof(out), bytesize=8192, flags_=1)
    ok.value = 0
    assert budget.live_bytes == 4096
    # past the limit: reported at enter
    call(*drv, lh.API_ENTER, dptr=ctypes.addressof(out), bytesize=1 << 20, flags_=1)
    assert len(seen) == 1 and "past the managed limit" in seen[0]
    call(lh.DOMAIN_DRIVER, M.CB_cuMemFree_v2, "cu_mem_free_v2params_dtype", lh.API_ENTER, dptr=0x7000_0000)
    assert budget.ranges() == [] and budget.peak == 4096


def test_the_replay_monitor_initializes_the_driver_before_enabling_the_counters(monkeypatch):
    # on an H200 (driver 580.159, CUPTI 13.5) enabling the unified-memory counter activity before
    # cuInit answered NOT_READY, and `replay --backend gpu` and `calibrate` lost their fault counts
    from pagecast.replay.gpu.cupti_monitor import CuptiMonitor

    r = Recorder(monkeypatch)
    drv = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install .[test])")
    monkeypatch.setattr(drv, "cuInit", lambda flags: (r.calls.append(("cuInit", flags)), (drv.CUresult(0),))[1])
    m = CuptiMonitor(0)
    m.start()
    try:
        first_enable = next(i for i, c in enumerate(r.calls) if c[0] == "activity_enable")
        assert ("cuInit", 0) in r.calls[:first_enable]
        assert C.KIND_UNIFIED_MEMORY_COUNTER in [c[1] for c in r.calls if c[0] == "activity_enable"]
    finally:
        m.stop()
