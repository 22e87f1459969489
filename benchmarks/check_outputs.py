"""Nothing lost, nothing mixed: the checks behind docs/outputs.md, run as a user would.

    python benchmarks/check_outputs.py race [--trials 6] [--scale 0.5]
        two `pagecast datasets make` runs to one path at once, with and without --force: the trace
        left there must be complete and equal, table by table, to exactly one run's own output
    python benchmarks/check_outputs.py sigterm [--trials 8] [--scale 0.5]
        SIGTERM at random moments of `datasets make --force`: the path holds a whole trace or nothing,
        no temporary sibling stays behind
    python benchmarks/check_outputs.py perfetto [--scale 4]
        `export perfetto` of llm-decode read back with perfetto's own protos: no empty packet, every
        slice begin has its end on its track
"""

from __future__ import annotations

import argparse
import hashlib
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

from pagecast import trace as T


def _cli(*argv, **kw):
    return subprocess.Popen([sys.executable, "-m", "pagecast.cli", *map(str, argv)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, **kw)


def _digest(path: Path) -> tuple[str, bool, list[str]]:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr = T.read_trace(path)
    h = hashlib.sha256()
    for name, t in sorted(tr.tables().items()):
        h.update(name.encode())
        for c in t.columns:
            for ch in c.chunks:
                for b in ch.buffers():
                    if b is not None:
                        h.update(memoryview(b))
    return h.hexdigest(), tr.complete, [str(x.message) for x in w]


def _debris(d: Path) -> list[str]:
    return [x.name for x in d.iterdir() if ".pagecast-" in x.name]


def race(trials: int, scale: str, root: Path) -> bool:
    ref = {}
    for seed in (1, 2):
        p = _cli("datasets", "make", "llm-decode", "-o", root / f"ref{seed}", "--scale", scale, "--seed", seed)
        assert p.wait() == 0, p.stderr.read()
        ref[seed] = _digest(root / f"ref{seed}")[0]
    ok = 0
    for trial in range(trials):
        for force in (False, True):
            out = root / f"t{trial}{'f' if force else ''}.pctrace"
            ps = [_cli("datasets", "make", "llm-decode", "-o", out, "--scale", scale, "--seed", s,
                       *(["--force"] if force else [])) for s in (1, 2)]
            errs = [p.communicate()[1] for p in ps]
            d, complete, warned = _digest(out)
            which = [s for s in (1, 2) if ref[s] == d]
            good = complete and len(which) == 1 and not warned and not _debris(root) \
                and all("Traceback" not in e for e in errs)
            ok += good
            print(f"trial {trial} force={force}: exit codes {[p.returncode for p in ps]}, the trace is seed"
                  f" {which} run's, complete={complete}, {'ok' if good else 'MIXED OR BROKEN'}", flush=True)
    print(f"{ok}/{2 * trials} whole, none mixed" if ok == 2 * trials else f"FAILED: {2 * trials - ok} bad")
    return ok == 2 * trials


def sigterm(trials: int, scale: str, root: Path) -> bool:
    out = root / "st.pctrace"
    rng = random.Random(0)
    bad = 0
    for i in range(trials):
        delay = rng.uniform(0.3, 9.0)
        p = _cli("datasets", "make", "llm-decode", "-o", out, "--scale", scale, "--seed", i, "--force")
        time.sleep(delay)
        p.send_signal(signal.SIGTERM)
        err = p.communicate()[1]
        state = "absent"
        if out.exists():
            _, complete, warned = _digest(out)
            state = "complete" if complete and not warned else "BROKEN"
        broken = state == "BROKEN" or _debris(root) or "Traceback" in err or p.returncode not in (0, 143, -15)
        bad += bool(broken)
        print(f"SIGTERM after {delay:.2f} s: exit {p.returncode}, path {state}, debris {_debris(root)}", flush=True)
    print("every manifest tells the truth" if not bad else f"FAILED: {bad} bad")
    return not bad


def perfetto(scale: str, root: Path) -> bool:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent
    tr, out = root / "llm.pctrace", root / "llm.pftrace"
    for argv in (("datasets", "make", "llm-decode", "-o", tr, "--scale", scale), ("export", "perfetto", tr, "-o", out)):
        p = _cli(*argv)
        assert p.wait() == 0, p.stderr.read()
    packets = Trace.FromString(out.read_bytes()).packet
    empty, begins, ends = 0, 0, 0
    depth: dict[int, int] = defaultdict(int)
    bad: set[int] = set()
    for pkt in packets:
        if not (pkt.HasField("track_descriptor") or pkt.HasField("track_event")):
            empty += 1
            continue
        ev = pkt.track_event
        if ev.type == TrackEvent.TYPE_SLICE_BEGIN:
            begins += 1
            depth[ev.track_uuid] += 1
        elif ev.type == TrackEvent.TYPE_SLICE_END:
            ends += 1
            depth[ev.track_uuid] -= 1
            if depth[ev.track_uuid] < 0:
                bad.add(ev.track_uuid)
    unpaired = len({u for u, v in depth.items() if v} | bad)
    print(f"{len(packets):,} packets, {empty} empty, {begins:,} slice begins, {ends:,} ends,"
          f" {unpaired} tracks with unpaired slices")
    return empty == 0 and unpaired == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=("race", "sigterm", "perfetto"))
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--scale", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pagecast-outputs-") as d:
        root = Path(d)
        if a.check == "race":
            ok = race(a.trials, a.scale or "0.5", root)
        elif a.check == "sigterm":
            ok = sigterm(a.trials, a.scale or "0.5", root)
        else:
            ok = perfetto(a.scale or "4", root)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
