"""Reading an Nsight Systems export: the SQLite file or the Parquet directory (docs/import-nsys.md).

`open_export(path)` tells the two apart, checks that the file is an nsys export
and that its schema version is one this importer reads, and returns an
`NsysExport` whose `read(table, columns)` gives a pyarrow table of the columns
that exist (so `pagecast.collect.nsys_import` converts both kinds with one code
path). Every failure is an `InputError`: one line, exit 2.

The names below are the tables and columns of NVIDIA's SQLite export schema
that the importer reads; docs/import-nsys.md lists them with their sources.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pagecast.errors import InputError, shown

# ---- tables ---------------------------------------------------------------------
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
GPU_FAULTS = "CUDA_UM_GPU_PAGE_FAULT_EVENTS"
MEMORY_USAGE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
STRINGS = "StringIds"
MEM_KIND_ENUM = "ENUM_CUDA_MEM_KIND"
TARGET_GPU = "TARGET_INFO_GPU"
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")   # the name changed in 2024 (docs/import-nsys.md)
SCHEMA_VERSION_KEY = "EXPORT_SCHEMA_VERSION"
PRODUCT_VERSION_KEY = "EXPORT_PRODUCT_VERSION"

# Schema 3.x: every export from Nsight Systems 2023.2 (3.1.7) to 2026.1 (3.24.14) seen in the
# sources docs/import-nsys.md cites; the tables and columns read here are the same in all of them.
SUPPORTED_MAJOR = 3

FAULT_FLAG = "--cuda-um-gpu-page-faults=true"
MEMORY_FLAG = "--cuda-memory-usage=true"

SQLITE_MAGIC = b"SQLite format 3\x00"
BATCH_ROWS = 1 << 20   # rows fetched per SQLite batch (bounds the Python objects alive at once)
# what a damaged SQLite file raises (a damaged schema page can fail to decode as UTF-8)
_DB_ERRORS = (sqlite3.DatabaseError, UnicodeDecodeError)


@dataclass
class NsysExport:
    """One export, SQLite or Parquet directory; `read` returns existing columns only."""

    path: Path
    kind: str                                   # "sqlite" or "parquetdir"
    schema_version: str
    product_version: str | None
    _tables: dict[str, object] = field(default_factory=dict)   # name -> parquet path (parquetdir)
    _con: sqlite3.Connection | None = None

    def has(self, table: str) -> bool:
        return table in self._tables

    def columns(self, table: str) -> list[str]:
        if not self.has(table):
            return []
        try:
            if self._con is not None:
                return [r[1] for r in self._con.execute(f'PRAGMA table_info("{table}")')]
            return list(pq.read_schema(_schema_file(self._tables[table])).names)
        except (*_DB_ERRORS, OSError, pa.ArrowException) as e:
            raise InputError(f"{self.path}: cannot read table {table} ({_first_line(e)})") from None

    def count(self, table: str) -> int:
        if not self.has(table):
            return 0
        try:
            if self._con is not None:
                return int(self._con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
            return int(ds.dataset(str(self._tables[table]), format="parquet").count_rows())
        except (*_DB_ERRORS, OSError, pa.ArrowException) as e:
            raise InputError(f"{self.path}: cannot read table {table} ({_first_line(e)})") from None

    def read(self, table: str, wanted: list[str], progress=None,
             where: tuple[str, tuple[int, ...]] | None = None) -> pa.Table:
        """The columns of `wanted` that `table` has, as a pyarrow table; `where` = (column,
        values) keeps the rows whose column holds one of the values (in SQL / Parquet filters)."""
        have = set(self.columns(table))
        cols = [c for c in wanted if c in have]
        if not cols:
            return pa.table({})
        if where is not None and where[0] not in have:
            raise InputError(f"{self.path}: table {table} has no column {where[0]}")
        try:
            if self._con is not None:
                return self._read_sqlite(table, cols, progress, where)
            filters = None if where is None else [(where[0], "in", list(where[1]))]
            t = pq.read_table(self._tables[table], columns=cols, filters=filters)
            if progress is not None:
                progress.advance(t.num_rows)
            return t
        except (*_DB_ERRORS, OSError, pa.ArrowException) as e:
            raise InputError(f"{self.path}: cannot read table {table} ({_first_line(e)})") from None

    def _read_sqlite(self, table: str, cols: list[str], progress, where) -> pa.Table:
        quoted = ", ".join(f'"{c}"' for c in cols)
        sql = f'SELECT {quoted} FROM "{table}"'
        if where is not None:
            sql += f' WHERE "{where[0]}" IN ({", ".join(str(int(v)) for v in where[1])})'
        cur = self._con.execute(sql)
        parts = []
        while True:
            rows = cur.fetchmany(BATCH_ROWS)
            if not rows:
                break
            parts.append(pa.table({c: pa.array(v) for c, v in zip(cols, zip(*rows))}))
            if progress is not None:
                progress.advance(len(rows))
        if not parts:
            return pa.table({c: pa.array([], pa.int64()) for c in cols})
        return pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None


def open_export(path: str | Path) -> NsysExport:
    """An nsys export at `path`, checked: InputError for anything else (one line, exit 2)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if p.is_dir():
        return _open_parquetdir(p)
    if not p.is_file():
        raise InputError(f"{p}: not a regular file or directory")
    try:
        with open(p, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or type(e).__name__})") from None
    if head != SQLITE_MAGIC:
        raise InputError(f"{p}: not an SQLite database; pagecast import nsys reads what"
                         " 'nsys export --type sqlite' writes (or a --type parquetdir directory)")
    return _open_sqlite(p)


