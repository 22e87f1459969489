"""The command line's contract (cli.md) for the core commands, and size parsing."""

from __future__ import annotations

import csv
import io
import json

import pytest
from hypothesis import given, strategies as st

from pagecast.cli import main
from pagecast.errors import UsageError
from pagecast.units import format_size, parse_list, parse_size


@pytest.mark.parametrize("text,value", [("4096", 4096), ("64KiB", 65536), ("2MiB", 2 << 20), ("8GiB", 8 << 30),
                                        ("8GB", 8 * 10**9), ("1.5KiB", 1536), ("10 MB", 10**7), ("3k", 3072)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "-1", "1.3B", "12XB", "0x10", "1e3"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text)


@given(st.integers(0, 2**40), st.sampled_from(["", "KiB", "MiB", "GiB", "KB", "MB", "GB"]))
def test_parse_size_roundtrip(n, unit):
    mult = {"": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": 1000**2, "GB": 1000**3}[unit]
    assert parse_size(f"{n}{unit}") == n * mult


def test_format_size_and_lists():
    assert format_size(1536) == "1.5 KiB" and format_size(12) == "12 B"
    assert parse_list("demand, template ,oracle") == ["demand", "template", "oracle"]
    with pytest.raises(UsageError):
        parse_list(" , ")
    for bad in ("demand,,oracle", "demand,", ",demand"):   # an empty item is an error, never dropped
        with pytest.raises(UsageError, match="is empty"):
            parse_list(bad, "--policy")


def test_empty_list_item_exits_2(tmp_path, capsys):
    """`--oversub "2,,3"`: exit 2 with one line naming the empty item (it was dropped silently)."""
    from pagecast.cli import main
    rc = main(["replay", str(tmp_path / "none.pctrace"), "--policy", "demand", "--oversub", "2,,3"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--oversub '2,,3': item 2 of 3 is empty" in err


def test_summary_json(hand_trace, capsys):
    assert main(["summary", str(hand_trace), "--json"]) == 0
    out, err = capsys.readouterr()
    s = json.loads(out)
    for key in ("launches", "kernels", "allocations", "faults", "migrations", "footprint_bytes", "complete", "mode"):
        assert key in s
    assert s["launches"] == 4 and s["kernels"] == 1 and s["faults"] == 4 and s["migrations"] == 1
    assert s["footprint_bytes"] == (4 + 16) * 4096
    assert err == ""


def test_summary_table(hand_trace, capsys):
    assert main(["summary", str(hand_trace)]) == 0
    out = capsys.readouterr().out
    # the kernel's name demangled (the symbol stays in --json)
    assert "vadd" in out and "_Z4vaddPfPKfi" not in out and "launches" in out
    # the union and the per-launch sum have different names (both were "footprint"), which the caption explains
    text = " ".join(out.split())
    assert "footprint: distinct bytes" in text and "touched: bytes summed over the kernel's launches" in text
    assert "summed over launches" in out


def test_summary_footprint_and_touched_apart(hand_trace, capsys):
    from pagecast.footprints import footprints
    from pagecast.trace import read_trace
    assert main(["summary", str(hand_trace), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    fp = footprints(read_trace(hand_trace))
    (k,) = s["top_kernels"]   # one kernel: its footprint is the trace's, its bytes touched the trace's
    assert s["touched_bytes"] == fp.total_pages() * 4096 >= s["footprint_bytes"] == fp.union_pages() * 4096
    assert k["footprint_bytes"] == s["footprint_bytes"] and k["touched_bytes"] == s["touched_bytes"]


def test_fit_suggests_a_held_out_trace(tmp_path, capsys):
    """fit's next step evaluates on a trace it was not fitted on (it named the training trace)."""
    from pagecast.datasets.registry import make_trace
    tr = make_trace("jacobi2d", tmp_path / "train.pctrace", scale=0.05, seed=4)
    assert main(["fit", str(tr), "-o", str(tmp_path / "m.json")]) == 0
    nxt = capsys.readouterr().err.split("next:")[1]
    assert str(tr) not in nxt and "--seed 5" in nxt and "pagecast evaluate" in nxt


def test_query_views(hand_trace, capsys):
    assert main(["query", str(hand_trace), "SELECT kernel, count(*) AS n FROM launches GROUP BY 1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"kernel": "_Z4vaddPfPKfi", "n": 4}]
    assert main(["query", str(hand_trace),
                 "SELECT f.launch_id, a.alloc_id FROM faults f JOIN allocations a "
                 "ON f.address >= a.address AND f.address < a.address + a.bytes ORDER BY time_ns", "--csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["launch_id", "alloc_id"] and rows[1] == ["", "0"] and len(rows) == 5


def test_query_bad_sql_is_one_line(hand_trace, capsys):
    assert main(["query", str(hand_trace), "SELEC nonsense"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "SQL failed" in err


@pytest.mark.parametrize("sql", ["", "   ", ";"])
def test_query_empty_sql_is_one_line(hand_trace, capsys, sql):
    # was an internal error (AttributeError on DuckDB's None result), exit 1
    assert main(["query", str(hand_trace), sql]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "SQL is empty" in err


@pytest.mark.parametrize("argv", [["summary"], ["nonsense-command"], ["summary", "x", "--top", "many"],
                                  ["query", "x"], ["summary", "x", "--top", "-1"], ["evaluate", "m", "t", "--top", "-3"]])
def test_bad_flags_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_help_exits_0(capsys):
    assert main(["-h"]) == 0
    assert "summary" in capsys.readouterr().out
    assert main(["summary", "-h"]) == 0


def test_no_command_is_usage_error(capsys):
    assert main([]) == 2


def test_query_on_a_generated_trace(tmp_path, capsys):
    from pagecast.datasets.registry import make_trace

    p = make_trace("jacobi2d", tmp_path / "j.pctrace", scale=0.05, seed=1)
    capsys.readouterr()
    assert main(["query", str(p), "SELECT kernel, count(*) AS n FROM launches GROUP BY 1 ORDER BY n DESC",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert main(["summary", str(p), "--json"]) == 0
    assert sum(r["n"] for r in rows) == json.loads(capsys.readouterr().out)["launches"]
    assert any("jacobi2d_sweep" in r["kernel"] for r in rows)
    # every fault lies inside an allocation (a join across two views)
    assert main(["query", str(p), "SELECT count(*) AS outside FROM faults f WHERE NOT EXISTS "
                 "(SELECT 1 FROM allocations a WHERE f.address >= a.address AND f.address < a.address + a.bytes)",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"outside": 0}]


def test_query_json_writes_dates_times_decimals_uuids_and_intervals(hand_trace, capsys):
    # each was an internal error (TypeError: Object of type ... is not JSON serializable), exit 1
    import datetime

    assert main(["query", str(hand_trace), "SELECT to_timestamp(start_ns / 1e9) AS ts FROM launches LIMIT 1",
                 "--json"]) == 0
    ts = datetime.datetime.fromisoformat(json.loads(capsys.readouterr().out)[0]["ts"])
    assert ts == datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)  # same instant in any time zone
    sql = ("SELECT TIMESTAMP '2024-01-02 03:04:05.5' AS ts, DATE '2024-01-02' AS d, TIME '01:02:03' AS t, "
           "INTERVAL 90 MINUTE AS iv, 12.50::DECIMAL(10, 2) AS dec, "
           "'00000000-0000-0000-0000-000000000001'::UUID AS u, [DATE '2024-01-02'] AS dl, "
           "{'x': 1.5::DECIMAL(3, 1)} AS st, MAP {DATE '2024-01-02': 1} AS m, 'ab'::BLOB AS b, "
           "'nan'::DOUBLE AS n, NULL AS z")
    assert main(["query", str(hand_trace), sql, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [{"ts": "2024-01-02T03:04:05.500000", "d": "2024-01-02", "t": "01:02:03",
                                "iv": 5400.0, "dec": "12.50", "u": "00000000-0000-0000-0000-000000000001",
                                "dl": ["2024-01-02"], "st": {"x": "1.5"}, "m": {"2024-01-02": 1}, "b": "6162",
                                "n": None, "z": None}]
    assert err == ""
    # the table and CSV views print the same values as text
    assert main(["query", str(hand_trace), "SELECT DATE '2024-01-02' AS d, 1.5::DECIMAL(3, 1) AS x", "--csv"]) == 0
    assert list(csv.reader(io.StringIO(capsys.readouterr().out))) == [["d", "x"], ["2024-01-02", "1.5"]]


class _FetchSpy:
    """A DuckDB connection that counts the rows fetched and refuses to fetch them all at once."""

    def __init__(self, con, fetched: list[int]) -> None:
        self._con, self._fetched = con, fetched

    def __getattr__(self, name):
        return getattr(self._con, name)

    def fetchall(self):
        raise AssertionError("fetched every row")

    def fetchmany(self, n):
        rows = self._con.fetchmany(n)
        self._fetched.append(len(rows))
        return rows


def test_query_limit_fetches_only_the_rows_shown(hand_trace, capsys, monkeypatch):
    # fetched all 10^8 rows before applying --limit (MemoryError after 38 s)
    from pagecast import query

    fetched: list[int] = []
    connect = query.connect
    monkeypatch.setattr(query, "connect", lambda p: _FetchSpy(connect(p), fetched))
    assert main(["query", str(hand_trace), "SELECT * FROM range(100000000)", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert sum(fetched) == 6          # the rows shown and one more, to know there are more
    assert "│ 4 " in out and "│ 5 " not in out
    assert "first 5 rows shown; the query returns more" in out
    fetched.clear()
    assert main(["query", str(hand_trace), "SELECT * FROM range(3)", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 rows" in out and "shown" not in out and sum(fetched) == 3
    assert main(["query", str(hand_trace), "SELECT * FROM range(3)", "--limit", "0"]) == 0
    assert "first 0 rows shown" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["--csv", "--json"])
def test_query_csv_and_json_write_every_row_in_batches(hand_trace, capsys, monkeypatch, fmt):
    from pagecast import query

    fetched: list[int] = []
    connect = query.connect
    monkeypatch.setattr(query, "connect", lambda p: _FetchSpy(connect(p), fetched))
    monkeypatch.setattr(query, "BATCH_ROWS", 10)
    assert main(["query", str(hand_trace), "SELECT i, i / 2 AS half FROM range(25) t(i)", fmt,
                 "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert fetched == [10, 10, 5]
    if fmt == "--json":
        assert json.loads(out) == [{"i": i, "half": i * 0.5} for i in range(25)]
        assert out == json.dumps([{"i": i, "half": i * 0.5} for i in range(25)], indent=2) + "\n"
    else:
        rows = list(csv.reader(io.StringIO(out)))
        assert rows[0] == ["i", "half"] and len(rows) == 26 and rows[-1] == ["24", "12.0"]
    assert main(["query", str(hand_trace), "SELECT * FROM range(0)", fmt]) == 0
    assert capsys.readouterr().out == ("[]\n" if fmt == "--json" else "range\r\n")


def test_query_negative_limit_is_one_line(hand_trace, capsys):
    assert main(["query", str(hand_trace), "SELECT 1", "--limit", "-1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--limit must be >= 0" in err


def test_names_the_terminal_cannot_encode_are_escaped(hand_trace):
    """A kernel name outside the terminal's encoding (PYTHONIOENCODING=ascii) was an internal error."""
    import os
    import shutil
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pathlib import Path
    p = Path(hand_trace).parent / "enc.pctrace"
    shutil.copytree(hand_trace, p)
    part = sorted((p / "launches").glob("*.parquet"))[0]
    t = pq.read_table(part)
    t = t.set_column(t.schema.get_field_index("kernel"), "kernel", pa.array(["k\u00b5\u00e9"] * t.num_rows))
    pq.write_table(t, part)
    r = subprocess.run([sys.executable, "-c", "import sys; from pagecast.cli import main; sys.exit(main())",
                        "summary", str(p)], capture_output=True, env={**os.environ, "PYTHONIOENCODING": "ascii"},
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert b"k\\xb5\\xe9" in r.stdout


def test_every_command_takes_json():
    """README: every command prints exactly one JSON document with --json (`report` took none)."""
    import argparse
    from pagecast.cli import build_parser

    def leaves(p, path):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield " ".join(path), p
        for s in subs:
            for n, sp in s.choices.items():
                yield from leaves(sp, path + [n])

    missing = [name for name, p in leaves(build_parser(), []) if not any("--json" in a.option_strings for a in p._actions)]
    assert missing == []


def test_report_json(hand_trace, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(hand_trace), "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "trace" and doc["output"] == str(out) and doc["bytes"] == out.stat().st_size > 0
