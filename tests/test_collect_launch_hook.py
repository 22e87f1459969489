"""The launch hook on the CPU: decoding kernelParams / extra buffers and the
callback's dispatch (runtime and driver launches, nesting, re-entrancy), with
cupti-python's own parameter-struct views over hand-built memory."""

from __future__ import annotations

import ctypes
import struct
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagecast import trace as T
from pagecast.collect import launch_hook as lh


def _kernel_params(values: list[bytes]):
    """A void** array pointing at one buffer per parameter; returns (ptr, keepalive)."""
    bufs = [ctypes.create_string_buffer(v, len(v)) for v in values]
    arr = (ctypes.c_void_p * len(bufs))(*[ctypes.addressof(b) for b in bufs])
    return ctypes.addressof(arr), (bufs, arr)


def _extra(blob: bytes, *, with_size=True, with_end=True):
    buf = ctypes.create_string_buffer(blob, len(blob))
    size = ctypes.c_size_t(len(blob))
    entries = [lh.CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buf)]
    if with_size:
        entries += [lh.CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size)]
    if with_end:
        entries += [lh.CU_LAUNCH_PARAM_END]
    else:
        entries += [99, 0] * (lh._EXTRA_MAX_ENTRIES + 2)
    arr = (ctypes.c_void_p * len(entries))(*entries)
    return ctypes.addressof(arr), (buf, size, arr)


PTR = 0x7F00_1234_5000
P0 = struct.pack("<Q", PTR)
P1 = struct.pack("<i", 4096)
P2 = struct.pack("<f", 0.5)


def test_decode_kernel_params_packs_each_parameter_at_its_offset():
    ptr, keep = _kernel_params([P0, P1, P2])
    data = lh.decode_kernel_params(ptr, (0, 8, 12), (8, 4, 4))
    assert data == P0 + P1 + P2
    # alignment gaps stay zero: an int followed by a pointer at offset 8
    ptr, keep = _kernel_params([P1, P0])
    data = lh.decode_kernel_params(ptr, (0, 8), (4, 8))
    assert data == P1 + b"\0" * 4 + P0
    assert lh.decode_kernel_params(0, (), ()) == b""


def test_decode_kernel_params_refuses_bad_input():
    ptr, keep = _kernel_params([P0])
    with pytest.raises(ValueError):
        lh.decode_kernel_params(ptr, (0, 8), (8,))
    with pytest.raises(ValueError):
        lh.decode_kernel_params(0, (0,), (8,))
    nulls = (ctypes.c_void_p * 1)(0)
    with pytest.raises(ValueError):
        lh.decode_kernel_params(ctypes.addressof(nulls), (0,), (8,))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 4, 8, 16, 24, 40]), min_size=1, max_size=24), st.randoms(use_true_random=False),
       st.booleans())