def _open_sqlite(p: Path) -> NsysExport:
    try:
        con = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True)
        con.text_factory = lambda b: b.decode("utf-8", "replace")   # a name that is not UTF-8 is kept, marked
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
    except _DB_ERRORS as e:
        raise InputError(f"{p}: unreadable SQLite database ({_first_line(e)})") from None
    tables = {n: n for n in names}
    meta = next((t for t in META_TABLES if t in tables), None)
    if meta is None:
        con.close()
        raise InputError(f"{p}: an SQLite database but not an Nsight Systems export (no {META_TABLES[0]}"
                         f" table); export a report with 'nsys export --type sqlite REPORT.nsys-rep'")
    try:
        kv = {str(k): v for k, v in con.execute(f'SELECT name, value FROM "{meta}"')}
    except _DB_ERRORS as e:
        con.close()
        raise InputError(f"{p}: unreadable {meta} table ({_first_line(e)})") from None
    version, product = _check_version(p, kv)
    return NsysExport(p, "sqlite", version, product, tables, con)


def _open_parquetdir(p: Path) -> NsysExport:
    tables: dict[str, object] = {}
    try:
        entries = list(p.iterdir())
    except OSError as e:
        raise InputError(f"{p}: cannot list ({e.strerror or type(e).__name__})") from None
    for e in entries:
        if e.name.startswith("."):
            continue
        if e.is_file() and e.suffix == ".parquet":
            tables[e.stem] = e
        elif e.is_dir() and any(e.glob("*.parquet")):
            tables[e.name[:-len(".parquet")] if e.name.endswith(".parquet") else e.name] = e
    meta = next((t for t in META_TABLES if t in tables), None)
    if meta is None:
        raise InputError(f"{p}: a directory but not an Nsight Systems Parquet export (no {META_TABLES[0]}"
                         f".parquet); export one with 'nsys export --type parquetdir REPORT.nsys-rep'")
    try:
        t = pq.read_table(tables[meta], columns=["name", "value"])
    except (OSError, pa.ArrowException, KeyError) as e:
        raise InputError(f"{p}: unreadable {meta} ({_first_line(e)})") from None
    kv = {str(k): v for k, v in zip(t.column("name").to_pylist(), t.column("value").to_pylist())}
    version, product = _check_version(p, kv)
    return NsysExport(p, "parquetdir", version, product, tables)


def _check_version(p: Path, kv: dict) -> tuple[str, str | None]:
    v = kv.get(SCHEMA_VERSION_KEY)
    if v is None:
        raise InputError(f"{p}: the export names no {SCHEMA_VERSION_KEY}; this importer reads schema"
                         f" {SUPPORTED_MAJOR}.x (Nsight Systems 2023.2 and later)")
    text = str(v).strip()
    major = text.split(".", 1)[0]
    if not major.isdigit() or int(major) != SUPPORTED_MAJOR:
        raise InputError(f"{p}: Nsight Systems export schema version {shown(text)}; this importer reads"
                         f" schema {SUPPORTED_MAJOR}.x (Nsight Systems 2023.2 and later)")
    prod = kv.get(PRODUCT_VERSION_KEY)
    return text, None if prod is None else str(prod)


def _schema_file(entry) -> Path:
    e = Path(entry)
    if e.is_dir():
        return sorted(x for x in e.glob("*.parquet") if not x.name.startswith("."))[0]
    return e


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:200] if s else type(e).__name__
