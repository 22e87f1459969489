"""Kernel names as a person reads them.

Traces keep a kernel's symbol as CUDA names it: for C++ kernels the Itanium-ABI mangled name
(`_Z8sgemm_nniiifPKfiS0_ifPfi`). Human output shows it demangled (`sgemm_nn(int, int, int,
float, float const*, ...)`); `--json`, the model file and the results keep the mangled name,
which is what every lookup matches on.

Demangling is the C++ runtime's own `__cxa_demangle` (libstdc++ or libc++), called through the
`cxxfilt` package, not a parser of our own. Where cxxfilt or a C++ runtime is missing, or a name
does not parse, the name is shown as it is.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable


@lru_cache(maxsize=1)
def _demangler():
    try:
        import cxxfilt   # finds libc and libstdc++/libc++ with ctypes at import
    except Exception:    # not installed, or no C++ runtime where ctypes looks
        return None
    return cxxfilt


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """`name` demangled where it is a mangled C++ name that parses; else `name` unchanged."""
    if not isinstance(name, str) or not name.startswith("_Z"):
        return name
    d = _demangler()
    if d is None:
        return name
    try:
        out = d.demangle(name)
    except Exception:    # cxxfilt.InvalidName (not a C++ name), or no runtime found
        return name
    return out or name


def base_name(name: str) -> str:
    """The demangled name without its parameter list (`sgemm_nn`), for short labels."""
    d = demangle(name)
    if d == name:
        return name
    depth = 0
    for i, c in enumerate(d):     # the first '(' outside template arguments
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            return d[:i] or d
    return d


def resolve(name: str, names: Iterable[str]) -> str | None:
    """The mangled name among `names` that `name` means: itself, or the one name whose
    demangled form, or whose demangled form without parameters, is `name`. None: no such
    name, or several (an overloaded kernel needs its full demangled or mangled name)."""
    names = list(names)
    if name in names:
        return name
    for key in (demangle, base_name):
        hits = [n for n in names if key(n) == name]
        if len(hits) == 1:
            return hits[0]
        if hits:
            return None
    return None
