"""Replay results as a console table: one row per (workload, capacity, policy), for `pagecast
replay` and `pagecast demo`."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from pagecast.console import add_name_column, name_cell, table
from pagecast.units import format_size

CAPTION = ("time: simulated run time (GPU: measured); stall: the part of it the GPU waited on faults and "
           "transfers; faults: GPU page faults; in / out: bytes moved host to device / device to host "
           "(lower is better for all four). vs demand: demand's time / this run's (higher is better). "
           "of oracle: oracle's time / this run's (100%: as fast as the best plan found with the truth). "
           "GPU memory: the capacity simulated.")
OVERSUB_WORDS = {"managed": " oversub: the managed memory allocated / the GPU memory (2 = 200%).",
                 "touched": " oversub: the pages the launches touch / the GPU memory (--oversub-of touched)."}
OVERSUB_CAPTION = " oversub: see 'pagecast replay -h', --oversub."


def oversub_caption(runs) -> str:
    """What the runs' oversubscription is a ratio of (their `oversub_of`), as replay -h defines it."""
    basis = {r.get("oversub_of") for r in runs if r.get("oversub") is not None}
    return OVERSUB_WORDS.get(next(iter(basis)), OVERSUB_CAPTION) if len(basis) == 1 else OVERSUB_CAPTION


FIT_CAPTION = (" out 0 B: nothing was evicted: the pages the run touched fit in the capacity (an oversubscription "
               "counts what is allocated, which can be more).")
SPAN_CAPTION = (" A policy's (span): the plan's prefetches widened to whole 2 MiB blocks (blocks), to the "
                "blocks where widening pays (fitted blocks), or to whole allocations (allocations), the span "
                "its trial runs found fastest (--span; docs/cost-model.md).")


def results_table(runs, title: str | None = None):
    """Runs as rich tables, one a workload (its GPU memory at each oversubscription in its
    title), one row per (capacity, policy); the caption below the last says what each column
    is. A rich Group: print it as a table."""
    runs = list(runs)
    spans = any(policy_label(r) != r["policy"] for r in runs)
    fit = any(r.get("dtoh_bytes") == 0 and r.get("capacity_bytes") for r in runs)
    # capacities in the order they were asked for (--oversub 1.5,2,3 reads 150% first), per workload
    first: dict = {}
    for i, r in enumerate(runs):
        first.setdefault((r.get("workload") or "", r["capacity_bytes"] or 0), i)
    by_wl: dict[str, list] = {}
    for r in sorted(runs, key=lambda r: (r.get("workload") or "", first[(r.get("workload") or "", r["capacity_bytes"] or 0)],
                                         r.get("run", 0))):
        by_wl.setdefault(str(r.get("workload") or ""), []).append(r)
    parts: list = [Text(title, style="bold")] if title else []
    for i, (wl, rows) in enumerate(by_wl.items()):
        caps: dict = {}
        for r in rows:
            caps.setdefault(r.get("capacity_bytes"), r.get("oversub"))
        gpu = ", ".join(("-" if c is None else format_size(c)) + (f" at {o:.0%}" if o else "") for c, o in caps.items())
        last = i == len(by_wl) - 1
        t = table(f"{wl or 'unnamed workload'}: GPU memory {gpu}",
                  CAPTION + oversub_caption(runs) + (FIT_CAPTION if fit else "") + (SPAN_CAPTION if spans else "")
                  if last else None,
                  box=None, pad_edge=False, padding=(0, 0, 0, 1), header_style="bold underline")
        t.add_column("oversub", justify="right", no_wrap=True)
        add_name_column(t, "policy", min_width=6)
        for c in ("time", "stall", "faults", "in", "out", "vs\ndemand", "of\noracle"):
            t.add_column(c, justify="right", no_wrap=True)
        prev = None
        for r in rows:
            sp = r.get("speedup_vs_demand")
            fo = r.get("fraction_of_oracle")
            over = (f"{r['oversub']:.0%}" if r.get("oversub") else format_size(r["capacity_bytes"])
                    if r.get("capacity_bytes") else "-")
            t.add_row("" if r.get("capacity_bytes") == prev else over, name_cell(policy_label(r)),
                      secs(r["time_s"]), secs(r["stall_s"]), f"{r['faults']:,}", format_size(r["htod_bytes"]),
                      format_size(r["dtoh_bytes"]), "-" if sp is None else f"{sp:.2f}x",
                      "-" if fo is None else f"{fo:.1%}")
            prev = r.get("capacity_bytes")
        parts.append(t)
    return Group(*parts)


SPAN_LABELS = {"block": "blocks", "fitted": "fitted blocks", "allocation": "allocations"}


def policy_label(r) -> str:
    """The policy, and the span its plan was made at where wider than units (docs/cost-model.md)."""
    span = r.get("plan_span")
    return r["policy"] if not span or span == "unit" else f"{r['policy']} ({SPAN_LABELS.get(span, span)})"



def secs(s) -> str:
    """A time in s, ms or us."""
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"
