"""What the corpus programs share: their command line, sizes that follow --scale, shapes drawn
per call, and tensors that are either fresh per call or prefixes of buffers allocated once.

    python -m pagecast.datasets.corpus.tutorials --scale 1 --seed 0 --buffers fresh
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import numpy as np

BUFFERS = ("fresh", "preallocated")


@dataclass
class Run:
    scale: float
    seed: int
    buffers: str                     # fresh | preallocated
    calls: int                       # calls of every operation (each with its own shape)
    rng: np.random.Generator = field(repr=False, default=None)

    def size(self, base: float, *, multiple: int = 1, lo: int = 1) -> int:
        """base * scale, rounded to a multiple, at least lo."""
        return max(lo, int(round(base * self.scale / multiple)) * multiple)

    def pick(self, base: float, spread=(0.5, 1.0, 1.5, 2.0), *, multiple: int = 1, lo: int = 1) -> int:
        """A size for one call: base * scale times one of `spread` (shapes vary per call)."""
        return self.size(base * float(self.rng.choice(spread)), multiple=multiple, lo=lo)

    def most(self, base: float, spread=(0.5, 1.0, 1.5, 2.0), *, multiple: int = 1, lo: int = 1) -> int:
        """The largest size `pick` can return (what a preallocated buffer must hold)."""
        return self.size(base * max(spread), multiple=multiple, lo=lo)


def parse(argv, description: str, calls: int = 3) -> Run:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--scale", type=float, default=1.0, help="problem sizes (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="shapes and data (default 0)")
    ap.add_argument("--buffers", choices=BUFFERS, default="fresh",
                    help="fresh tensors per call, or prefixes of buffers allocated once at their largest size")
    ap.add_argument("--calls", type=int, default=calls, help=f"calls of every operation (default {calls})")
    a = ap.parse_args(argv)
    if not (math.isfinite(a.scale) and 0.01 <= a.scale <= 100):
        ap.error(f"--scale must be between 0.01 and 100, not {a.scale}")
    if a.seed < 0 or a.calls < 1:
        ap.error("--seed must be >= 0 and --calls >= 1")
    return Run(a.scale, a.seed, a.buffers, a.calls, np.random.default_rng([a.seed, 14]))


class Tensors:
    """Makes a call's tensors: fresh ones, or views of per-role buffers allocated once.

    With `preallocated`, `reserve(role, numel)` sizes a role's buffer before the run (at the
    largest size any call will need); every call then takes the prefix it needs, so the
    kernels see the same allocations again and again, used in part."""

    def __init__(self, run: Run) -> None:
        import torch
        self.torch = torch
        self.fresh = run.buffers == "fresh"
        self.gen = torch.Generator().manual_seed(run.seed)
        self._max: dict[str, tuple[int, object]] = {}
        self._bufs: dict[str, object] = {}

    def reserve(self, role: str, numel: int, dtype=None) -> None:
        dtype = dtype or self.torch.float32
        n, _ = self._max.get(role, (0, dtype))
        self._max[role] = (max(n, int(numel)), dtype)

    def _view(self, role: str, shape, dtype):
        numel = int(np.prod(shape))
        buf = self._bufs.get(role)
        if buf is None:
            n, dt = self._max.get(role, (numel, dtype))
            buf = self._bufs[role] = self.torch.empty(max(n, numel), dtype=dt)
        if buf.numel() < numel or buf.dtype != dtype:
            raise ValueError(f"{role}: buffer of {buf.numel()} {buf.dtype} cannot hold {shape} {dtype}")
        return buf[:numel].view(*shape)

    def randn(self, role: str, *shape, dtype=None, scale: float = 1.0):
        dtype = dtype or self.torch.float32
        if self.fresh:
            t = self.torch.randn(*shape, generator=self.gen, dtype=dtype)
        else:
            t = self._view(role, shape, dtype)
            t.copy_(self.torch.randn(*shape, generator=self.gen, dtype=dtype))
        return t.mul_(scale) if scale != 1.0 else t

    def holding(self, role: str, values):
        """`values` as a call's tensor: itself when fresh, else copied into the role's buffer."""
        if self.fresh:
            return values
        v = self._view(role, tuple(values.shape), values.dtype)
        v.copy_(values)
        return v

    def empty(self, role: str, *shape, dtype=None):
        dtype = dtype or self.torch.float32
        return self.torch.empty(*shape, dtype=dtype) if self.fresh else self._view(role, shape, dtype)

    def zeros(self, role: str, *shape, dtype=None):
        return self.empty(role, *shape, dtype=dtype).zero_()

    def randint(self, role: str, high: int, *shape):
        dt = self.torch.int64
        t = self.torch.randint(0, high, shape, generator=self.gen, dtype=dt)
        if self.fresh:
            return t
        v = self._view(role, shape, dt)
        v.copy_(t)
        return v
