"""CUPTI records -> trace rows: field names, joins, numbering, allocations, attribution."""

from __future__ import annotations

import pytest

from pagecast import trace as T
from pagecast.collect import convert as C
from pagecast.collect.launch_hook import LaunchArgs

from collect_standin import kernel_record, memory_record, um_record


def _args(corr, host_ns, kernel="k", params=b"\x01" * 8):
    return LaunchArgs(kernel=kernel, function=1, grid_x=4, grid_y=1, grid_z=1, block_x=128, block_y=1, block_z=1,
                      shared_mem_bytes=0, stream=0, correlation_id=corr, param_offsets=(0,), param_sizes=(8,),
                      param_data=params, host_ns=host_ns, correlation_ids=[corr])


def _krec(corr, start, end, name="_Z1kPf"):
    return kernel_record(name=name, start=start, end=end, grid=(4, 1, 1), block=(128, 1, 1), smem=0, corr=corr)


def _table(name, cols):
    return T.to_table(name, cols)


# ---- the stand-ins carry the real classes' field names -------------------------

def test_record_field_names_match_cupti_python_classes():
    cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install .[test])")
    for fields, classes in ((C.KERNEL_FIELDS, C.KERNEL_CLASSES), (C.MEMORY_FIELDS, C.MEMORY_CLASSES),
                            (C.UM_FIELDS, C.UM_CLASSES)):
        present = [c for c in classes if hasattr(cupti, c)]
        assert present, f"none of {classes} in cupti.cupti"
        for cls in present:
            missing = [f for f in fields if not hasattr(getattr(cupti, cls), f)]
            assert not missing, f"{cls} lacks {missing}"
    # ... and the stand-in records carry exactly those names
    assert set(vars(_krec(1, 0, 1))) == set(C.KERNEL_FIELDS)
    assert set(vars(memory_record(address=1, nbytes=1, memory_kind=5, op=1, timestamp=0, corr=1))) == set(C.MEMORY_FIELDS)
    assert set(vars(um_record(counter_kind=4, value=1, start=0, end=0, address=0, flags=1))) == set(C.UM_FIELDS)
    # the enumerations we hard-code are cupti-python's values
    assert int(cupti.ActivityKind.CONCURRENT_KERNEL) == C.KIND_CONCURRENT_KERNEL
    assert int(cupti.ActivityKind.MEMORY2) == C.KIND_MEMORY2
    assert int(cupti.ActivityKind.UNIFIED_MEMORY_COUNTER) == C.KIND_UNIFIED_MEMORY_COUNTER
    K = cupti.ActivityUnifiedMemoryCounterKind
    assert (int(K.GPU_PAGE_FAULT), int(K.BYTES_TRANSFER_HTOD), int(K.BYTES_TRANSFER_DTOH), int(K.BYTES_TRANSFER_DTOD),
            int(K.THRASHING), int(K.THROTTLING), int(K.REMOTE_MAP)) == (4, 1, 2, 8, 5, 6, 7)
    assert int(cupti.ActivityMemoryKind.MANAGED) == C.MEMORY_KIND_MANAGED
    assert int(cupti.ActivityMemoryOperationType.RELEASE) == C.MEMORY_OP_RELEASE
    assert {m.value: m.name.lower() for m in cupti.ActivityUnifiedMemoryAccessType if m.value} == C.ACCESS_OF_FLAGS
    assert {m.value: m.name.lower() for m in cupti.ActivityUnifiedMemoryMigrationCause if m.value} == C.CAUSE_OF_FLAGS


def test_snapshot_ignores_other_kinds():
    assert C.snapshot(_krec(3, 10, 20)) == C.KernelRec("_Z1kPf", 10, 20, (4, 1, 1), (128, 1, 1), 0, 3, 7, 0)
    assert C.snapshot(type("R", (), {"kind": 1})()) is None


# ---- launches ------------------------------------------------------------------

