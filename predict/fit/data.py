"""The fitter's shared data: a kernel's launches pooled over traces (`KernelData`).

Every step of the fit (`region`, `solve`, `likelihood`, `shapes`, `strided`, `indexed`) reads
this; it imports none of them. What the records show in one base word's allocation at each
launch is `observe.RegionObs`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from pagecast import trace as T

from .. import formula as FM
from ..features import GRID_NAMES, MAX_FEATURE, Word, candidate_words, factorize_rows, grid_matrix, layouts, param_matrix
from ..observe import TraceObs
from .params import FitParams

DEFAULT = FitParams()


class TracePart(NamedTuple):
    """One trace's launches of a kernel: its observations, launch ids, parameter bytes and grid."""

    obs: TraceObs
    idx: np.ndarray        # launch ids in the trace
    words: np.ndarray      # (launches, bytes) parameter matrix (features.param_matrix)
    grid: np.ndarray       # (launches, 6) grid and block dimensions (features.grid_matrix)


class KernelData:
    """A kernel's launches pooled over traces: words, features, groups."""

    def __init__(self, name: str, parts: list, ps: int, params: FitParams = DEFAULT) -> None:
        self.name, self.ps, self.params = name, ps, params
        self.bigp = max(1, params.big_page // ps)
        # the record loss its traces say they had (the worst of them): how many launches lost
        # records may leave unexplained
        self.loss = max([getattr(o, "loss", params.assumed_loss) for o, _ in parts] or [params.assumed_loss])
        o0, idx0 = parts[0]
        self.sizes, self.offsets, _ = layouts(o0.trace.launches, idx0)
        width = max([s + o for s, o in zip(self.sizes, self.offsets)] or [0])
        self.parts: list[TracePart] = []
        self.skipped = 0
        for o, idx in parts:
            s, off, mask = layouts(o.trace.launches, idx)
            if (s, off) != (self.sizes, self.offsets):
                # this trace's majority layout differs: keep only launches with ours
                mask = self._same_layout(o.trace.launches, idx)
            self.skipped += int((~mask).sum())
            idx = idx[mask]
            if len(idx) == 0:
                continue
            self.parts.append(TracePart(o, idx, param_matrix(o.trace.launches, idx, width),
                                        grid_matrix(o.trace.launches, idx)))
        self.n = sum(len(p[1]) for p in self.parts)
        self.traces = len(self.parts)
        ptrs, ints = candidate_words(self.sizes, self.offsets)
        # bases: 8-byte words that point into live allocations
        self.bases: list[tuple[Word, list[np.ndarray]]] = []
        non_ptr: list[Word] = []
        for w in ptrs:
            vals = [w.pointer_batch(m, self.offsets) for _, _, m, _ in self.parts]
            hits = sum(int((o.index.lookup(v, idx) >= 0).sum()) for (o, idx, _, _), v in zip(self.parts, vals))
            if self.n and hits >= params.pointer_share * self.n:
                self.bases.append((w, vals))
            else:
                non_ptr.append(w)
        base_spans = [(w.param, w.within, w.within + 8) for w, _ in self.bases]
        words = [w for w in ints if not any(w.param == p and w.within < e and w.within + w.size > s
                                            for p, s, e in base_spans)]
        words += non_ptr
        words += [Word(g, -1, i, 4) for i, g in enumerate(GRID_NAMES)]
        # decode, filter floats and huge values
        self.feat_names: list[str] = []
        cols: list[np.ndarray] = []
        seen: dict[bytes, str] = {}
        for w in words:
            v = np.concatenate([w.batch(m, self.offsets, g) for _, _, m, g in self.parts]) if self.parts \
                else np.zeros(0, np.int64)
            if len(v) == 0 or _float_like(w, v) or np.abs(v).max() > MAX_FEATURE:
                continue
            if ".d" in w.name and np.abs(v).max() >= 1 << 32:
                continue  # two 4-byte fields read as one (their 4-byte words are features already)
            key = v.tobytes()
            if key in seen:
                continue
            seen[key] = w.name
            self.feat_names.append(w.name)
            cols.append(v)
        F = np.stack(cols, axis=1) if cols else np.zeros((self.n, 0), np.int64)
        varying = np.array([len(np.unique(F[:, j][:4096])) > 1 or np.any(F[:, j] != F[0, j]) for j in range(F.shape[1])],
                           bool) if self.n else np.zeros(F.shape[1], bool)
        is_grid = np.array([n in GRID_NAMES for n in self.feat_names], bool)
        # the integer words no launch varied, whatever their size (never grid or block dimensions):
        # what a size read from one set of arguments may be a product of (`shapes.one_set_layouts`)
        self.const_words = {self.feat_names[j]: int(F[0, j]) for j in range(F.shape[1])
                            if not varying[j] and not is_grid[j] and abs(int(F[0, j])) > 1} if self.n else {}
        small = np.array([self.n > 0 and 1 < abs(int(F[0, j])) <= 1 << 16 for j in range(F.shape[1])], bool)
        vi = [j for j in range(F.shape[1]) if varying[j]]
        vi = sorted(vi, key=lambda j: is_grid[j])[:params.max_varying]
        ci = [j for j in range(F.shape[1]) if not varying[j] and small[j] and not is_grid[j]][:params.max_const]
        sel = vi + ci
        self.sel_names = [self.feat_names[j] for j in sel]
        self.sel_varying = np.array([varying[j] for j in sel], bool)
        Fs = F[:, sel]
        if Fs.shape[1]:
            self.uniq, self.group = factorize_rows(Fs)
        else:
            self.uniq = np.zeros((1 if self.n else 0, 0), np.int64)
            self.group = np.zeros(self.n, np.int64)
        self.U = len(self.uniq)
        self.values = {n: self.uniq[:, k] for k, n in enumerate(self.sel_names)}
        self._mono = None

    def allowed(self, n: int, edges=2) -> int:
        """Launches of n a template may leave unexplained (lost records; FitParams); `edges`: the
        edges each launch's evidence has (2 for a range, 2 per run seen of a strided region)."""
        return self.params.allowed_unexplained(int(n), self.loss, edges)

    def _same_layout(self, launches, idx):
        offs = launches.column(T.PARAM_OFFSETS).take(pa.array(idx)).to_pylist()
        sizes = launches.column(T.PARAM_SIZES).take(pa.array(idx)).to_pylist()
        return np.array([tuple(s) == self.sizes and tuple(o) == self.offsets for s, o in zip(sizes, offs)], bool)

    def mono(self, groups: np.ndarray) -> FM.Monomials:
        # a feature that varies over the kernel's launches may stand alone even where it is
        # constant over these groups (a stride of 128*max_seq seen at one max_seq)
        return FM.monomials(self.sel_names, self.uniq[groups], self.sel_varying_on(groups) | self.sel_varying)

    def sel_varying_on(self, groups):
        u = self.uniq[groups]
        return np.array([len(np.unique(u[:, k])) > 1 for k in range(u.shape[1])], bool) if len(u) else \
            np.zeros(u.shape[1], bool)


def _float_like(w: Word, v: np.ndarray) -> bool:
    """A word whose values read as 'nice' floats and as huge integers is a float, not a size."""
    nz = v[v != 0]
    if len(nz) == 0:
        return False
    if w.size == 4:
        big = np.abs(nz) > (1 << 24)
        f = nz.astype(np.int64).astype(np.uint32).view(np.float32)
        nice = np.isfinite(f) & (np.abs(f) >= 1e-6) & (np.abs(f) <= 1e9) & ((nz.astype(np.uint32) & 0x3FF) == 0)
        return bool(np.mean(big & nice) > 0.5)
    if w.size == 8:
        big = np.abs(nz) > (1 << 40)
        f = nz.astype(np.int64).view(np.float64)
        nice = np.isfinite(f) & (np.abs(f) >= 1e-9) & (np.abs(f) <= 1e15)
        return bool(np.mean(big & nice) > 0.5)
    return False
