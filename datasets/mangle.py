"""Itanium C++ ABI name mangling for the kernel signatures of the workload models.

Enough of the ABI for free functions (and function templates with integer
template arguments) whose parameters are builtin types, named structs, const
qualification and pointers, with substitutions (S_, S0_, ...) as a CUDA C++
compiler emits them:

    >>> mangle("stream_triad", ["float*", "const float*", "const float*", "float", "long"])
    '_Z12stream_triadPfPKfS1_fl'
"""

from __future__ import annotations

BUILTINS = {
    "void": "v", "bool": "b", "char": "c", "signed char": "a", "unsigned char": "h",
    "short": "s", "unsigned short": "t", "int": "i", "unsigned int": "j", "unsigned": "j",
    "long": "l", "unsigned long": "m", "long long": "x", "unsigned long long": "y",
    "float": "f", "double": "d", "int64_t": "l", "uint64_t": "m", "int32_t": "i", "uint32_t": "j",
    "size_t": "m",
}


def _seq_id(i: int) -> str:
    """Substitution reference for the i-th candidate: S_, S0_, S1_, ..., S9_, SA_, ..."""
    if i == 0:
        return "S_"
    n = i - 1
    digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    s = ""
    while True:
        s = digits[n % 36] + s
        n //= 36
        if n == 0:
            break
    return f"S{s}_"


def _parse(ctype: str) -> tuple:
    """'const float*' -> ('ptr', ('const', ('name', 'float'))). Pointers bind right to left."""
    t = ctype.strip()
    if t.endswith("*"):
        return ("ptr", _parse(t[:-1].strip()))
    if t.startswith("const "):
        return ("const", _parse(t[len("const "):]))
    if t.endswith(" const"):
        return ("const", _parse(t[: -len(" const")]))
    return ("name", t)


class _Mangler:
    def __init__(self) -> None:
        self.subs: list[tuple] = []

    def _ref(self, node: tuple) -> str | None:
        if node in self.subs:
            return _seq_id(self.subs.index(node))
        return None

    def encode(self, node: tuple) -> str:
        kind = node[0]
        if kind == "name" and node[1] in BUILTINS:
            return BUILTINS[node[1]]
        ref = self._ref(node)
        if ref is not None:
            return ref
        if kind == "name":
            out = f"{len(node[1])}{node[1]}"
        elif kind == "const":
            out = "K" + self.encode(node[1])
        elif kind == "ptr":
            out = "P" + self.encode(node[1])
        else:  # pragma: no cover
            raise ValueError(node)
        self.subs.append(node)
        return out


def mangle(name: str, params: list[str], template_ints: list[int] | None = None) -> str:
    """The mangled name of `void name(params...)` (or `name<template_ints...>`)."""
    m = _Mangler()
    out = f"_Z{len(name)}{name}"
    if template_ints is not None:
        m.subs.append(("template-name", name))
        args = "".join(f"Li{v}E" if v >= 0 else f"Lin{-v}E" for v in template_ints)
        out += f"I{args}Ev"  # template functions encode their (void) return type
    if not params:
        return out + "v"
    return out + "".join(m.encode(_parse(p)) for p in params)
