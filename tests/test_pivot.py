"""The one-screen pivot of replay runs (report/pivot.py), and replay printing it by default."""

from __future__ import annotations

import io
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from pagecast.report.pivot import GEOMEAN, applies, geomean, make_pivot, pivot_table


def _runs(workloads=("a", "b", "c"), oversub=(1.5, 2.0), policies=("demand", "alloc", "template", "oracle")):
    runs = []
    for wi, w in enumerate(workloads):
        for oi, o in enumerate(oversub):
            times = {"demand": 10.0, "alloc": 8.0 - wi, "template": 2.0 + oi, "oracle": 1.5 + oi * 0.5, "swap": 5.0}
            for p in policies:
                runs.append({"workload": w, "oversub": o, "capacity_bytes": int(1e9 / o), "policy": p,
                             "time_s": times[p], "run": len(runs)})
    for r in runs:   # as policies.add_relative computes them
        d = next(x for x in runs if x["policy"] == "demand" and x["capacity_bytes"] == r["capacity_bytes"]
                 and x["workload"] == r["workload"]) if "demand" in policies else None
        o = next(x for x in runs if x["policy"] == "oracle" and x["capacity_bytes"] == r["capacity_bytes"]
                 and x["workload"] == r["workload"]) if "oracle" in policies else None
        r["speedup_vs_demand"] = d["time_s"] / r["time_s"] if d else None
        r["fraction_of_oracle"] = o["time_s"] / r["time_s"] if o else None
    return runs


def _render(table) -> list[str]:
    buf = io.StringIO()
    Console(file=buf, width=160, highlight=False).print(table)
    return buf.getvalue().rstrip("\n").splitlines()


def test_rows_columns_and_geometric_means():
    runs = _runs()
    pv = make_pivot(runs)
    assert pv.policies == ["alloc", "template", "oracle"] and pv.has_of_oracle
    assert [(r.workload, r.oversub) for r in pv.rows] == [(w, o) for w in "abc" for o in (1.5, 2.0)]
    row = pv.rows[2]   # b at 150%
    assert row.speedup == {"alloc": 10 / 7, "template": 10 / 2, "oracle": 10 / 1.5}
    assert row.of_oracle == 1.5 / 2
    assert [(m.workload, m.oversub, m.runs) for m in pv.means] == [(GEOMEAN, 1.5, 3), (GEOMEAN, 2.0, 3)]
    m = pv.means[0]
    assert abs(m.speedup["alloc"] - statistics.geometric_mean([10 / 8, 10 / 7, 10 / 6])) < 1e-12
    assert abs(m.of_oracle - 0.75) < 1e-12


def test_table_is_one_line_per_row():
    pv = make_pivot(_runs())
    lines = _render(pivot_table(pv))
    assert lines[0].split() == ["workload", "oversub", "demand", "time", "alloc", "template", "oracle",
                                "template/oracle"]
    body = lines[:1 + 6 + 2]
    assert body[1].split()[:4] == ["a", "150%", "10.000", "s"] and body[2].split()[0] == "200%"   # a name once per group
    assert body[-1].startswith(f"{GEOMEAN} (3)") and "200%" in body[-1]
    assert "5.00x" in body[3] and "75%" in body[3]
    # the caption says what the numbers are, relative to what, and which way is better
    caption = " ".join(" ".join(lines[9:]).split())
    assert "speedup over demand" in caption and "higher is better" in caption and "template/oracle" in caption


def test_without_template_or_several_workloads():
    pv = make_pivot(_runs(workloads=("a",), policies=("demand", "oracle")))
    assert pv.policies == ["oracle"] and not pv.has_of_oracle and pv.means == []
    lines = _render(pivot_table(pv))
    assert lines[0].split() == ["workload", "oversub", "demand", "time", "oracle"]
    assert "template/oracle" not in " ".join(lines[3:])
    assert applies(_runs(policies=("demand", "swap")))
    assert not applies(_runs(policies=("demand",)))
    assert not applies(_runs(policies=("alloc", "oracle")))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)), max_size=20))
def test_geomean_takes_the_positive_finite_values(xs):
    good = [x for x in xs if x is not None and x == x and abs(x) != float("inf") and x > 0]
    g = geomean(xs)
    if not good:
        assert g is None
    else:
        assert min(good) * (1 - 1e-9) <= g <= max(good) * (1 + 1e-9)


def test_means_fold_into_one_line():
    from pagecast.report.pivot import means_line
    pv = make_pivot(_runs())
    m = pv.means
    line = means_line(pv)
    assert line.startswith(f"{GEOMEAN} (3) at 150% / 200%: alloc ")
    for p in ("alloc", "template", "oracle"):
        assert f"{p} {m[0].speedup[p]:.2f}x / {m[1].speedup[p]:.2f}x" in line
    assert line.endswith(f"template/oracle {m[0].of_oracle:.0%} / {m[1].of_oracle:.0%}")
    pv.means = []
    assert means_line(pv) == ""
