"""pagecast installs as one import package: no top-level `datasets`, `collect`, ... beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FOREIGN = ["datasets", "collect", "predict", "replay", "report"]

PROBE = """
import importlib, importlib.util, json, sys
import pagecast, pagecast.cli
for sub in ("collect", "datasets", "predict", "replay", "report", "datasets.gpu"):
    importlib.import_module("pagecast." + sub)
pagecast.cli.build_parser()
found = {}
for name in %r:
    spec = importlib.util.find_spec(name)
    found[name] = None if spec is None else str(spec.origin or list(spec.submodule_search_locations or []))
print(json.dumps({"modules": sorted(m for m in sys.modules if m.split(".")[0] in %r), "found": found,
                  "pagecast": pagecast.__file__}))
"""


def test_no_top_level_names_leak(tmp_path):
    # Run from an empty directory so the repository root is not on sys.path.
    out = subprocess.run([sys.executable, "-c", PROBE % (FOREIGN, FOREIGN)], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    got = json.loads(out)
    assert got["modules"] == []
    repo = str(Path(__file__).resolve().parents[1])
    for name, origin in got["found"].items():
        # Another package (Hugging Face's datasets, say) may own the name; ours must not.
        assert origin is None or repo not in origin, f"{name} resolves into the repo: {origin}"


def test_subpackages_map_to_folders():
    import pagecast.datasets
    import pagecast.predict
    repo = Path(__file__).resolve().parents[1]
    assert Path(pagecast.predict.__file__).parent == repo / "predict"
    assert Path(pagecast.datasets.__file__).parent == repo / "datasets"
