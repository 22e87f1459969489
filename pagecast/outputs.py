"""Where and how a command writes its output.

`Output` (and `write_file`) is the one way every command writes: into a temporary
sibling, fsynced, then renamed into place (docs/outputs.md).

`check_output_path(path)` refuses an empty path and one whose nearest existing
ancestor is not a writable directory (a file in the way, a read-only or
missing mount). `check_output_file(path, force, example)` is the check of a
command whose output is one file: an existing one needs --force, a directory
in its place is refused.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any, Callable

from .errors import OutputExistsError, PagecastError, UsageError


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


# Suffixes that name a file format, and the format's name. An output whose suffix is one of these
# but not one of the formats its command writes is refused: `predict -o pred.csv` wrote Parquet
# into pred.csv. A suffix not listed here (run.pctrace, a.plan, results.v2) names nothing.
FORMAT_SUFFIXES = {
    ".csv": "CSV", ".tsv": "TSV", ".json": "JSON", ".jsonl": "JSON lines", ".ndjson": "JSON lines",
    ".html": "HTML", ".htm": "HTML", ".parquet": "Parquet", ".pq": "Parquet", ".txt": "text",
    ".md": "Markdown", ".xml": "XML", ".yaml": "YAML", ".yml": "YAML", ".toml": "TOML", ".pdf": "PDF",
    ".png": "PNG", ".svg": "SVG", ".jpg": "JPEG", ".gz": "gzip", ".zip": "zip", ".tar": "tar",
    ".pftrace": "a Perfetto trace", ".sqlite": "SQLite", ".db": "a database", ".feather": "Feather",
    ".arrow": "Arrow", ".npy": "NumPy", ".npz": "NumPy", ".pkl": "pickle", ".xlsx": "Excel",
}


def check_output_suffix(path: str | os.PathLike, command: str, writes: tuple[str, tuple[str, ...]] | None) -> None:
    """Refuse (one line, exit 2) an output named for another format than the one `command` writes."""
    if writes is None:
        return
    what, suffixes = writes
    p = Path(path)
    suf = p.suffix.lower()
    if suf not in FORMAT_SUFFIXES or suf in suffixes:
        return
    fix = f"name it {p.with_suffix(suffixes[0]).name}" if suffixes else "give a name without that suffix"
    raise UsageError(f"{p}: {command} writes {what}, not {FORMAT_SUFFIXES[suf]}; {fix}")


# ---- one way to write an output ------------------------------------------------------------
#
# Every command writes its output (a file, or a directory: a trace, a plan) through `Output`:
# into a temporary sibling, fsynced, then renamed into place (docs/outputs.md). Readers and a
# second writer never see half of it; a failed or interrupted write leaves nothing at the path.

TEMP_TAG = ".pagecast-tmp-"   # a temporary sibling: .NAME.pagecast-tmp-PID-RANDOM
OLD_TAG = ".pagecast-old-"    # an output being replaced under --force: .NAME.pagecast-old-PID-RANDOM
_DEBRIS = re.compile(r"^\.(?P<name>.+)\.pagecast-(?:tmp|old)-(?P<pid>\d+)-[0-9a-f]+$")


class OutputWriteError(PagecastError):
    """Writing an output failed (a full or read-only disk, a vanished directory); nothing was
    left at the path. One line naming the path and the cause; exit 2."""

    exit_code = 2

    def __init__(self, path, cause: BaseException | str, left: str = "nothing was written") -> None:
        self.path = Path(path)
        self.cause = cause
        super().__init__(f"cannot write {path}: {describe_os_error(cause)}; {left}")


def describe_os_error(e: BaseException | str) -> str:
    """An OSError (or pyarrow's, which are OSErrors) as a short cause: 'No space left on device'."""
    if isinstance(e, str):
        return e
    if isinstance(e, OSError) and e.errno is not None:
        return os.strerror(e.errno)
    s = str(e).strip().splitlines()
    first = s[0] if s else type(e).__name__
    m = re.search(r"\[errno (\d+)\]", first, re.I)   # pyarrow: "Error writing bytes ... [errno 28] No space ..."
    return os.strerror(int(m.group(1))) if m else first


def is_disk_full(e: BaseException) -> bool:
    """Whether an OSError says the file system has no room (ENOSPC, EDQUOT)."""
    codes = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
    if isinstance(e, OSError) and e.errno in codes:
        return True
    return isinstance(e, OSError) and any(f"[errno {c}]" in str(e).lower() for c in codes)


def debris_of(path: str | os.PathLike) -> list[tuple[Path, int]]:
    """pagecast's temporary siblings of `path` (its own debris, or a running writer's): (path, pid)."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    out = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return out
    for e in entries:
        m = _DEBRIS.match(e.name)
        if m and m.group("name") == p.name:
            out.append((parent / e.name, int(m.group("pid"))))
    return out


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True     # someone else's process: alive
    return True


def remove_path(p: Path) -> None:
    """Remove a file, link or directory tree; what is already gone is fine."""
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    except OSError:
        pass


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass   # some file systems do not sync directories
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under `root` and every directory (so a rename after it publishes data
    that is on disk)."""
    if root.is_dir():
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            _fsync_dir(Path(dirpath))
    elif root.exists():
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_ACTIVE: dict[int, "Output"] = {}   # outputs being written by this process (for abandon_all)


def abandon_all() -> list[Path]:
    """Remove the temporary siblings of every output this process is writing, putting back an
    output that a --force replacement had moved aside. For a signal handler that ends the process
    without unwinding (raising into arbitrary code, such as an extension module's import, could
    abort the process instead). Returns the paths whose output was dropped."""
    gone = []
    for o in list(_ACTIVE.values()):
        gone.append(o.path)
        old = o._aside
        if old is not None and not (o.path.exists() or o.path.is_symlink()):
            try:
                os.rename(old, o.path)
            except OSError:
                pass
        o.abort()
    return gone


class Output:
    """One output path written atomically (a file when `directory` is false, else a directory).

        with Output(path, force=force) as o:
            write_something(o.tmp)         # a temporary sibling
        # committed: renamed into place; an exception removed the sibling instead

    - Without `force`, an existing path is refused at once (OutputExistsError, exit 2), and
      again at commit: when another writer put its output there in the meantime, this one
      loses cleanly (one line, exit 2) and leaves the other's whole.
    - With `force`, only what pagecast wrote is replaced: a file, or a directory that `owned`
      accepts (a trace, a plan, an empty directory); never a device, FIFO or socket. pagecast's
      own debris (temporary siblings of this path whose process is gone) is removed first.
    - An OSError while writing or committing (a full disk) becomes OutputWriteError naming the
      path and the cause, with the temporary sibling removed.
    - `in_place` (the collectors: docs/outputs.md): the directory is claimed at the path itself
      by mkdir(2) (a second writer loses at once; --force removes the old output first) and
      written there, so a process killed outright leaves its closed parts readable at the path;
      `abort` removes it, `commit` fsyncs it.
    """

    def __init__(self, path: str | os.PathLike, *, force: bool = False, directory: bool = False,
                 owned: Callable[[Path], bool] | None = None, example: str = "", in_place: bool = False) -> None:
        self.path = Path(path)
        self.force = force
        self.directory = directory or in_place
        self.in_place = in_place
        self.owned = owned or (lambda p: True)
        self.example = example
        self.committed = False
        self._aside: Path | None = None    # the replaced output while it is moved aside
        self._ino: tuple[int, int] | None = None
        self._check(self.path)
        if force:
            for d, pid in debris_of(self.path):
                if not _alive(pid):
                    remove_path(d)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if in_place:
            self.tmp = self.path
            self._claim()
        else:
            self.tmp = self._sibling(TEMP_TAG)
            try:
                if self.directory:
                    self.tmp.mkdir()
            except OSError as e:
                raise OutputWriteError(self.path, e) from None
        _ACTIVE[id(self)] = self

    def _claim(self) -> None:
        """in_place: take the path by mkdir(2), which fails when it exists, so two writers never
        share it; under --force the old output is moved aside and removed first."""
        if self.force and (self.path.exists() or self.path.is_symlink()):
            old = self._sibling(OLD_TAG)
            try:
                os.rename(self.path, old)
                remove_path(old)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise OutputWriteError(self.path, e) from None
        try:
            os.mkdir(self.path)
        except FileExistsError:
            raise OutputExistsError(self.path, f"{self.path} is being written by another run (or was meanwhile);"
                                               " this run wrote nothing") from None
        except OSError as e:
            raise OutputWriteError(self.path, e) from None
        # held open while writing: the inode cannot be reused, so _ours() never mistakes another
        # run's directory (made after --force removed this one) for this one
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        st = os.fstat(self._fd)
        self._ino = (st.st_dev, st.st_ino)

    def _ours(self) -> bool:
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._ino

    def _release(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _sibling(self, tag: str) -> Path:
        return self.path.with_name(f".{self.path.name}{tag}{os.getpid()}-{secrets.token_hex(4)}")

    def _check(self, p: Path) -> None:
        if not (p.exists() or p.is_symlink()):
            return
        if not self.force:
            raise OutputExistsError(p)
        refuse_special(p)
        if p.is_dir() and not p.is_symlink():
            if not self.directory:
                raise UsageError(f"{p} is a directory; give a file name"
                                 + (f" such as {self.example}" if self.example else ""))
            if any(p.iterdir()) and not self.owned(p):
                raise OutputExistsError(p, f"{p} is a non-empty directory that is not a pagecast output;"
                                           " refusing to delete it even with --force")
        elif self.directory and not self.owned(p):
            raise OutputExistsError(p, f"{p} is a file that pagecast did not write as this output;"
                                       " refusing to delete it even with --force")

    # ---- finishing
    def commit(self) -> Path:
        """fsync the temporary sibling and rename it into place (module docstring for the rules)."""
        if self.committed:
            return self.path
        try:
            fsync_tree(self.tmp)
            if not self.in_place:
                self._publish()
            _fsync_dir(self.path.parent)
        except OSError as e:
            self.abort()
            raise OutputWriteError(self.path, e) from None
        except BaseException:
            self.abort()
            raise
        self.committed = True
        _ACTIVE.pop(id(self), None)
        self._release()
        return self.path

    def _publish(self) -> None:
        if self.force and not self.directory:   # a file: one atomic replace, never absent meanwhile
            self._check(self.path)
            os.replace(self.tmp, self.path)
            return
        for _ in range(100):   # under --force, each loop moves one competing output aside
            if self._place():
                return
            if not self.force:
                self.abort()
                raise OutputExistsError(self.path, f"{self.path} was written by another run while this one"
                                                   " worked; this run's output was dropped (pass --force to replace it)")
            self._check(self.path)
            old = self._aside = self._sibling(OLD_TAG)
            try:
                os.rename(self.path, old)
            except FileNotFoundError:
                self._aside = None
                continue   # the other writer moved it first
            placed = self._place()
            self._aside = None
            remove_path(old)
            if placed:
                return
        raise OSError(errno.EEXIST, "another writer keeps replacing it", str(self.path))

    def _place(self) -> bool:
        """Rename the sibling to the path unless something is there now; True when placed."""
        if self.directory:
            try:
                os.rename(self.tmp, self.path)   # onto a non-empty directory: ENOTEMPTY / EEXIST
                return True
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                    return False
                raise
        try:
            os.link(self.tmp, self.path)    # fails when the path exists: no check-then-replace race
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            if self.path.exists() or self.path.is_symlink():   # no hard links here: check, then replace
                return False
            os.replace(self.tmp, self.path)
            return True
        self.tmp.unlink(missing_ok=True)
        return True

    def abort(self) -> None:
        """Remove the temporary sibling (nothing is left at the path)."""
        _ACTIVE.pop(id(self), None)
        if self.committed:
            return
        if not self.in_place:
            remove_path(self.tmp)
        elif self._ours():   # not another run's that replaced it under --force meanwhile
            remove_path(self.path)
        self._release()

    def __enter__(self) -> "Output":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
            return
        self.abort()
        if isinstance(exc, OSError) and not isinstance(exc, (PagecastError,)):
            raise OutputWriteError(self.path, exc) from None


def write_file(path: str | os.PathLike, write: Callable[[Path], Any], *, force: bool = False,
               example: str = "") -> Path:
    """Write one file atomically: `write(tmp)` writes the temporary sibling (Output's rules)."""
    with Output(path, force=force, example=example) as o:
        write(o.tmp)
    return o.path