def test_launches_join_by_correlation_and_number_in_issue_order():
    b = C.RowBuilder("natural")
    for i, corr in enumerate((10, 12, 15)):
        b.add_launch(_args(corr, 100 * i, kernel=f"k{i}", params=bytes([i]) * 8))
    # kernel records arrive out of order, only for two of them
    b.add_records(C.snapshots([_krec(15, 500, 600), _krec(10, 100, 200)]))
    out = b.drain(now=0.0)
    t = _table(T.LAUNCHES, out[T.LAUNCHES])
    assert t.column(T.LAUNCH_ID).to_pylist() == [0]  # launch 1 has no record yet: 2 waits behind it
    b.add_records(C.snapshots([_krec(12, 300, 400)]))
    t = _table(T.LAUNCHES, b.drain(now=0.0)[T.LAUNCHES])
    assert t.column(T.LAUNCH_ID).to_pylist() == [1, 2]
    assert t.column(T.KERNEL).to_pylist() == ["k1", "k2"]
    assert t.column(T.START_NS).to_pylist() == [300, 500]
    assert t.column(T.PARAM_DATA).to_pylist() == [b"\x01" * 8, b"\x02" * 8]
    assert t.column(T.STREAM).to_pylist() == [7, 7]  # CUPTI's stream id from the record


def test_launch_without_kernel_record_is_released_after_timeout_or_at_the_end():
    b = C.RowBuilder("natural", launch_timeout_s=5.0)
    b.add_launch(_args(1, 0), now=0.0)
    assert T.LAUNCHES not in b.drain(now=4.0)
    t = _table(T.LAUNCHES, b.drain(now=6.0)[T.LAUNCHES])
    assert t.column(T.START_NS).to_pylist() == [None]
    b.add_launch(_args(2, 0), now=10.0)
    assert b.drain(now=10.0, final=True)[T.LAUNCHES][T.LAUNCH_ID] == [1]
    assert b.stats.launches_without_kernel_record == 2


def test_kernels_the_hook_did_not_see_still_become_launches():
    b = C.RowBuilder("natural")
    b.add_records(C.snapshots([_krec(5, 10, 20, name="graph_node")]))
    t = _table(T.LAUNCHES, b.drain(final=True)[T.LAUNCHES])
    assert t.column(T.KERNEL).to_pylist() == ["graph_node"]
    assert t.column(T.PARAM_DATA).to_pylist() == [b""] and t.column(T.PARAM_OFFSETS).to_pylist() == [[]]
    assert b.stats.launches_without_args == 1


def test_once_sealed_kernels_the_workload_ran_after_collection_stopped_are_left_out():
    # Seen on an H200: SIGTERM while the workload waited in a full-mode callback; the collector
    # stopped the hook and wrote the trace from its ticker thread while the workload launched on,
    # and 2,151 of the 4,146 launches were kernels run after the stop, with no arguments.
    b = C.RowBuilder("natural")
    b.add_launch(_args(1, 0))
    b.add_records(C.snapshots([_krec(2, 30, 40, name="graph_node")]))   # before the stop: kept
    b.seal(100)
    b.add_records(C.snapshots([_krec(1, 50, 60),                         # hooked before the stop: kept
                               _krec(3, 99, 101, name="late_but_started_before"),
                               _krec(4, 150, 160), _krec(5, 170, 180)]))  # after the stop: left out
    t = _table(T.LAUNCHES, b.drain(final=True)[T.LAUNCHES])
    assert t.column(T.START_NS).to_pylist() == [50, 30, 99]
    assert b.stats.kernels_after_stop == 2 and b.stats.launches_without_args == 2


def test_nested_runtime_and_driver_correlation_ids_join_the_same_launch():
    b = C.RowBuilder("natural")
    a = _args(20, 0)
    a.correlation_ids = [20, 21]  # runtime call 20 and the driver call 21 inside it
    b.add_launch(a)
    b.add_records(C.snapshots([_krec(21, 5, 9)]))
    t = _table(T.LAUNCHES, b.drain()[T.LAUNCHES])
    assert t.column(T.START_NS).to_pylist() == [5] and b.stats.launches_without_args == 0


