"""Replay results as a console table: one row per (workload, capacity, policy), for `pagecast
replay` and `pagecast demo`."""

from __future__ import annotations

from rich.table import Table

from pagecast.units import format_size


def results_table(runs, title: str | None = None):
    """A rich table of runs: one row per (workload, capacity, policy)."""
    t = Table(title=title)
    for c, j in (("workload", "left"), ("capacity", "right"), ("oversub", "right"), ("policy", "left"),
                 ("time", "right"), ("stall", "right"), ("faults", "right"), ("in", "right"), ("out", "right"),
                 ("vs demand", "right"), ("of oracle", "right")):
        t.add_column(c, justify=j)
    # capacities in the order they were asked for (--oversub 1.5,2,3 reads 150% first), per workload
    first: dict = {}
    for i, r in enumerate(runs):
        first.setdefault((r.get("workload") or "", r["capacity_bytes"] or 0), i)
    for r in sorted(runs, key=lambda r: (r.get("workload") or "", first[(r.get("workload") or "", r["capacity_bytes"] or 0)],
                                         r.get("run", 0))):
        sp = r.get("speedup_vs_demand")
        fo = r.get("fraction_of_oracle")
        t.add_row(str(r.get("workload") or ""), format_size(r["capacity_bytes"]) if r.get("capacity_bytes") else "-",
                  f"{r['oversub']:.0%}" if r.get("oversub") else "-", policy_label(r),
                  _secs(r["time_s"]), _secs(r["stall_s"]), f"{r['faults']:,}", format_size(r["htod_bytes"]),
                  format_size(r["dtoh_bytes"]), "-" if sp is None else f"{sp:.2f}x",
                  "-" if fo is None else f"{fo:.1%}")
    return t


SPAN_LABELS = {"block": "blocks", "fitted": "fitted blocks", "allocation": "allocations"}


def policy_label(r) -> str:
    """The policy, and the span its plan was made at where wider than units (docs/cost-model.md)."""
    span = r.get("plan_span")
    return r["policy"] if not span or span == "unit" else f"{r['policy']} ({SPAN_LABELS.get(span, span)})"



def _secs(s) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"