def test_compiled_gather_matches_the_ctypes_peer(sizes, rnd, null_one):
    """The compiled gather (param_gather) and the ctypes decoder agree on any layout: naturally
    aligned parameters in order (as the driver lays them out), any bytes, and a null entry."""
    values = [bytes(rnd.getrandbits(8) for _ in range(n)) for n in sizes]
    offsets, at = [], 0
    for n in sizes:
        a = min(n, 8)
        at = -(-at // a) * a
        offsets.append(at)
        at += n
    ptr, keep = _kernel_params(values)
    if null_one:
        i = rnd.randrange(len(sizes))
        ctypes.c_void_p.from_address(ptr + 8 * i).value = None
        with pytest.raises(ValueError, match=rf"kernelParams\[{i}\] is null"):
            lh.decode_kernel_params(ptr, offsets, sizes)
        with pytest.raises(ValueError, match=rf"kernelParams\[{i}\] is null"):
            lh.decode_kernel_params_ctypes(ptr, offsets, sizes)
        return
    data = lh.decode_kernel_params(ptr, offsets, sizes)
    assert data == lh.decode_kernel_params_ctypes(ptr, offsets, sizes)
    assert len(data) == offsets[-1] + sizes[-1]
    assert all(data[o:o + len(v)] == v for o, v in zip(offsets, values))


def test_gather_refuses_implausible_layouts():
    ptr, keep = _kernel_params([P0])
    with pytest.raises(ValueError, match="implausible"):
        lh.decode_kernel_params(ptr, (-8,), (8,))
    with pytest.raises(ValueError, match="implausible"):
        lh.decode_kernel_params(ptr, (0,), (1 << 30,))


def test_decode_extra_reads_the_buffer_pointer_and_size():
    blob = P0 + P1 + P2 + b"\x01\x02\x03\x04"
    ptr, keep = _extra(blob)
    assert lh.decode_extra(ptr) == blob
    ptr, keep = _extra(b"")
    assert lh.decode_extra(ptr) == b""


def test_decode_extra_refuses_malformed_arrays():
    ptr, keep = _extra(P0, with_size=False)
    with pytest.raises(ValueError, match="BUFFER_SIZE"):
        lh.decode_extra(ptr)
    ptr, keep = _extra(P0, with_end=False)
    with pytest.raises(ValueError, match="END"):
        lh.decode_extra(ptr)
    with pytest.raises(ValueError):
        lh.decode_extra(0)


def test_launch_config_structs_match_the_c_layouts():
    # cuda.h: seven unsigned ints, then CUstream at 32, attrs at 40, numAttrs at 48
    assert lh.CUlaunchConfig.hStream.offset == 32
    assert lh.CUlaunchConfig.attrs.offset == 40
    assert ctypes.sizeof(lh.CUlaunchConfig) == 56
    # cuda_runtime_api.h: dim3 grid, dim3 block, size_t smem at 24, stream at 32
    assert lh.CudaLaunchConfig.dynamicSmemBytes.offset == 24
    assert lh.CudaLaunchConfig.stream.offset == 32
    c = lh.CUlaunchConfig(4, 2, 1, 256, 1, 1, 1024, 0xABC, None, 0)
    assert lh.read_cu_launch_config(ctypes.addressof(c)) == ((4, 2, 1), (256, 1, 1), 1024, 0xABC)
    r = lh.CudaLaunchConfig(lh._Dim3(8, 1, 1), lh._Dim3(32, 4, 1), 48, 0xDEF, None, 0)
    assert lh.read_cuda_launch_config(ctypes.addressof(r)) == ((8, 1, 1), (32, 4, 1), 48, 0xDEF)


def test_launch_args_row_and_param_slices():
    a = lh.LaunchArgs(kernel="k", function=1, grid_x=2, grid_y=1, grid_z=1, block_x=64, block_y=1, block_z=1,
                      shared_mem_bytes=0, stream=0x55, correlation_id=7, param_offsets=(0, 8),
                      param_sizes=(8, 4), param_data=P0 + P1, stream_id=3, device=0)
    assert a.param(1) == P1 and a.grid == (2, 1, 1) and a.block == (64, 1, 1)
    row = a.to_row(5, start_ns=10, end_ns=20)
    assert row[T.LAUNCH_ID] == 5 and row[T.STREAM] == 3 and row[T.PARAM_DATA] == P0 + P1
    assert set(row) == set(T.SCHEMAS[T.LAUNCHES].names)
    T.to_table(T.LAUNCHES, {k: [v] for k, v in row.items()})  # fits the schema
    b = lh.LaunchArgs.from_row(row)                             # and back, as replays hand traced launches over
    assert (b.kernel, b.grid, b.block, b.param_offsets, b.param_sizes, b.param_data, b.launch_id) == \
        (a.kernel, a.grid, a.block, a.param_offsets, a.param_sizes, a.param_data, 5)
    assert b.to_row(5, start_ns=10, end_ns=20) == {**row, T.STREAM: 0}


# ---- dispatch through the callback, with cupti-python's param views ----------

cupti_mod = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")


def _struct(dtype_name: str, **fields):
    dt = getattr(cupti_mod, dtype_name)
    rec = np.zeros(1, dtype=dt)
    for k, v in fields.items():
        if isinstance(v, tuple):  # dim3
            rec[k] = np.frombuffer(struct.pack("<3I", *v), dtype=dt.fields[k][0])
        else:
            rec[k] = v
    return rec, rec.ctypes.data


def _cb(site, corr, params_ptr, symbol="vec_add", context=0):
    return SimpleNamespace(callback_site=site, correlation_id=corr, function_params=params_ptr,
                           symbol_name=symbol, context=context)


def _hook(**kw):
    got = []
    info = lh.ParamInfo(layout_fn=lambda h: ((0, 8, 12), (8, 4, 4)),
                        name_fn=lambda h: "_Z7vec_addPfS_if" if h == 0xF00 else f"<function {h:#x}>",
                        symbol_fn=lambda host: 0xF00 if host == 0xBEEF else 0)
    hook = lh.LaunchHook(got.append, param_info=info, clock=lambda: 123, **kw)
    return hook, got


def test_driver_launch_is_decoded_at_api_enter():
    kp, keep = _kernel_params([P0, P1, P2])
    rec, ptr = _struct("cu_launch_kernel_params_dtype", f=0xF00, grid_dim_x=16, grid_dim_y=2, grid_dim_z=1,
                       block_dim_x=128, block_dim_y=1, block_dim_z=1, shared_mem_bytes=256, h_stream=0x77,
                       kernel_params=kp, extra=0)
    events = []
    hook, got = _hook(before_launch=lambda: events.append("before"),
                      after_launch=lambda a: events.append(("after", a.correlation_id)))
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_ENTER, 41, ptr))
    assert len(got) == 1
    a = got[0]
    assert (a.kernel, a.function, a.grid, a.block, a.shared_mem_bytes, a.stream) == \
        ("_Z7vec_addPfS_if", 0xF00, (16, 2, 1), (128, 1, 1), 256, 0x77)  # the driver's (mangled) name
    assert a.param_data == P0 + P1 + P2 and a.param_offsets == (0, 8, 12) and a.param_sizes == (8, 4, 4)
    assert a.correlation_id == 41 and a.correlation_ids == [41] and a.host_ns == 123
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_EXIT, 41, ptr))
    assert events == ["before", ("after", 41)]
    assert hook.errors == 0 and hook.launches == 1