# ---- allocations ----------------------------------------------------------------

def test_allocations_get_live_launch_ranges_from_correlation_order():
    b = C.RowBuilder("natural")
    recs = [memory_record(address=0x1000_0000, nbytes=1 << 20, memory_kind=C.MEMORY_KIND_MANAGED,
                          op=C.MEMORY_OP_ALLOCATION, timestamp=1, corr=1),
            memory_record(address=0x2000_0000, nbytes=1 << 20, memory_kind=C.MEMORY_KIND_DEVICE,
                          op=C.MEMORY_OP_ALLOCATION, timestamp=2, corr=2)]
    b.add_records(C.snapshots(recs))
    for corr in (10, 12, 14):
        b.add_launch(_args(corr, corr))
    b.add_records(C.snapshots([
        memory_record(address=0x1000_0000, nbytes=0, memory_kind=C.MEMORY_KIND_MANAGED, op=C.MEMORY_OP_RELEASE,
                      timestamp=50, corr=13),  # freed after launch 1 was issued, before launch 2
        memory_record(address=0x3000_0000, nbytes=4096, memory_kind=C.MEMORY_KIND_PINNED,
                      op=C.MEMORY_OP_ALLOCATION, timestamp=60, corr=30),  # after every launch
        memory_record(address=0x4000_0000, nbytes=4096, memory_kind=C.MEMORY_KIND_PAGEABLE,
                      op=C.MEMORY_OP_ALLOCATION, timestamp=61, corr=31),  # not tracked
    ]))
    assert b.live_bytes("managed") == 0 and b.live_bytes("device") == 1 << 20
    out = b.drain(final=True)
    t = _table(T.ALLOCATIONS, out[T.ALLOCATIONS]).sort_by(T.ALLOC_ID)
    assert t.column(T.KIND).to_pylist() == ["managed", "device", "host"]
    assert t.column(T.FIRST_LAUNCH).to_pylist() == [0, 0, 3]
    assert t.column(T.LAST_LAUNCH).to_pylist() == [1, None, None]
    assert t.column(T.FREE_NS).to_pylist() == [50, None, None]


def test_address_reuse_after_a_lost_release_and_empty_lifetimes():
    b = C.RowBuilder("natural")
    mk = dict(memory_kind=C.MEMORY_KIND_MANAGED, nbytes=8192)
    b.add_records(C.snapshots([memory_record(address=0xA000, op=C.MEMORY_OP_ALLOCATION, timestamp=1, corr=1, **mk)]))
    b.add_launch(_args(5, 5))
    # the same address allocated again with no release seen: the first one ended before
    b.add_records(C.snapshots([memory_record(address=0xA000, op=C.MEMORY_OP_ALLOCATION, timestamp=9, corr=9, **mk),
                               memory_record(address=0xB000, op=C.MEMORY_OP_ALLOCATION, timestamp=10, corr=10, **mk),
                               memory_record(address=0xB000, op=C.MEMORY_OP_RELEASE, timestamp=11, corr=11, **mk)]))
    t = _table(T.ALLOCATIONS, b.drain(final=True)[T.ALLOCATIONS]).sort_by(T.ALLOC_ID)
    assert t.column(T.FIRST_LAUNCH).to_pylist() == [0, 1]
    assert t.column(T.LAST_LAUNCH).to_pylist() == [0, None]
    assert b.stats.allocations_never_live == 1  # 0xB000 lived between launches only


# ---- unified memory --------------------------------------------------------------

