"""Property tests for the reader's validation: what the spec allows reads, what it forbids is refused."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pagecast import trace as T
from pagecast.errors import TraceError

from conftest import write_hand_trace

alloc_rows = st.lists(
    st.tuples(st.integers(0, 15), st.integers(1, 3), st.integers(0, 8), st.one_of(st.none(), st.integers(0, 8))),
    min_size=1, max_size=8)


def _overlaps(rows):
    """Plain-Python model of 'two live allocations overlap' (units of 1 MiB)."""
    for i, (a1, s1, f1, l1) in enumerate(rows):
        for a2, s2, f2, l2 in rows[i + 1:]:
            l1_ = 10**9 if l1 is None else l1
            l2_ = 10**9 if l2 is None else l2
            if a1 < a2 + s2 and a2 < a1 + s1 and f1 <= l2_ and f2 <= l1_:
                return True
    return False


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(alloc_rows)
def test_allocation_overlap_rule(tmp_path_factory, rows):
    p = write_hand_trace(tmp_path_factory.mktemp("h") / "t.pctrace")
    n = len(rows)
    t = pa.table({
        "alloc_id": pa.array(range(n), pa.int64()),
        "address": pa.array([(1 << 40) + a * (1 << 20) for a, _, _, _ in rows], pa.uint64()),
        "bytes": pa.array([s * (1 << 20) for _, s, _, _ in rows], pa.int64()),
        "kind": pa.array(["managed"] * n), "device": pa.array([0] * n, pa.int32()),
        "first_launch": pa.array([f for _, _, f, _ in rows], pa.int64()),
        "last_launch": pa.array([l for _, _, _, l in rows], pa.int64()),
    })
    pq.write_table(t, p / "allocations" / "part-00000.parquet")
    if any(l is not None and l < f - 1 for _, _, f, l in rows):
        # live for first ..= last: last = first - 1 when no kernel ran in between, never less
        with pytest.raises(TraceError, match="before its first_launch"):
            T.read_trace(p)
    elif _overlaps(rows):
        with pytest.raises(TraceError, match="overlap"):
            T.read_trace(p)
    else:
        assert T.read_trace(p).allocations.num_rows == n
    shutil.rmtree(p)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(-3, 12), min_size=1, max_size=10))
def test_launch_ids_must_be_a_permutation(tmp_path_factory, ids):
    p = write_hand_trace(tmp_path_factory.mktemp("h") / "t.pctrace", n=len(ids))
    part = p / "launches" / "part-00000.parquet"
    t = pq.read_table(part)
    t = t.set_column(t.column_names.index("launch_id"), "launch_id", pa.array(ids, pa.int64()))
    pq.write_table(t, part)
    if sorted(ids) == list(range(len(ids))):
        assert T.read_trace(p).launches.column(T.LAUNCH_ID).to_pylist() == list(range(len(ids)))
    else:
        with pytest.raises(TraceError, match="dense"):
            T.read_trace(p)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint32(), pa.uint64()]),
       st.booleans())
def test_integer_spellings_accepted(tmp_path_factory, typ, large_string):
    """Any integer type that holds the values is an acceptable spelling; so is large_string."""
    p = write_hand_trace(tmp_path_factory.mktemp("h") / "t.pctrace")
    part = p / "faults" / "part-00000.parquet"
    t = pq.read_table(part)
    t = t.set_column(t.column_names.index("count"), "count", t.column("count").cast(typ))
    if large_string:
        t = t.set_column(t.column_names.index("access"), "access", t.column("access").cast(pa.large_string()))
    pq.write_table(t, part)
    f = T.read_trace(p).faults
    assert f.schema == T.SCHEMAS[T.FAULTS] and f.column(T.COUNT).to_pylist() == [1, 1, 1, 1]


def test_integer_that_does_not_fit_is_refused(tmp_path):
    p = write_hand_trace(tmp_path / "t.pctrace")
    part = p / "faults" / "part-00000.parquet"
    t = pq.read_table(part)
    t = t.set_column(t.column_names.index("count"), "count", pa.array([1, 1, 1, 2**40], pa.int64()))
    pq.write_table(t, part)
    with pytest.raises(TraceError, match="does not fit int32"):
        T.read_trace(p)