def test_driver_launch_with_extra_buffer_and_ex_config():
    blob = P0 + P1 + P2
    ex, keep = _extra(blob)
    cfg = lh.CUlaunchConfig(3, 1, 1, 32, 1, 1, 0, 0x99, None, 0)
    rec, ptr = _struct("cu_launch_kernel_ex_params_dtype", config=ctypes.addressof(cfg), f=0xF01,
                       kernel_params=0, extra=ex)
    hook, got = _hook()
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernelEx_ptsz, _cb(lh.API_ENTER, 5, ptr, symbol="k_ex"))
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernelEx_ptsz, _cb(lh.API_EXIT, 5, ptr))
    assert hook.errors == 0, hook.last_error
    (a,) = got
    assert a.kernel == "k_ex"  # the driver has no name for this handle: the callback's symbol name
    assert a.grid == (3, 1, 1) and a.stream == 0x99 and a.param_data == blob and a.param(0) == P0


def test_runtime_launch_nested_driver_launch_is_delivered_once():
    kp, keep = _kernel_params([P0, P1, P2])
    rt, rt_ptr = _struct("cuda_launch_kernel_v7000params_dtype", func=0xBEEF, grid_dim=(4, 1, 1),
                         block_dim=(64, 1, 1), args=kp, shared_mem=0, stream=0)
    drv, drv_ptr = _struct("cu_launch_kernel_params_dtype", f=0xF00, grid_dim_x=4, grid_dim_y=1, grid_dim_z=1,
                           block_dim_x=64, block_dim_y=1, block_dim_z=1, kernel_params=kp)
    after = []
    hook, got = _hook(after_launch=after.append)
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_ENTER, 10, rt_ptr))
    assert got == []  # held: a driver launch may follow
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel_ptsz, _cb(lh.API_ENTER, 11, drv_ptr))
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel_ptsz, _cb(lh.API_EXIT, 11, drv_ptr))
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_EXIT, 10, rt_ptr))
    assert hook.errors == 0, hook.last_error
    (a,) = got
    assert a.domain == lh.DOMAIN_DRIVER and a.correlation_id == 10 and a.correlation_ids == [10, 11]
    assert a.param_data == P0 + P1 + P2 and after == [a]


def test_runtime_only_launch_is_delivered_at_exit():
    kp, keep = _kernel_params([P0, P1, P2])
    rt, rt_ptr = _struct("cuda_launch_kernel_v7000params_dtype", func=0xBEEF, grid_dim=(4, 2, 1),
                         block_dim=(64, 1, 1), args=kp, shared_mem=16, stream=0x31)
    hook, got = _hook()
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_ENTER, 20, rt_ptr))
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_EXIT, 20, rt_ptr))
    (a,) = got
    assert a.domain == lh.DOMAIN_RUNTIME and a.function == 0xF00 and a.grid == (4, 2, 1)
    assert a.shared_mem_bytes == 16 and a.stream == 0x31 and a.param_data == P0 + P1 + P2