def _um():
    return [
        um_record(counter_kind=C.UM_GPU_PAGE_FAULT, value=3, start=150, end=0, address=0x1000_1234, flags=2),
        um_record(counter_kind=C.UM_GPU_PAGE_FAULT, value=1, start=250, end=0, address=0x1000_5000, flags=9),
        um_record(counter_kind=C.UM_BYTES_TRANSFER_HTOD, value=65536, start=160, end=170, address=0x1000_0000, flags=2),
        um_record(counter_kind=C.UM_BYTES_TRANSFER_DTOH, value=4096, start=50, end=60, address=0x1000_0000, flags=4),
        um_record(counter_kind=C.UM_BYTES_TRANSFER_DTOD, value=0, start=50, end=60, address=0x1000_0000, flags=1),
        um_record(counter_kind=C.UM_THRASHING, value=8192, start=260, end=0, address=0x1000_6000, flags=0),
        um_record(counter_kind=C.UM_REMOTE_MAP, value=4096, start=170, end=0, address=0x1000_7000, flags=1),
        um_record(counter_kind=C.UM_CPU_PAGE_FAULT_COUNT, value=1, start=10, end=0, address=0x9000, flags=0),
    ]


def test_unified_memory_records_to_faults_migrations_and_events_full_mode():
    b = C.RowBuilder("full")
    b.add_launch(_args(1, 100))
    b.add_launch(_args(2, 200))
    b.add_records(C.snapshots(_um()))
    b.close_window(0, 100, 199)
    out = b.drain()
    # launch 1's window is still open: its records wait
    assert len(out[T.FAULTS][T.TIME_NS]) == 1
    b.close_window(1, 200, 299)
    out2 = b.drain(final=True)
    f = _table(T.FAULTS, {k: out[T.FAULTS][k] + out2[T.FAULTS][k] for k in out[T.FAULTS]})
    assert f.column(T.ADDRESS).to_pylist() == [0x1000_1000, 0x1000_5000]  # page-aligned
    assert f.column(T.COUNT).to_pylist() == [3, 1]
    assert f.column(T.ACCESS).to_pylist() == ["write", "unknown"]
    assert f.column(T.LAUNCH_ID).to_pylist() == [0, 1]
    m = _table(T.MIGRATIONS, out[T.MIGRATIONS] if T.MIGRATIONS in out else out2[T.MIGRATIONS])
    m = _table(T.MIGRATIONS, {k: (out.get(T.MIGRATIONS, {}).get(k, []) + out2.get(T.MIGRATIONS, {}).get(k, []))
                              for k in T.SCHEMAS[T.MIGRATIONS].names})
    rows = sorted(zip(m.column(T.DIRECTION).to_pylist(), m.column(T.CAUSE).to_pylist(),
                      m.column(T.BYTES).to_pylist(), m.column(T.LAUNCH_ID).to_pylist()))
    # the eviction before launch 0 belongs to no launch; the zero-byte DTOD is dropped
    assert rows == [("dtoh", "eviction", 4096, None), ("htod", "coherence", 65536, 0)]
    ev = {k: out.get(T.UVM_EVENTS, {}).get(k, []) + out2.get(T.UVM_EVENTS, {}).get(k, [])
          for k in T.SCHEMAS[T.UVM_EVENTS].names}
    e = _table(T.UVM_EVENTS, ev)
    assert sorted(zip(e.column(T.EVENT).to_pylist(), e.column(T.LAUNCH_ID).to_pylist())) == \
        [("remote_map", 0), ("thrashing", 1)]
    assert b.stats.ignored_records == 1  # the CPU fault


def test_natural_mode_leaves_launch_ids_null():
    b = C.RowBuilder("natural")
    b.add_launch(_args(1, 100))
    b.add_records(C.snapshots(_um()))
    out = b.drain()
    assert out[T.FAULTS][T.LAUNCH_ID] == [None, None]
    assert b.stats.unattributed_faults == 2


def test_attribute_windows():
    w = [(0, 10, 0), (20, 30, 1), (31, 40, 2)]
    assert C.attribute([-1, 0, 10, 11, 20, 30, 31, 41], w) == [None, 0, 0, None, 1, 1, 2, None]
    assert C.attribute([5], []) == [None]
