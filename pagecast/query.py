"""SQL over a trace with DuckDB (in-process), one view per table (Perfetto's idea).

The trace is read and validated through pagecast.trace, then each table is
registered as an Arrow view, so the views exist even for empty tables and
carry the spec's types (uint64 addresses stay unsigned).

Results are fetched in batches from DuckDB's cursor, so a query that returns
more rows than are shown (the table view's --limit) is never fetched whole.
"""

from __future__ import annotations

import datetime
import decimal
import math
import uuid
from typing import Any, Iterator

import duckdb

from .errors import UsageError
from .trace import read_trace

BATCH_ROWS = 10_000


def connect(trace_path):
    """A DuckDB connection with a view per table of the trace."""

    trace = read_trace(trace_path)
    con = duckdb.connect(":memory:")
    for name, table in trace.tables().items():
        con.register(name, table)
    return con


def _sql_error(e: Exception) -> UsageError:
    return UsageError(f"SQL failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def _row(r: tuple) -> tuple:
    return tuple(v.hex() if isinstance(v, (bytes, bytearray)) else v for v in r)


class SqlResult:
    """The columns of a query's result and its rows, fetched on demand."""

    def __init__(self, con, names: list[str]) -> None:
        self._con, self.names = con, names
        self._done = not names   # a statement without a result (SET ...) has no rows

    def fetch(self, n: int) -> list[tuple[Any, ...]]:
        """Up to `n` more rows (BLOBs as hex); fewer only at the end."""

        if self._done or n <= 0:
            return []
        try:
            rows = self._con.fetchmany(n)
        except duckdb.Error as e:
            raise _sql_error(e) from None
        if len(rows) < n:
            self._done = True
        return [_row(r) for r in rows]

    def head(self, n: int) -> tuple[list[tuple[Any, ...]], bool]:
        """The first `n` rows, and whether the result holds more (fetches n + 1 rows, no more)."""
        rows = self.fetch(n + 1)
        return rows[:n], len(rows) > n

    def batches(self, size: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        """Every (remaining) row, in lists of `size` (BATCH_ROWS)."""
        size = size or BATCH_ROWS
        while True:
            rows = self.fetch(size)
            if rows:
                yield rows
            if len(rows) < size:
                return


def execute(trace_path, sql: str) -> SqlResult:
    """Run `sql` over the trace; the rows are fetched from the result as they are asked for."""

    if not sql.strip().strip(";").strip():
        raise UsageError("SQL is empty; give a statement, e.g. 'SELECT count(*) FROM launches'")
    con = connect(trace_path)
    try:
        con.execute(sql)
        names = [d[0] for d in con.description] if con.description else []
    except duckdb.Error as e:
        raise _sql_error(e) from None
    return SqlResult(con, names)


def run_sql(trace_path, sql: str, limit: int | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, rows): all rows, or the first `limit`."""
    res = execute(trace_path, sql)
    if limit is not None:
        return res.names, res.head(limit)[0]
    return res.names, [r for b in res.batches() for r in b]


def json_value(v: Any) -> Any:
    """A value DuckDB returned, as JSON holds it.

    DATE, TIME and TIMESTAMP become ISO 8601 strings (with the offset where the
    type has a time zone), INTERVAL a number of seconds (a month counts 30 days,
    as DuckDB converts it), DECIMAL and UUID strings (exact), BLOB hex, NaN and
    infinities null; lists, structs and maps recursively.
    """
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (datetime.date, datetime.time)):   # datetime is a date
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, (decimal.Decimal, uuid.UUID)):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, dict):
        return {str(json_value(k)): json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    if hasattr(v, "item") and callable(v.item):  # numpy scalar
        return json_value(v.item())
    return str(v)