def test_reentrant_callbacks_and_failures_never_reach_cuda():
    kp, keep = _kernel_params([P0, P1, P2])
    rec, ptr = _struct("cu_launch_kernel_params_dtype", f=0xF00, grid_dim_x=1, grid_dim_y=1, grid_dim_z=1,
                       block_dim_x=1, block_dim_y=1, block_dim_z=1, kernel_params=kp)
    seen = []
    hook = None

    def on_launch(a):
        seen.append(a)
        # a driver call made from inside the callback re-enters CUPTI: ignored
        hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_ENTER, 99, ptr))
        raise RuntimeError("consumer failed")

    info = lh.ParamInfo(layout_fn=lambda h: ((0, 8, 12), (8, 4, 4)), name_fn=str, symbol_fn=int)
    hook = lh.LaunchHook(on_launch, param_info=info, clock=lambda: 0)
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_ENTER, 1, ptr))
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_EXIT, 1, ptr))
    assert len(seen) == 1 and hook.errors == 1 and "consumer failed" in hook.last_error
    # other cbids are ignored; a layout failure is counted, not raised
    hook._callback(None, lh.DOMAIN_DRIVER, 1234, _cb(lh.API_ENTER, 2, ptr))
    bad = lh.LaunchHook(seen.append, param_info=lh.ParamInfo(layout_fn=lambda h: 1 / 0), clock=lambda: 0)
    bad._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_ENTER, 3, ptr))
    bad._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_EXIT, 3, ptr))
    assert bad.errors == 1 and len(seen) == 1


def test_runtime_decode_is_skipped_once_runtime_launches_reach_the_driver():
    kp, keep = _kernel_params([P0, P1, P2])
    rt, rt_ptr = _struct("cuda_launch_kernel_v7000params_dtype", func=0xBEEF, grid_dim=(4, 1, 1),
                         block_dim=(64, 1, 1), args=kp)
    drv, drv_ptr = _struct("cu_launch_kernel_params_dtype", f=0xF00, grid_dim_x=4, grid_dim_y=1, grid_dim_z=1,
                           block_dim_x=64, block_dim_y=1, block_dim_z=1, kernel_params=kp)
    lookups = []

    def symbol(host):
        lookups.append(host)
        raise RuntimeError("no runtime here")  # a failed runtime decode is not an error when the driver follows

    got = []
    info = lh.ParamInfo(layout_fn=lambda h: ((0, 8, 12), (8, 4, 4)), name_fn=lambda h: "k", symbol_fn=symbol)
    hook = lh.LaunchHook(got.append, param_info=info, clock=lambda: 0)
    for corr in (10, 20):
        hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_ENTER, corr, rt_ptr))
        hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_ENTER, corr + 1, drv_ptr))
        hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_EXIT, corr + 1, drv_ptr))
        hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_EXIT, corr, rt_ptr))
    assert hook.errors == 0 and hook.runtime_reaches_driver is True
    assert [a.correlation_ids for a in got] == [[10, 11], [20, 21]]
    assert lookups == [0xBEEF]  # the second launch was not decoded at the runtime level
    # a runtime launch with no driver callback inside: one launch lost, then runtime decoding again
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_ENTER, 30, rt_ptr))
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_EXIT, 30, rt_ptr))
    assert hook.runtime_reaches_driver is False and hook.errors == 1 and len(got) == 2


def test_host_stubs_are_resolved_by_the_loaded_cuda_runtime(tmp_path, monkeypatch):
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    src = tmp_path / "rt.c"
    src.write_text("int cudaGetFuncBySymbol(void **f, const void *sym) {\n"
                   "  if (!sym) return 1; *f = (void *)((unsigned long)sym + 0x1000); return 0; }\n")
    so = tmp_path / "libcudart_standin.so.13"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    monkeypatch.setattr(lh, "_CUDART_LIBS", None)
    if not any("libcudart" in ln for ln in open("/proc/self/maps")):  # no CUDA runtime loaded yet
        with pytest.raises(RuntimeError, match="cudaGetFuncBySymbol"):
            lh._runtime_func_by_symbol(0xBEEF)
    lib = ctypes.CDLL(str(so))  # the application loads its runtime
    monkeypatch.setattr(lh, "_CUDART_LIBS", None)
    assert lh._runtime_func_by_symbol(0xBEEF) == 0xBEEF + 0x1000
    del lib


# ---- through cupti-python's own C callback wrapper ----------------------------------

def _cupti_callback_wrapper():
    """cupti-python's C function that CUPTI calls (callback_wrappers.callbackFuncWrapper) and
    the dict holding the Python callback it dispatches to, or a skip if this version differs."""
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
    except Exception as e:  # noqa: BLE001 - internals of this cupti-python version
        pytest.skip(f"cupti-python's callback wrapper is not reachable here ({type(e).__name__}: {e})")
    return fn, callbacks


