"""Shared fixtures: small traces built by hand, as a tool outside pagecast would."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

BASE = 0x7F00_0000_0000
MiB = 1 << 20


def _launch_rows(n: int) -> dict:
    data = [struct.pack("<QQi", BASE, BASE + 2 * MiB, 256 * (i + 1)) + b"\0" * 4 for i in range(n)]
    return {
        "launch_id": pa.array(range(n), pa.int64()),
        "kernel": pa.array(["_Z4vaddPfPKfi"] * n),
        "device": pa.array([0] * n, pa.int32()),
        "stream": pa.array([7] * n, pa.int64()),
        **{c: pa.array([1] * n, pa.int32()) for c in ("grid_x", "grid_y", "grid_z", "block_y", "block_z")},
        "block_x": pa.array([256] * n, pa.int32()),
        "shared_mem_bytes": pa.array([0] * n, pa.int32()),
        "start_ns": pa.array([1000 * i for i in range(n)], pa.int64()),
        "end_ns": pa.array([1000 * i + 500 for i in range(n)], pa.int64()),
        "param_offsets": pa.array([[0, 8, 16]] * n, pa.list_(pa.int32())),
        "param_sizes": pa.array([[8, 8, 4]] * n, pa.list_(pa.int32())),
        "param_data": pa.array(data, pa.binary()),
    }


def write_hand_trace(path: Path, n: int = 4, *, manifest_extra: dict | None = None,
                     reverse_columns: bool = True) -> Path:
    """A trace written with plain pyarrow, following trace-format.md only."""
    path.mkdir(parents=True)
    manifest = {"format": "pagecast-trace", "version": 1, "complete": True, "page_size": 4096,
                "mode": "full", "source": "handmade", "workload": {"name": "vadd", "argv": None},
                "device": {"name": None, "index": None, "memory_bytes": None},
                "driver_prefetch": None, "created": "2026-11-29T00:00:00Z", "producer": "test",
                "future_key": {"nested": [1, 2]}, **(manifest_extra or {})}
    (path / "manifest.json").write_text(json.dumps(manifest))
    tables = {
        "launches": _launch_rows(n),
        "allocations": {
            "alloc_id": pa.array([0, 1], pa.int64()), "address": pa.array([BASE, BASE + 2 * MiB], pa.uint64()),
            "bytes": pa.array([2 * MiB, 2 * MiB], pa.int64()), "kind": pa.array(["managed", "managed"]),
            "device": pa.array([0, 0], pa.int32()), "first_launch": pa.array([0, 0], pa.int64()),
            "last_launch": pa.array([None, n - 1], pa.int64()),
            # alloc_ns / free_ns omitted: nullable columns may be absent
        },
        "faults": {
            "time_ns": pa.array([10 + 1000 * i for i in range(n)], pa.int64()),
            "address": pa.array([BASE + 65536 * i for i in range(n)], pa.uint64()),
            "count": pa.array([1] * n, pa.int32()), "access": pa.array(["read"] * n),
            "device": pa.array([0] * n, pa.int32()),
            "launch_id": pa.array([None] + list(range(1, n)), pa.int64()),  # first one attributed by time
        },
        "migrations": {
            "start_ns": pa.array([20], pa.int64()), "end_ns": pa.array([30], pa.int64()),
            "address": pa.array([BASE + 2 * MiB], pa.uint64()), "bytes": pa.array([65536], pa.int64()),
            "direction": pa.array(["htod"]), "cause": pa.array(["coherence"]),
            "launch_id": pa.array([0], pa.int64()),
        },
    }
    for name, cols in tables.items():
        (path / name).mkdir()
        t = pa.table(cols)
        if reverse_columns:
            t = t.select(list(reversed(t.column_names)))
        pq.write_table(t, path / name / "part-00000.parquet")
    return path


@pytest.fixture
def hand_trace(tmp_path) -> Path:
    return write_hand_trace(tmp_path / "hand.pctrace")
