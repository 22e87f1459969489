"""SQL over a trace with DuckDB (in-process), one view per table (Perfetto's idea).

The trace is read and validated through pagecast.trace, then each table is
registered as an Arrow view, so the views exist even for empty tables and
carry the spec's types (uint64 addresses stay unsigned).
"""

from __future__ import annotations

from typing import Any

from .errors import UsageError
from .trace import read_trace


def connect(trace_path):
    """A DuckDB connection with a view per table of the trace."""
    import duckdb

    trace = read_trace(trace_path)
    con = duckdb.connect(":memory:")
    for name, table in trace.tables().items():
        con.register(name, table)
    return con


def run_sql(trace_path, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    import duckdb

    if not sql.strip().strip(";").strip():
        raise UsageError("SQL is empty; give a statement, e.g. 'SELECT count(*) FROM launches'")
    con = connect(trace_path)
    try:
        rel = con.execute(sql)
        names = [d[0] for d in rel.description] if rel.description else []
        rows = rel.fetchall() if rel.description else []
    except duckdb.Error as e:
        raise UsageError(f"SQL failed: {str(e).splitlines()[0]}") from None
    return names, [tuple(v.hex() if isinstance(v, (bytes, bytearray)) else v for v in r) for r in rows]
