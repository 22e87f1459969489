"""JSON files every stage writes and reads: manifests, models, plans, cost profiles."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON next to `path`, then rename it into place (readers never see half a file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=_json_default)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str | os.PathLike, error: type[InputError] = InputError) -> Any:
    """Parse a JSON file; a file that is unreadable or not JSON raises `error` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:   # JSONDecodeError, over-long integers
        raise error(f"{path}: not valid JSON ({(str(e).splitlines() or [type(e).__name__])[0]})") from None
    except RecursionError:
        raise error(f"{path}: not valid JSON (nested too deeply)") from None
    except MemoryError:
        raise error(f"{path}: too large to read as JSON") from None


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