def test_callbacks_delivered_by_cupti_pythons_wrapper_are_decoded():
    # What CUPTI calls is cupti-python's C wrapper: it wraps the C CUpti_CallbackData in a
    # cupti.CallbackData and calls the Python function `subscribe` stored, with
    # (userdata, domain, cbid, cbdata). Drive the hook through that real wrapper with a
    # real CUpti_CallbackData and real launch-parameter structs.
    wrapper, callbacks = _cupti_callback_wrapper()
    kp, keep = _kernel_params([P0, P1, P2])
    rec, ptr = _struct("cu_launch_kernel_params_dtype", f=0xF00, grid_dim_x=16, grid_dim_y=2, grid_dim_z=1,
                       block_dim_x=128, block_dim_y=1, block_dim_z=1, shared_mem_bytes=256, h_stream=0x77,
                       kernel_params=kp, extra=0)
    cbd = cupti_mod.CallbackData()
    cbd.correlation_id = 41
    cbd.function_params = ptr
    hook, got = _hook()
    saved = dict(callbacks)
    userdata = None  # what LaunchHook.start passes to subscribe
    try:
        callbacks["callbackFunc"] = hook._callback  # what cupti.subscribe(hook._callback, None) stores
        for site in (lh.API_ENTER, lh.API_EXIT):
            cbd.callback_site = site
            wrapper(id(userdata), lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, cbd.ptr)
    finally:
        callbacks.clear()
        callbacks.update(saved)
    assert hook.errors == 0, hook.last_error
    (a,) = got
    assert (a.kernel, a.grid, a.block, a.shared_mem_bytes, a.stream) == \
        ("_Z7vec_addPfS_if", (16, 2, 1), (128, 1, 1), 256, 0x77)
    assert a.param_data == P0 + P1 + P2 and a.correlation_id == 41


def test_cupti_python_keeps_one_python_callback_per_process():
    # The reason LaunchHook.start refuses a second running hook: subscribe replaces it.
    wrapper, callbacks = _cupti_callback_wrapper()
    saved = dict(callbacks)
    seen, subs = [], []
    try:
        for tag in ("first", "second"):
            try:
                subs.append(cupti_mod.subscribe(lambda u, d, c, data, tag=tag: seen.append((tag, d, c)), None))
            except Exception:  # no driver here: subscribe stores the function, then fails in CUPTI
                pass
        cbd = cupti_mod.CallbackData()
        wrapper(id(None), lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, cbd.ptr)
    finally:
        for sub in subs:  # with a driver, real subscribers: leave none behind
            cupti_mod.unsubscribe(sub)
        callbacks.clear()
        callbacks.update(saved)
    assert seen == [("second", lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel)]


def test_runtime_launches_are_delivered_at_enter_once_they_are_seen_not_to_reach_the_driver():
    # the runner prefetches in on_launch: a delivery at the runtime call's exit comes after the
    # kernel is queued, too late; only the first runtime launch has to wait to find out
    kp, keep = _kernel_params([P0, P1, P2])
    rt, rt_ptr = _struct("cuda_launch_kernel_v7000params_dtype", func=0xBEEF, grid_dim=(4, 1, 1),
                         block_dim=(64, 1, 1), args=kp, shared_mem=0, stream=0x31)
    hook, got = _hook()
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_ENTER, 40, rt_ptr))
    assert got == []
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_EXIT, 40, rt_ptr))
    assert len(got) == 1 and hook.runtime_reaches_driver is False
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_ENTER, 41, rt_ptr))
    assert len(got) == 2 and got[1].correlation_id == 41 and got[1].param_data == P0 + P1 + P2
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_EXIT, 41, rt_ptr))
    assert len(got) == 2 and hook.errors == 0 and hook.launches == 2
    # should a driver callback turn up inside a later runtime launch after all, it is not delivered twice
    drv, drv_ptr = _struct("cu_launch_kernel_params_dtype", f=0xF00, grid_dim_x=4, grid_dim_y=1, grid_dim_z=1,
                           block_dim_x=64, block_dim_y=1, block_dim_z=1, kernel_params=kp)
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_ENTER, 50, rt_ptr))
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_ENTER, 51, drv_ptr))
    hook._callback(None, lh.DOMAIN_DRIVER, lh.CB_cuLaunchKernel, _cb(lh.API_EXIT, 51, drv_ptr))
    hook._callback(None, lh.DOMAIN_RUNTIME, lh.CB_cudaLaunchKernel, _cb(lh.API_EXIT, 50, rt_ptr))
    assert len(got) == 3 and got[2].correlation_ids == [50, 51] and hook.errors == 0
