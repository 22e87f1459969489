"""JSON files every stage writes and reads: manifests, models, plans, cost profiles."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError
from .outputs import Output


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int = 2, *, force: bool = True) -> None:
    """Write JSON to a temporary sibling of `path`, fsync, rename it into place (readers never see
    half a file; a failed write leaves nothing behind and raises OutputWriteError naming the path
    and the cause). `force=False`: refuse an existing file, also one another run wrote meanwhile
    (`pagecast.outputs.Output`)."""
    text = json.dumps(obj, indent=indent, default=_json_default) + "\n"
    with Output(path, force=force) as o:
        with open(o.tmp, "w") as f:
            f.write(text)


def read_json(path: str | os.PathLike, error: type[InputError] = InputError) -> Any:
    """Parse a JSON file; a file that is unreadable or not JSON raises `error` naming it."""
    path = Path(path)
    if path.exists() and not path.is_file():   # a FIFO would block, /dev/zero never end
        raise error(f"{path}: not a regular file")
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
