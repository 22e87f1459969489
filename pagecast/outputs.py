"""Where a command may write: checked before any work, so a bad -o is one line and exit 2.

`check_output_path(path)` refuses an empty path and one whose nearest existing
ancestor is not a writable directory (a file in the way, a read-only or
missing mount). Whether the output itself exists (--force) stays with each
command, which knows whether it writes a file or a directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import UsageError


def check_output_path(path: str | os.PathLike) -> Path:
    """Raise UsageError (exit 2) when `path` cannot be written; return it as a Path."""
    if not str(path).strip():
        raise UsageError("the output path is empty; give -o a file or directory name")
    p = Path(path)
    parent = p.absolute().parent
    while not (parent.exists() or parent.is_symlink()) and parent != parent.parent:
        parent = parent.parent  # parents a command creates: the first one that exists decides
    if not parent.is_dir():
        raise UsageError(f"cannot write {p}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {p}: {parent} is not writable")
    return p
