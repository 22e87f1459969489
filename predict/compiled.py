"""The online predictor compiled: a model's templates as one int64 program, evaluated over a launch's
raw parameter bytes by one numba call (`compiled_kernels.predict_launch`).

`CompiledPredictor` is an `OnlinePredictor` (same constructor, same `add_allocation`,
`free_allocation`, `observe`, `resolve`, and `predict` returning the same merged page ranges)
whose `predict` runs compiled code, with no per-launch Python object but its output. The runner
calls `predict_args` (or `predict_into`), which leaves the launch's byte ranges in the state
array `st` at `out_at`, where the residency step reads them without converting them
(`replay.online.prediction`, `replay.online.decide`).

The program is laid out once per model version (`_Program`, Python, milliseconds for a model of
a hundred kernels): every kernel's feature words as byte offsets, sizes and signs, its regions'
base offsets, classes and formulas (constants, coefficients, factors), the irregular regions'
stored histories, and the `history` fallback's observed pages (laid out again after `observe`).
A model changed by feedback (`Model.version_counter`) is laid out again before the next launch;
numba compiles nothing then (the kernel is one function of any program). The numba kernels
themselves are compiled, or loaded from numba's cache, by `warm()`, which the runner calls when
it makes the predictor, never inside a launch.

A launch whose layout differs from the model's (other offsets, same sizes) gets a program row of
its own, made the first time that layout is seen; a launch with a variant's parameter sizes
(`KernelModel.variants`: the kernel specialized on an argument passed as None) is predicted by
the reference path. A pointer in no allocation the predictor knows
is handed to `resolve` once (the runner looks it up in the driver); pointers that land in no
managed allocation are remembered until `invalidate_misses()` (the runner calls it when its
allocation cache changes). The one case the compiled step does not decide, a resolver answering
an allocation the predictor's own table then does not find the pointer in (two overlapping
allocations known), is predicted by `OnlinePredictor.predict`, as before.
"""

from __future__ import annotations

import struct

import numpy as np

from pagecast.jit import entry_point

from . import compiled_kernels as CK
from .features import Word
from .model_io import Model
from .predictor import OnlinePredictor

_CLS = {"fixed": CK.CLS_FIXED, "linear": CK.CLS_LINEAR, "strided": CK.CLS_STRIDED,
        "allocation": CK.CLS_ALLOCATION, "irregular": CK.CLS_IRREGULAR}
_FB = {"none": CK.FB_NONE, "allocation": CK.FB_ALLOCATION, "history": CK.FB_HISTORY}
_U64 = (1 << 64) - 1


