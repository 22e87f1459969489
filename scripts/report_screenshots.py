#!/usr/bin/env python3
"""Regenerate docs/screenshots/report-*.png: one screenshot per kind of `pagecast report`.

    python scripts/report_screenshots.py [--work DIR] [--out docs/screenshots]

Makes real data with pagecast itself (no GPU needed): the mlp-train workload
model's trace, a model fitted on the same workload with another seed, and the
simulator replay results of `pagecast demo` (every workload model and
MSched's mixes); renders the three reports and screenshots them in headless
chromium (1400 px wide, palette PNG).
A stage that is not available in this checkout is skipped with a message.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(argv: list[str]) -> None:
    from pagecast.cli import main
    print("+ pagecast " + " ".join(argv), file=sys.stderr)
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"pagecast {argv[0]} failed with exit code {rc}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None, help="where to keep the data (default: a temporary dir)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    ap.add_argument("--workload", default="mlp-train")
    ap.add_argument("--replay-results", type=Path, default=None, metavar="RESULTS.parquet",
                    help="screenshot the report of these results (a demo's results.parquet) instead of running "
                         "pagecast demo")
    args = ap.parse_args()

    from pagecast.report.browser import screenshot
    from pagecast.report.render import write_report

    work = args.work or Path(tempfile.mkdtemp(prefix="pagecast-shots-"))
    work.mkdir(parents=True, exist_ok=True)
    trace = work / f"{args.workload}.pctrace"
    run(["datasets", "make", args.workload, "-o", str(trace), "--seed", "1", "--force"])
    shots = []
    html = write_report(trace, work / "trace.html", force=True)
    shots.append(screenshot(html, args.out / "report-trace.png"))

    model = work / "model.json"
    try:
        train = work / f"{args.workload}-train.pctrace"
        run(["datasets", "make", args.workload, "-o", str(train), "--seed", "0", "--force"])
        run(["fit", str(train), "-o", str(model), "--force"])
        html = write_report(trace, work / "model.html", model=model, force=True)
        shots.append(screenshot(html, args.out / "report-model.png"))
    except (SystemExit, ImportError) as e:
        print(f"skipped the model report: {e}", file=sys.stderr)

    try:
        results = args.replay_results
        if results is None:
            demo = work / "demo"
            run(["demo", "-o", str(demo), "--force"])
            results = demo / "results.parquet"
        html = write_report(results, work / "replay.html", force=True)
        shots.append(screenshot(html, args.out / "report-replay.png"))
    except (SystemExit, ImportError, FileNotFoundError) as e:
        print(f"skipped the replay report: {e}", file=sys.stderr)

    for s in shots:
        print(f"{s}  {s.stat().st_size / 1024:.0f} KiB")
    print(f"data and HTML reports in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
