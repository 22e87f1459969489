"""Where a command may write: checked before any work, so a bad -o is one line and exit 2.

`check_output_path(path)` refuses an empty path and one whose nearest existing
ancestor is not a writable directory (a file in the way, a read-only or
missing mount). `check_output_file(path, force, example)` is the check of a
command whose output is one file: an existing one needs --force, a directory
in its place is refused.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import OutputExistsError, UsageError


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


def refuse_special(p: Path) -> None:
    """--force replaces files and pagecast's directories, never a device, FIFO or socket
    (`-o /dev/null --force` as root would replace the device)."""
    try:
        mode = os.lstat(p).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        raise UsageError(f"{p} is not a regular file or directory; refusing to replace it even with --force")


def check_output_file(path: str | os.PathLike, force: bool, example: str) -> Path:
    """An output that is one file: refuse an existing one without --force, a directory in its
    place even with it (`example` names a file to give instead), and anything but a file or a
    link. Missing parent directories are made (as for the outputs that are directories)."""
    p = Path(path)
    if p.exists() and not force:
        raise OutputExistsError(p)
    refuse_special(p)
    if p.is_dir():
        raise UsageError(f"{p} is a directory; give a file name such as {example}")
    p.parent.mkdir(parents=True, exist_ok=True)
    return p