class _Program:
    """Builds the int64 program: lists per table, laid out behind the header by `array()`."""

    def __init__(self) -> None:
        self.kinfo: list[int] = []
        self.words: list[int] = []
        self.regions: list[int] = []
        self.formulas: list[int] = []
        self.terms: list[int] = []
        self.factors: list[int] = []
        self.stored: list[int] = []
        self.vmax = 0

    def formula(self, f, local: dict[str, int]) -> int:
        if f is None:
            return -1
        i = len(self.formulas) // CK.FW
        t0 = len(self.terms) // CK.TW
        for coef, names in f.terms:
            x0 = len(self.factors)
            self.factors.extend(local[n] for n in names)
            self.terms.extend((int(coef), x0, len(self.factors)))
        self.formulas.extend((int(f.const), t0, len(self.terms) // CK.TW))
        return i

    def kernel(self, km, offsets) -> None:
        """One program row: km's regions read at `offsets` (the model's layout or a launch's)."""
        r0 = len(self.regions) // CK.RW
        w0 = len(self.words) // CK.WW
        if not km.regions and km.note:
            self.kinfo.extend((CK.MODE_SCAN, w0, w0, r0, r0))
            return
        local: dict[str, int] = {}
        for r in km.regions:   # the same words, in the same order, as predictor._compile
            for name in sorted(r.feature_names()):
                if name in local:
                    continue
                w = Word.parse(name).resolve(km.param_sizes)
                local[name] = len(local)
                if w.param < 0:
                    self.words.extend((CK.KIND_GRID, w.within, 4, 1))
                else:
                    self.words.extend((CK.KIND_PARAM, int(offsets[w.param]) + w.within, w.size, int(w.signed)))
        self.vmax = max(self.vmax, len(local))
        for r in km.regions:
            b = Word.parse(r.base).resolve(km.param_sizes)
            h0 = len(self.stored) // 2
            if r.cls == "irregular":
                for s, e in r.history:
                    self.stored.extend((int(s), int(e)))
            # an indexed region is its fallback here (as an irregular region without a history): a
            # launch whose index values are at hand goes the reference path (CompiledPredictor.predict)
            self.regions.extend((int(offsets[b.param]) + b.within, _CLS.get(r.predicts, CK.CLS_IRREGULAR),
                                 self.formula(r.start, local), self.formula(r.end, local),
                                 self.formula(r.count, local), self.formula(r.chunk, local),
                                 self.formula(r.stride, local), h0, len(self.stored) // 2))
        self.kinfo.extend((CK.MODE_REGIONS, w0, len(self.words) // CK.WW, r0, len(self.regions) // CK.RW))

    def array(self, page_size: int, fallback: str, observed: list[tuple[int, int, list]]) -> np.ndarray:
        """The program; `observed`: (kernel id, allocation base, page intervals), sorted by key."""
        keys: list[int] = []
        pool: list[int] = []
        for hid, a, ivs in observed:
            keys.extend((hid, a, len(pool) // 2, len(ivs)))
            for s, e in ivs:
                pool.extend((int(s), int(e)))
        parts = [self.kinfo, self.words, self.regions, self.formulas, self.terms, self.factors, self.stored,
                 keys, pool]
        head = [0] * CK.HEADER
        at = CK.HEADER
        offs = []
        for p in parts:
            offs.append(at)
            at += len(p)
        (head[CK.H_KOFF], head[CK.H_WOFF], head[CK.H_ROFF], head[CK.H_FOFF], head[CK.H_TOFF], head[CK.H_XOFF],
         head[CK.H_SOFF], head[CK.H_DKEY], head[CK.H_DPOOL]) = offs
        head[CK.H_NK] = len(self.kinfo) // CK.KW
        head[CK.H_PS] = page_size
        head[CK.H_FB] = _FB[fallback]
        head[CK.H_DN] = len(observed)
        head[CK.H_POFF] = 8 + self.vmax + (self.vmax & 1)
        prog = np.zeros(at, np.int64)
        prog[:CK.HEADER] = head
        for o, p in zip(offs, parts):
            prog[o:o + len(p)] = p
        return prog


class _Miss(Exception):
    """The compiled step cannot decide this launch (see the module doc): predict it as before."""


def _section(st: np.ndarray, at: int, n: int) -> np.ndarray:
    return st[at:at + n]


class CompiledPredictor(OnlinePredictor):
    """`OnlinePredictor` whose `predict` is one compiled call (see the module doc)."""

    def __init__(self, model: Model, fallback: str = "history") -> None:
        self._kid: dict[str, int] = {}          # kernel name -> id (the observed histories' key)
        # name -> (code for the model's layout, sizes, offsets, reads the grid, program row, id)
        self._entries: dict[str, tuple] = {}
        self._variants: dict[tuple, int] = {}   # (name, offsets) -> program row
        self.st = np.zeros(0, np.int64)
        self._tcap, self._ncap, self._iolen = 64, 1024, 0
        self._resolver_on = 0
        self._call, self._call_grid = CK.predict_launch, CK.predict_launch_grid   # entry points after warm()
        super().__init__(model, fallback)
        self._compile()

    # -- the state array -----------------------------------------------------------------------
    def _assemble(self, prog: np.ndarray | None = None, tcap: int | None = None, ncap: int | None = None,
                  iolen: int | None = None) -> None:
        """Lay the sections out again (a new program, or a section that must grow)."""
        old = self.st
        tcap, ncap = tcap or self._tcap, ncap or self._ncap
        prog = self.prog if prog is None else prog
        iolen = max(iolen or 0, self._iolen, int(prog[CK.H_POFF]) + 2 * 1024)
        sizes = (1 + 2 * tcap, 2 + ncap, iolen, len(prog))
        st = np.zeros(CK.META + sum(sizes), np.int64)
        at = CK.META
        for slot, n in zip((CK.M_TABLE, CK.M_NEG, CK.M_IO, CK.M_PROG), sizes):
            st[slot] = at
            at += n
        st[CK.M_TCAP], st[CK.M_NCAP], st[CK.M_IOLEN], st[CK.M_PLEN] = tcap, ncap, iolen, len(prog)
        neg = _section(st, int(st[CK.M_NEG]), 2 + ncap)
        neg[2:] = CK.NEG_EMPTY
        neg[0] = self._resolver_on
        if len(old):
            n = int(old[old[CK.M_TABLE]])
            _section(st, int(st[CK.M_TABLE]), 1 + 2 * n)[:] = _section(old, int(old[CK.M_TABLE]), 1 + 2 * n)
            if ncap == self._ncap:
                neg[:] = _section(old, int(old[CK.M_NEG]), 2 + ncap)
            io = int(old[CK.M_IO])
            _section(st, int(st[CK.M_IO]), 8)[:] = old[io:io + 8]
        _section(st, int(st[CK.M_PROG]), len(prog))[:] = prog
        st[int(st[CK.M_IO]) + CK.IO_MODE] = 1   # byte ranges: what predict_into's fast path reads
        self.prog, self.st = prog, st
        self._tcap, self._ncap, self._iolen = tcap, ncap, iolen
        self.out_at = int(st[CK.M_IO] + prog[CK.H_POFF])

    # -- the resolver and the miss set ---------------------------------------------------------
    @property
    def resolve(self):
        return self.__dict__.get("_resolve")

    @resolve.setter
    def resolve(self, fn) -> None:
        self.__dict__["_resolve"] = fn
        self._resolver_on = 0 if fn is None else 1
        if len(self.st):
            self.invalidate_misses()

    def invalidate_misses(self) -> None:
        """Forget the pointers found in no managed allocation (the allocations changed)."""
        neg = _section(self.st, int(self.st[CK.M_NEG]), 2 + self._ncap)
        neg[2:] = CK.NEG_EMPTY
        neg[1] = 0
        neg[0] = self._resolver_on

    # -- allocations, mirrored into the table ----------------------------------------------------
    def add_allocation(self, address: int, nbytes: int, alloc_id=None) -> None:
        super().add_allocation(address, nbytes, alloc_id)
        if not len(self.st):
            return
        a = int(address)
        while not CK.table_insert(self.st, a, self._ends[a]):
            self._assemble(tcap=2 * self._tcap)

    def free_allocation(self, address: int) -> None:
        address = int(address)
        known = address in self._ends
        had = any(k[1] == address for k in self._history)
        super().free_allocation(address)
        if known:
            CK.table_remove(self.st, address)
        if had:
            self._stale()

    def observe(self, kernel: str, pages) -> None:
        super().observe(kernel, pages)
        self._stale()

    def _stale(self) -> None:
        """The observed histories changed: lay the program out again before the next launch."""
        self._observed_stale = True
        self._fresh = -1   # the fast path checks one number

    # -- the program -------------------------------------------------------------------------------
    def _hid(self, name: str) -> int:
        h = self._kid.get(name)
        if h is None:
            h = self._kid[name] = len(self._kid)
        return h

    def _compile(self) -> None:
        """The program of the model as it is now (and of the layouts seen so far)."""
        b = _Program()
        self._entries.clear()
        self._indexed = {name for name, km in self.model.kernels.items()
                         if any(r.cls == "indexed" or r.index is not None for kv in (km, *km.variants)
                                for r in kv.regions)}
        for i, (name, km) in enumerate(self.model.kernels.items()):
            b.kernel(km, km.param_offsets)
            grid = any(Word.parse(n).param < 0 for r in km.regions for n in r.feature_names())
            hid = self._hid(name)
            self._entries[name] = (CK.code_of(i, hid), tuple(km.param_sizes), tuple(km.param_offsets), grid, i, hid)
        variants = list(self._variants)
        self._variants.clear()
        self._builder = b
        self._compiled_version = self.model.version_counter
        for name, offs in variants:
            if name in self.model.kernels:
                self._variants[(name, offs)] = self._add_row(self.model.kernels[name], offs)
        self._layout()

    def _add_row(self, km, offsets) -> int:
        row = len(self._builder.kinfo) // CK.KW
        self._builder.kernel(km, offsets)
        return row

    def _layout(self) -> None:
        obs = sorted((self._hid(k), int(a), list(ivs)) for (k, a), ivs in self._history.items())
        self._assemble(prog=self._builder.array(self.ps, self.fallback, obs))
        self._observed_stale = False
        self._fresh = self._compiled_version   # the version the fast path may run on

    def _variant(self, kernel: str, offsets: tuple) -> int:
        row = self._variants.get((kernel, offsets))
        if row is None:
            try:
                row = self._add_row(self.model.kernels[kernel], offsets)
            except IndexError:   # fewer offsets than the model's parameters: as before, an error
                raise _Miss() from None
            self._variants[(kernel, offsets)] = row
            self._layout()
        return row

    def warm(self) -> "CompiledPredictor":
        """Compile (or load from numba's cache) the kernels now, not at the first launch."""
        st = self.st.copy()
        CK.table_insert(st, 1 << 20, 1 << 21)
        CK.table_remove(st, 1 << 20)
        CK.neg_add(st, 5)
        CK.neg_has(st, 5)
        CK.find_alloc(st, 5)
        self._call = entry_point(CK.predict_launch, st, b"\0" * 16, CK.code_of(-1, 0))
        self._call_grid = entry_point(CK.predict_launch_grid, st, b"\0" * 16, CK.code_of(-1, 0), 1, 1, 1, 1, 1, 1)
        return self

    # -- one launch ----------------------------------------------------------------------------------
    def predict_into(self, kernel: str, data: bytes, param_offsets=None, param_sizes=None,
                     grid=(1, 1, 1), block=(1, 1, 1)) -> int:
        """Predict one launch into `self.st`; returns how many byte ranges (address, nbytes), empty
        ones dropped, are at st[out_at:] (pairs)."""
        if type(data) is not bytes:   # the compiled entry takes exactly bytes
            data = bytes(data)
        e = self._entries.get(kernel)
        if (e is not None and self.model.version_counter == self._fresh
                and (param_sizes is None or param_sizes == e[1])
                and (param_offsets is None or param_offsets == e[2])):
            if e[3]:
                n = self._call_grid(self.st, data, e[0], *grid, *block)
            else:
                n = self._call(self.st, data, e[0])
            if n >= 0:
                return n
        return self._predict(kernel, data, param_offsets, param_sizes, grid, block, 1)

    def predict_args(self, la, data: bytes, values=None) -> int:
        """predict_into for a launch as the launch hook hands it over (`LaunchArgs`): its grid and
        block are read only when the kernel's formulas use them. `values`: as OnlinePredictor.predict's,
        for a kernel with an indexed region (that launch is predicted by the reference path)."""
        if type(data) is not bytes:   # the compiled entry takes exactly bytes
            data = bytes(data)
        if values is not None and la.kernel in self._indexed:
            if self.model.version_counter != self._compiled_version:
                self._compile()
            return self._reference(la.kernel, data, la.param_offsets, la.param_sizes, la.grid, la.block, 1, values)
        e = self._entries.get(la.kernel)
        if (e is not None and self.model.version_counter == self._fresh
                and la.param_sizes == e[1] and la.param_offsets == e[2]):
            if e[3]:
                n = self._call_grid(self.st, data, e[0], la.grid_x, la.grid_y, la.grid_z,
                                    la.block_x, la.block_y, la.block_z)
            else:
                n = self._call(self.st, data, e[0])
            if n >= 0:
                return n
        return self._predict(la.kernel, data, la.param_offsets, la.param_sizes, la.grid, la.block, 1)

    def _predict(self, kernel, data, param_offsets, param_sizes, grid, block, mode: int) -> int:
        """predict_into's general path: any layout, the grid, a resolver, room, the page mode."""
        if self.model.version_counter != self._compiled_version:
            self._compile()
        elif self._observed_stale:
            self._layout()
        e = self._entries.get(kernel)
        if e is None:
            e = self._entries[kernel] = (CK.code_of(-1, self._hid(kernel)), None, None, False, -1, self._hid(kernel))
        row, hid = e[4], e[5]
        if row >= 0:
            if param_sizes is not None and param_sizes != e[1] and tuple(param_sizes) != e[1]:
                km = self.model.kernels.get(kernel)
                if km is not None and km.for_layout(param_sizes) is not None:
                    # a variant's layout (KernelModel.variants): the reference path predicts it
                    return self._reference(kernel, data, param_offsets, param_sizes, grid, block, mode)
                row = -1   # another layout than the model's: the fallback, as for a kernel it never saw
            elif param_offsets is not None and param_offsets != e[2] and tuple(param_offsets) != e[2]:
                try:
                    row = self._variant(kernel, tuple(param_offsets))
                except _Miss:
                    return self._reference(kernel, data, param_offsets, param_sizes, grid, block, mode)
        try:
            while True:   # the io section moves when it grows: its inputs are written every time
                io = int(self.st[CK.M_IO])
                if row >= 0 and e[3]:
                    self.st[io:io + 3] = grid
                    self.st[io + 3:io + 6] = block
                self.st[io + CK.IO_MODE] = mode
                n = CK.predict_launch(self.st, data, CK.code_of(row, hid))
                if n >= 0:
                    return n
                try:
                    self._status(n)
                except _Miss:
                    return self._reference(kernel, data, param_offsets, param_sizes, grid, block, mode)
        finally:
            self.st[int(self.st[CK.M_IO]) + CK.IO_MODE] = 1

    def _status(self, n: int) -> None:
        io = int(self.st[CK.M_IO])
        value = int(self.st[io + CK.IO_VALUE])
        if n == CK.ST_SHORT:
            raise struct.error("the parameter buffer is shorter than a word the model reads")
        if n == CK.ST_ROOM:
            self._assemble(iolen=max(2 * self._iolen, int(self.prog[CK.H_POFF]) + 2 * value + 64))
            return
        v = value & _U64
        r = self.resolve(v) if self.resolve is not None else None
        if r is None:
            if not CK.neg_add(self.st, value):
                self.invalidate_misses()
                CK.neg_add(self.st, value)
            return
        self.add_allocation(r[0], r[1])
        row = CK.find_alloc(self.st, value)
        if row < 0 or int(self.st[int(self.st[CK.M_TABLE]) + 1 + 2 * row]) != int(r[0]):
            raise _Miss()   # the table answers otherwise for this pointer (overlapping allocations)

    def _reference(self, kernel, data, param_offsets, param_sizes, grid, block, mode: int, values=None) -> int:
        """OnlinePredictor.predict for this launch, written where predict_into writes."""
        pages = OnlinePredictor.predict(self, kernel, data, param_offsets, param_sizes, grid, block, values)
        if mode == 1:
            pages = [(s * self.ps, (e - s) * self.ps) for s, e in pages if e > s]
        need = int(self.prog[CK.H_POFF]) + 2 * len(pages)
        if self._iolen < need:
            self._assemble(iolen=need + 64)
        flat = [x for pair in pages for x in pair]
        self.st[self.out_at:self.out_at + len(flat)] = flat
        return len(pages)

    def ranges(self, n: int) -> list[tuple[int, int]]:
        """The n pairs predict_into left, as a list."""
        flat = self.st[self.out_at:self.out_at + 2 * n].tolist()
        return list(zip(flat[0::2], flat[1::2]))

    def predict(self, kernel: str, param_data: bytes, param_offsets=None, param_sizes=None,
                grid=(1, 1, 1), block=(1, 1, 1), values=None) -> list[tuple[int, int]]:
        """Merged page ranges [start, end) the launch is predicted to touch (OnlinePredictor.predict)."""
        if values is not None and kernel in self._indexed:
            if self.model.version_counter != self._compiled_version:
                self._compile()
            return self.ranges(self._reference(kernel, bytes(param_data), param_offsets, param_sizes, grid, block, 0,
                                               values))
        return self.ranges(self._predict(kernel, bytes(param_data), param_offsets, param_sizes, grid, block, 0))
