"""The one-screen summary of replay runs that `pagecast demo` and `pagecast replay` print.

Rows: workload x oversubscription (capacity), in the order the runs came; columns:
each policy's speedup over demand, and template's share of oracle where both ran;
then one geometric-mean row per oversubscription shared by several workloads. The
full per-run table (`results_table`, `--all`) and the JSON, results file and
report keep every field; this is only what a person reads first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from rich.table import Table

from pagecast.console import add_name_column, name_cell
from pagecast.replay.results_table import OVERSUB_CAPTION, oversub_caption, secs
from pagecast.units import format_size

GEOMEAN = "geometric mean"


@dataclass
class PivotRow:
    workload: str
    oversub: float | None
    capacity_bytes: int | None
    speedup: dict[str, float | None] = field(default_factory=dict)   # policy -> speedup over demand
    of_oracle: float | None = None                                   # template's time share of oracle
    demand_s: float | None = None                                    # demand's time (the reference)
    runs: int = 1                                                    # rows a geometric mean is over


@dataclass
class Pivot:
    policies: list[str]          # the speedup columns (every policy but demand), in run order
    has_of_oracle: bool          # template and oracle both ran
    rows: list[PivotRow]
    means: list[PivotRow]        # one per oversubscription that several rows share
    oversub_words: str = ""      # what oversub is a ratio of, for the caption (results_table.oversub_caption)


def applies(runs: Iterable[Mapping]) -> bool:
    """Whether a pivot says anything: demand ran (the reference) and some other policy did."""
    pols = {r.get("policy") for r in runs}
    return "demand" in pols and len(pols - {"demand"}) > 0


def make_pivot(runs: Iterable[Mapping]) -> Pivot:
    runs = list(runs)
    policies: list[str] = []
    rows: dict[tuple[str, int | None], PivotRow] = {}
    for r in runs:
        p = str(r.get("policy"))
        if p != "demand" and p not in policies:
            policies.append(p)
        key = (str(r.get("workload") or ""), r.get("capacity_bytes"))
        row = rows.get(key)
        if row is None:
            row = rows[key] = PivotRow(key[0], r.get("oversub"), key[1])
        if p != "demand":
            row.speedup.setdefault(p, _num(r.get("speedup_vs_demand")))
        elif row.demand_s is None:
            row.demand_s = _num(r.get("time_s"))
        if p == "template" and row.of_oracle is None:
            row.of_oracle = _num(r.get("fraction_of_oracle"))
    names = {str(r.get("policy")) for r in runs}
    has_fo = "template" in names and "oracle" in names
    by_over: dict[float | None, list[PivotRow]] = {}
    for row in rows.values():
        by_over.setdefault(None if row.oversub is None else round(float(row.oversub), 6), []).append(row)
    means = []
    for over, group in by_over.items():
        if len(group) < 2 or over is None:
            continue
        m = PivotRow(GEOMEAN, over, None, runs=len(group))
        for p in policies:
            m.speedup[p] = geomean(row.speedup.get(p) for row in group)
        m.of_oracle = geomean(row.of_oracle for row in group) if has_fo else None
        means.append(m)
    return Pivot(policies, has_fo, list(rows.values()), means, oversub_caption(runs))


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive finite values (None when there are none)."""
    v = [float(x) for x in values if x is not None and math.isfinite(x) and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def _num(x) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


CAPTION = ("demand time: simulated, under demand paging (UVM as the driver does it). Each policy: its speedup "
           "over demand, demand's time / its time (higher is better).")
ORACLE_CAPTION = (" template/oracle: oracle's time / template's (100%: as fast as oracle, the fastest plan found "
                  "with the truth).")
SLOWER_CAPTION = " Below 1.00x: slower than demand (alloc moves and evicts whole allocations)."
def caption(pv: Pivot) -> str:
    """What the pivot's numbers are, relative to what, and which way is better."""
    slower = any(v is not None and v < 1 for r in pv.rows for v in r.speedup.values())
    return (CAPTION + (ORACLE_CAPTION if pv.has_of_oracle else "") + (SLOWER_CAPTION if slower else "")
            + (pv.oversub_words or OVERSUB_CAPTION))


def pivot_table(pv: Pivot, title: str | None = None, note: str | None = None):
    """The pivot as a rich Table: one line per row and no rules (it must fit a screen); the
    header is underlined and the geometric means bold; the caption, after `note` (the demo's
    means line), says what the numbers are."""
    t = Table(title=title, box=None, pad_edge=False, header_style="bold underline",
              caption=(f"[bold]{note}[/bold]\n" if note else "") + caption(pv),
              title_justify="left", caption_justify="left")
    add_name_column(t, "workload", min_width=8)
    t.add_column("oversub", justify="right", no_wrap=True)
    t.add_column("demand time", justify="right", no_wrap=True)
    for p in pv.policies:
        t.add_column(p, justify="right", no_wrap=True)
    if pv.has_of_oracle:
        t.add_column("template/oracle", justify="right", no_wrap=True)
    last = None
    for row in pv.rows:
        name = "" if row.workload == last else row.workload
        last = row.workload
        t.add_row(name_cell(name), _over(row, format_size), secs(row.demand_s), *_cells(pv, row))
    for m in pv.means:
        t.add_row(name_cell(f"{GEOMEAN} ({m.runs})"), _over(m, format_size), "", *_cells(pv, m), style="bold")
    return t


def means_line(pv: Pivot) -> str:
    """The geometric-mean rows folded into one line (`pagecast demo`, whose screen has room for one):
    each policy's means at the oversubscriptions in order, and template's share of oracle."""
    if not pv.means:
        return ""
    levels = " / ".join(_over(m, format_size) for m in pv.means)
    parts = [f"{p} " + " / ".join("-" if m.speedup.get(p) is None else f"{m.speedup[p]:.2f}x" for m in pv.means)
             for p in pv.policies]
    if pv.has_of_oracle:
        parts.append("template/oracle " + " / ".join("-" if m.of_oracle is None else f"{m.of_oracle:.0%}"
                                                     for m in pv.means))
    return f"{GEOMEAN} ({pv.means[0].runs}) at {levels}: " + ", ".join(parts)


def _over(row: PivotRow, format_size) -> str:
    if row.oversub is not None:
        return f"{row.oversub:.0%}"
    return format_size(row.capacity_bytes) if row.capacity_bytes else "-"


def _cells(pv: Pivot, row: PivotRow) -> list[str]:
    out = ["-" if row.speedup.get(p) is None else f"{row.speedup[p]:.2f}x" for p in pv.policies]
    if pv.has_of_oracle:
        out.append("-" if row.of_oracle is None else f"{row.of_oracle:.0%}")
    return out
