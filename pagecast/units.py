"""Sizes and lists as the command line writes them (cli.md).

`4096`, `64KiB`, `2MiB`, `8GiB` are powers of 1024; `KB`, `MB`, `GB` powers of
1000. Lists are comma-separated.
"""

from __future__ import annotations

import argparse
import re
from fractions import Fraction

from .errors import UsageError

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "m": 1024**2, "g": 1024**3, "t": 1024**4,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse a size such as `2MiB` into bytes; raise UsageError if it is not one."""
    if isinstance(text, int):
        if text < 0:
            raise UsageError(f"size must not be negative: {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(f"not a size: {text!r} (write e.g. 4096, 64KiB, 2MiB, 8GiB, 8GB)")
    number, unit = m.groups()
    mult = _UNITS.get(unit.lower())
    if mult is None:
        raise UsageError(f"unknown size unit {unit!r} in {text!r} (use KiB, MiB, GiB, KB, MB, GB)")
    value = Fraction(number) * mult  # exact: 4611686019GB must not round through a float
    if value.denominator != 1:
        raise UsageError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def format_size(nbytes: float) -> str:
    """Human-readable bytes with binary units: 1536 -> '1.5 KiB'."""
    n = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def parse_list(text: str, name: str = "list") -> list[str]:
    """Split a comma-separated list; an empty item ("2,,3", a trailing comma) is a usage error
    naming it, never dropped: the user meant something there."""
    items = [t.strip() for t in str(text).split(",")]
    if not any(items):
        raise UsageError(f"empty list for {name}: {text!r}")
    if not all(items):
        k = items.index("")
        raise UsageError(f"{name} {text!r}: item {k + 1} of {len(items)} is empty")
    return items


def parse_size_list(text: str, name: str = "--capacity") -> list[int]:
    return [parse_size(t) for t in parse_list(text, name)]


def parse_float_list(text: str, name: str = "value") -> list[float]:
    out = []
    for t in parse_list(text, name):
        try:
            out.append(float(t))
        except ValueError:
            raise UsageError(f"not a number for {name}: {t!r}") from None
    return out


def count_arg(text: str) -> int:
    """argparse type of a count (--top): an integer >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {n}")
    return n
