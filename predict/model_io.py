"""The model file: versioned JSON a person can read (docs/template-model.md).

```
{"format": "pagecast-model", "version": 1, "page_size": 4096, "big_page": 65536,
 "created": ..., "producer": ..., "traces": [{"path": ..., "workload": ..., "launches": ...}],
 "kernels": {"NAME": {"param_sizes": [8, 8, 4], "param_offsets": [0, 8, 16],
                      "class": "linear", "launches": 120, "traces": 2,
                      "regions": [{"base": "p1", "class": "linear",
                                   "start": {"const": 0, "terms": [], "text": "0"},
                                   "end": {"const": 0, "terms": [[4, ["p2"]]], "text": "4*p2"},
                                   "text": "[p1, p1 + 4*p2)",
                                   "fit": {"launches": 120, "traces": 2, "groups": 3, "exact": 1.0}}],
                      "feedback": {"events": 0, "misses": 0}}}}
```

Long because the model file's whole schema is here, in one place: the typed records, their
readable text and every check the loader makes on a file written or edited by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagecast import PRODUCER
from pagecast.errors import ModelError, OutputExistsError
from pagecast.jsonfile import read_json, write_json_atomic
from pagecast.uvm import BIG_PAGE, PAGE

from .features import Word
from .formula import Formula

FORMAT = "pagecast-model"
VERSION = 1
CLASSES = ("fixed", "linear", "strided", "allocation", "indexed", "irregular", "unresolved")
FALLBACKS = ("allocation", "history", "none")
# class order for a kernel's summary class: the most demanding region decides (a kernel with an
# `unresolved` region is unresolved: what it says outranks any template beside it)
_RANK = {"fixed": 0, "allocation": 1, "linear": 2, "strided": 3, "indexed": 4, "irregular": 5, "unresolved": 6}
# a class with no pages of its own is predicted as another: `unresolved` (the records hold what
# should choose the pages - index values, a table of addresses, arguments with a layout - and no
# formula the fitter solves explains them) as its allocations, conservatively
# (docs/template-model.md, "Recovered or said so")
PREDICTED_AS = {"unresolved": "allocation"}
# the classes whose pages the arguments alone determine (evaluate's `determined` share)
ARGUMENT_CLASSES = ("fixed", "linear", "strided", "allocation")
INDEX_ELEMS = (4, 8)   # an indexed region's values are 4- or 8-byte signed integers (int32, int64 indices)


@dataclass(frozen=True)
class RowValue:
    """A value per row of a two-dimensional table, from another buffer: the `elem`-byte value at
    position r of the buffer `index` points to, or (`diff`) the difference of its values at r+1
    and r (an offsets buffer's lengths: a request's query length from its start offsets)."""

    index: str
    elem: int = 4
    diff: bool = False

    def text(self, at: str = "r") -> str:
        """`v(p10)[r]`, or `v(p10)[r+1] - v(p10)[r]` (`diff`); `at` the row's name (i in one dimension)."""
        v = f"{'v' if self.elem == 4 else 'v64'}({self.index})"
        return f"{v}[{at}+1] - {v}[{at}]" if self.diff else f"{v}[{at}]"

    def to_json(self) -> dict:
        return {"index": self.index, "elem": int(self.elem), "diff": bool(self.diff)}


@dataclass(frozen=True)
class RowFilter(RowValue):
    """A two-dimensional table's rows read only where another buffer's values allow it: row r is
    read where f(r) <= value (`op` "le") or f(r) >= value ("ge"), f(r) the RowValue (a decode
    kernel's program that returns for a query longer than one token). A row whose filter value
    is not recorded is read."""

    op: str = "le"
    value: int = 0

    def text(self, at: str = "r") -> str:
        return f"rows where {super().text(at)} {'<=' if self.op == 'le' else '>='} {self.value}"

    def to_json(self) -> dict:
        return {**super().to_json(), "op": self.op, "value": int(self.value)}


@dataclass(frozen=True)
class BlockSplit:
    """Where a slot's bytes lie in its block, for an indexed region whose values are divided
    (`value_div` d): the slot's offset in the block is `slot_bytes` times its value modulo d, and
    its bytes lie in each of `parts` parts of the block, `part_stride` bytes apart (a head-major
    paged cache: a slot's row in every head's part of its block, `[block, head, slot, bytes]`)."""

    slot_bytes: int
    parts: int = 1
    part_stride: int = 0

    def text(self, v: str, d: int) -> str:
        """` + 384*(v mod 16) + 6144*h` (h < parts), the offsets the split adds."""
        out = f" + {self.slot_bytes}*({v} mod {d})"
        return out + (f" + {self.part_stride}*h" if self.parts > 1 else "")

    def to_json(self) -> dict:
        return {"slot_bytes": int(self.slot_bytes), "parts": int(self.parts), "part_stride": int(self.part_stride)}


@dataclass
class Region:
    """One region a kernel touches, relative to a base pointer word."""

    base: str
    cls: str
    start: Formula | None = None     # fixed, linear, strided: byte offset of the (first) chunk
    end: Formula | None = None       # fixed, linear: byte offset one past the end
    count: Formula | None = None     # strided, indexed
    chunk: Formula | None = None     # strided, indexed
    stride: Formula | None = None    # strided, indexed (bytes per unit of the index value)
    index: str | None = None         # indexed: the pointer word whose buffer holds the values v (None, with
                                     # `lengths`: the value is the position i itself, rows read in order)
    elem: int = 4                    # indexed: bytes per value (int32 or int64)
    value_div: int = 1               # indexed: each value divided by it, rounded down, before the stride
                                     # multiplies it (a token's slot over the block size: its block)
    block_split: BlockSplit | None = None  # indexed, values divided: a slot's bytes within its block
                                           # (its offset and the parts they lie in; None: the whole block)
    count_index: str | None = None   # indexed: the count is the value at position `count` of this buffer
    count_elem: int = 4              # indexed: bytes of that value
    count_div: int = 1               # indexed: the count read from count_index is ceil(value / count_div)
    count_valid: bool = False        # indexed, a count read from count_index: the number of values that are not
                                     # negative among its first `count` (a -1-padded slot mapping's live slots)
    row_stride: Formula | None = None  # indexed, a 2-D table: entries per row; `count` rows, row r read up to
                                       # ceil(v(count_index)[r] / count_div) entries
    row_filter: RowFilter | None = None  # indexed, a table or chunks of their own lengths: only the rows (values)
                                         # another buffer's values allow
    count_sub: RowValue | None = None    # indexed, a table or chunks of their own lengths: row r's count value
                                         # (value i's length) less this one before count_div divides it (a
                                         # context's length: the sequence's less its query's)
    part_last: bool = False          # indexed, a table: a row's last chunk is read in part, in proportion to
                                     # the count's units in its last block (v - count_div*(k-1) of count_div)
    lengths: bool = False            # indexed, not a table: count_index holds each value's length: chunk i
                                     # is `chunk` bytes times ceil(v(count_index)[i] / count_div), i < count
    length_diff: bool = False        # lengths: value i's length is v(count_index)[i+1] - v(count_index)[i]
                                     # (an indptr's consecutive entries)
    history: list[list[int]] = field(default_factory=list)  # irregular: pages relative to the allocation
    fit: dict = field(default_factory=dict)

    @property
    def predicts(self) -> str:
        """The class whose prediction this region takes (`PREDICTED_AS`; its own class elsewhere)."""
        return PREDICTED_AS.get(self.cls, self.cls)

    @property
    def position_range(self) -> bool:
        """Indexed rows by position, not by index values: `count` rows of `stride` bytes from
        `start`, the count read from count_index, with no lengths (predict/indexed.py)."""
        return self.index is None and not self.lengths and self.count_index is not None

    def formulas(self) -> dict[str, Formula]:
        return {k: getattr(self, k) for k in ("start", "end", "count", "chunk", "stride", "row_stride")
                if getattr(self, k) is not None}

    def feature_names(self) -> set[str]:
        out: set[str] = set()
        for f in self.formulas().values():
            out |= f.names()
        return out

    def text(self) -> str:
        b = self.base
        if self.cls in ("fixed", "linear"):
            return f"[{b} + {self.start.text()}, {b} + {self.end.text()})".replace("+ -", "- ").replace(" + 0,", ",")
        if self.cls == "strided":
            return (f"{self.count.text()} chunks of {self.chunk.text()} bytes every {self.stride.text()} bytes"
                    f" from {b} + {self.start.text()}")
        if self.cls == "indexed":
            return indexed_text(self)
        if self.cls == "allocation":
            return f"the allocation {b} points into"
        if self.cls == "unresolved":
            why = self.fit.get("unresolved", "") if isinstance(self.fit, dict) else ""
            what = f"the allocation {b} points into"
            if self.index is not None and self.count is not None:
                what += f" and those its first {self.count.text()} 64-bit values v64({self.index}) point into"
            return f"unresolved: {what}" + (f" ({why})" if why else "")
        return f"irregular in the allocation {b} points into"

    def to_json(self) -> dict:
        d: dict[str, Any] = {"base": self.base, "class": self.cls}
        if self.cls == "indexed":
            d["index"] = self.index
            d["elem"] = int(self.elem)
            if self.value_div != 1:
                d["value_div"] = int(self.value_div)
            if self.block_split is not None:
                d["block_split"] = self.block_split.to_json()
            if self.count_index is not None:
                d["count_index"] = self.count_index
                d["count_elem"] = int(self.count_elem)
                if self.count_div != 1:
                    d["count_div"] = int(self.count_div)
                if self.count_valid:
                    d["count_valid"] = True
                if self.part_last:
                    d["part_last"] = True
                if self.row_filter is not None:
                    d["row_filter"] = self.row_filter.to_json()
                if self.count_sub is not None:
                    d["count_sub"] = self.count_sub.to_json()
                if self.lengths:
                    d["lengths"] = True
                if self.length_diff:
                    d["length_diff"] = True
        if self.cls == "unresolved" and self.index is not None:   # a table of addresses (`count` of them)
            d["index"] = self.index
        for k, f in self.formulas().items():
            d[k] = f.to_json()
        if self.cls == "irregular":
            d["history"] = [[int(a), int(b)] for a, b in self.history]
        d["text"] = self.text()
        d["fit"] = self.fit
        return d


def _factor(f: Formula) -> str:
    """A formula as a factor of a product: bare when it is one term or a constant."""
    t = f.text()
    return t if f.n_terms + (1 if f.const else 0) <= 1 else f"({t})"


def indexed_text(r: Region) -> str:
    """`[p0 + 4*p4*v(p1)[i], +4*p4) for i < p3`: chunk i starts at base + start + stride * v[i],
    v the `elem`-byte integers at the pointer `index` (`v64(...)` for 8-byte ones). A count read
    from another buffer: `for i < v(p2)[grid_x]` (an indptr's entry at the batch size), or that
    value divided by a constant, rounded up: `for i < ceil(v(p11)[0] / 16)` (a padded token count
    over the block size: the blocks a launch runs). A two-dimensional table, row r of `row_stride`
    entries read up to its own count: `v(p7)[r*p20 + j] ... for r < p30, j < ceil(v(p8)[r] / 16)`
    (a block table read up to each sequence's length over the block size), each row's count
    less another buffer's value at the row where the region has a `count_sub`: `j < ceil((v(p11)[r]
    - (v(p10)[r+1] - v(p10)[r])) / 16)` (a prefill chunk's context). Each value's chunk as
    long as another buffer's value at the same position says (`lengths`): `+4*ceil(v(p2)[i] / 16))`
    (a request's row of a page table, chosen through the request's index, read up to its length
    over the page size), or as the difference of its consecutive values (`length_diff`:
    `+4*(v(p1)[i+1] - v(p1)[i]))`, an indptr); rows chosen by their position, not through an
    index (`index` None): `[p6 + 4*p10*i, +4*ceil(v(p7)[i] / 16)) for i < p21` (a block table's own
    row i, read up to the i-th sequence's length over the block size); without lengths, a
    buffer's first rows up to a count another buffer holds, read whole: `[p0, p0 +
    1024*v(p24)[p25])` (an output buffer's rows up to the query start offsets' last entry)."""
    table = r.row_stride is not None and r.count_index is not None
    if r.position_range and r.chunk == r.stride:
        # rows by position up to a count read from another buffer, read whole: one range
        n = f"{'v' if r.count_elem == 4 else 'v64'}({r.count_index})[{r.count.text()}]"
        if r.count_valid:   # the values not negative among the first `count`
            n = f"valid({'v' if r.count_elem == 4 else 'v64'}({r.count_index})[:{r.count.text()}])"
        n = n if r.count_div == 1 else f"ceil({n} / {r.count_div})"
        head = r.base if r.start.n_terms == 0 and r.start.const == 0 else f"{r.base} + {r.start.text()}"
        rows = n if r.stride.n_terms == 0 and r.stride.const == 1 else f"{_factor(r.stride)}*{n}"
        return f"[{head}, {head} + {rows})".replace("+ -", "- ")
    at = f"r*{_factor(r.row_stride)} + j" if table else "i"
    v = "i" if r.index is None else f"{'v' if r.elem == 4 else 'v64'}({r.index})[{at}]"
    v_raw = v
    if r.value_div != 1:
        v = f"floor({v} / {r.value_div})"
    st = r.stride
    if st.n_terms == 0 and st.const == 1:
        off = v
    else:
        off = f"{_factor(st)}*{v}"
    if r.block_split is not None:
        off += r.block_split.text(v_raw, r.value_div)
    head = r.base if r.start.n_terms == 0 and r.start.const == 0 else f"{r.base} + {r.start.text()}"
    lengths = r.lengths and r.count_index is not None and not table
    n = r.count.text() if r.count_index is None or lengths else \
        f"{'v' if r.count_elem == 4 else 'v64'}({r.count_index})[{'r' if table else r.count.text()}]"
    if r.count_valid and not table and not lengths:
        n = f"valid({'v' if r.count_elem == 4 else 'v64'}({r.count_index})[:{r.count.text()}])"
    if table and r.count_sub is not None:   # less another buffer's value: `v(p11)[r] - (v(p10)[r+1] - v(p10)[r])`
        sub = r.count_sub.text()
        n = f"{n} - {f'({sub})' if r.count_sub.diff else sub}"
    last_of = n
    if r.count_index is not None and r.count_div != 1 and not lengths:
        n = f"ceil({f'({n})' if table and r.count_sub is not None else n} / {r.count_div})"
    loop = f"r < {r.count.text()}, j < {n}" if table else f"i < {n}"
    if table and r.part_last:
        loop += f", the last in part: {last_of} - {r.count_div}*j of {r.count_div}"
    if table and r.row_filter is not None:
        loop += f", {r.row_filter.text()}"
    chunk = r.chunk.text()
    if lengths:
        cv = 'v' if r.count_elem == 4 else 'v64'
        ln = f"{cv}({r.count_index})[i]"
        if r.length_diff:
            ln = f"({cv}({r.count_index})[i+1] - {ln})"
        if r.count_sub is not None:   # less another buffer's value at the position, as a table's row
            sub = r.count_sub.text("i")
            ln = f"({ln} - {f'({sub})' if r.count_sub.diff else sub})"
        ln = ln if r.count_div == 1 else f"ceil({ln} / {r.count_div})"
        chunk = ln if r.chunk.n_terms == 0 and r.chunk.const == 1 else f"{_factor(r.chunk)}*{ln}"
        if r.row_filter is not None:   # values another buffer leaves out read nothing
            loop += f", {r.row_filter.text('i')}"
    if r.block_split is not None and r.block_split.parts > 1:
        loop += f", h < {r.block_split.parts}"
    return f"[{head} + {off}, +{chunk}) for {loop}".replace("+ -", "- ")


@dataclass
class Pinning:
    """How well a kernel's profile pins its templates down (docs/template-model.md, "What the fit
    does not know"): `groups` launch groups (distinct argument values) it was fitted from;
    `unvaried`, the arguments its formulas use that no launch varied (the formula's dependence on
    them is a guess: `128*p4` and `128*4096` agree wherever p4 is 4096); `cv`, the split-half
    cross-validation across launch groups: "agree" (each half of the groups alone gives the same
    templates), "differ" (`differ` names the regions whose half fits disagree, with the formulas
    each half gave), "too few groups" (under 4) or "skipped" (over FitParams.cv_max_launches)."""

    groups: int = 0
    unvaried: list[str] = field(default_factory=list)
    cv: str = "skipped"
    differ: dict[str, list[str]] = field(default_factory=dict)
    union: list[str] = field(default_factory=list)   # regions the evidence also admits, predicted too
    # regions whose constant end the records place only to a big page at every launch while
    # arguments varied (an extent that moved less than a big page: constant or growing, the
    # records cannot tell), and the varying arguments a profile should grow to tell them apart
    open_ends: list[str] = field(default_factory=list)
    grow: list[str] = field(default_factory=list)

    @property
    def pinned(self) -> bool:
        """Both halves agree, no formula uses an argument that never varied and no end is left
        open; or nothing varied at all and the templates are constants (they hold for runs with
        the same arguments)."""
        return not self.unvaried and not self.open_ends and (self.cv == "agree" or self.groups == 1)

    def text(self) -> str:
        parts = [f"{self.groups} launch groups", f"cross-validation: {self.cv}"]
        if self.differ:
            parts.append("halves differ on " + ", ".join(self.differ))
        if self.unvaried:
            parts.append("never varied: " + ", ".join(self.unvaried))
        if self.union:
            parts.append("predicted as the union with " + ", ".join(self.union))
        if self.open_ends:
            parts.append("ends under one big page throughout: " + ", ".join(self.open_ends))
        return "; ".join(parts)

    def advice(self) -> str:
        """What the next profile should do to pin the templates down ("" where they are)."""
        tips = []
        if self.unvaried:
            args = ", ".join(f"{w} (parameter {int(w[1:]) + 1})" if w[1:].isdigit() else w for w in self.unvaried)
            tips.append(f"add a profile in which {args} take{'s' if len(self.unvaried) == 1 else ''} "
                        "other values (another problem size or shape)")
        if self.open_ends:
            tips.append(f"add a profile in which {', '.join(self.grow)} grow{'s' if len(self.grow) == 1 else ''} "
                        f"until the region{'s' if len(self.open_ends) > 1 else ''} of {', '.join(self.open_ends)} "
                        "span more than a big page (constant or growing, the records cannot tell)")
        if self.cv == "differ":
            tips.append("add a profile at other sizes: halves of these launches fit different formulas")
        elif self.cv == "too few groups" and not self.pinned:
            tips.append("add a profile whose launches give at least 4 distinct sets of arguments")
        return "; ".join(tips)

    def to_json(self) -> dict:
        d = {"groups": self.groups, "unvaried": list(self.unvaried), "cv": self.cv,
             "differ": {k: list(v) for k, v in self.differ.items()}}
        if self.union:
            d["union"] = list(self.union)
        if self.open_ends:
            d["open_ends"], d["grow"] = list(self.open_ends), list(self.grow)
        return d

    @classmethod
    def from_json(cls, d, where: str) -> "Pinning":
        if not isinstance(d, dict):
            raise ValueError(f"{where}: pinned must be an object")
        g, un, cv, df = d.get("groups", 0), d.get("unvaried", []), d.get("cv", "skipped"), d.get("differ", {})
        uu = d.get("union", [])
        oe, gr = d.get("open_ends", []), d.get("grow", [])
        if not all(isinstance(x, list) and all(isinstance(y, str) for y in x) for x in (oe, gr)):
            raise ValueError(f"{where}: pinned's open_ends and grow must be lists of names")
        if type(g) is not int or g < 0 or not isinstance(un, list) or not all(isinstance(x, str) for x in un) \
                or not isinstance(uu, list) or not all(isinstance(x, str) for x in uu) \
                or not isinstance(cv, str) or not isinstance(df, dict) \
                or not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in df.values()):
            raise ValueError(f"{where}: pinned must hold groups (int), unvaried (names), cv (text), differ (lists), "
                             "union (texts)")
        return cls(g, list(un), cv, {str(k): list(v) for k, v in df.items()}, list(uu), list(oe), list(gr))


@dataclass
class KernelModel:
    name: str
    param_sizes: tuple
    param_offsets: tuple
    regions: list[Region] = field(default_factory=list)
    launches: int = 0
    traces: int = 0
    note: str = ""
    feedback: dict = field(default_factory=lambda: {"events": 0, "misses": 0, "missed_pages": 0})
    pinned: Pinning | None = None   # how well the profile pins the templates (absent: not assessed)
    # the same kernel with other parameter layouts (a Triton kernel specialized on an argument
    # passed as None, which leaves the parameter buffer), each fitted from its own launches
    variants: list["KernelModel"] = field(default_factory=list)

    def for_layout(self, sizes, offsets=None) -> "KernelModel | None":
        """This model or the variant whose parameter layout is `sizes` (and `offsets`, where
        given); None where none is."""
        for km in (self, *self.variants):
            if tuple(sizes) == tuple(km.param_sizes) and (offsets is None or tuple(offsets) == tuple(km.param_offsets)):
                return km
        return None

    @property
    def cls(self) -> str:
        if not self.regions:
            return "irregular" if self.note else "fixed"
        return max((r.cls for r in self.regions), key=lambda c: _RANK[c])

    @property
    def classes(self) -> list[str]:
        return sorted({r.cls for r in self.regions}, key=lambda c: _RANK[c]) or [self.cls]

    def to_json(self) -> dict:
        d = {"param_sizes": list(self.param_sizes), "param_offsets": list(self.param_offsets),
             "class": self.cls, "launches": int(self.launches), "traces": int(self.traces),
             "regions": [r.to_json() for r in self.regions], "feedback": self.feedback}
        if self.note:
            d["note"] = self.note
        if self.pinned is not None:
            d["pinned"] = self.pinned.to_json()
        if self.variants:
            d["variants"] = [v.to_json() for v in self.variants]
        return d


@dataclass
class Model:
    page_size: int = PAGE
    big_page: int = BIG_PAGE
    kernels: dict[str, KernelModel] = field(default_factory=dict)
    traces: list[dict] = field(default_factory=list)
    created: str = ""
    producer: str = PRODUCER
    path: Path | None = None
    version_counter: int = 0  # bumped on every change (feedback), so caches can notice
    fit_params: dict | None = None  # the FitParams it was fitted with (absent in older model files)

    def to_json(self) -> dict:
        d = {"format": FORMAT, "version": VERSION, "page_size": self.page_size,
             "big_page": self.big_page, "created": self.created, "producer": self.producer,
             "traces": self.traces}
        if self.fit_params is not None:
            d["fit_params"] = self.fit_params
        d["summary"] = self.summary()
        d["kernels"] = {k: v.to_json() for k, v in sorted(self.kernels.items())}
        return d

    def summary(self) -> dict:
        by = {c: 0 for c in CLASSES}
        regions = {c: 0 for c in CLASSES}
        for k in self.kernels.values():
            by[k.cls] += 1
            for r in k.regions:
                regions[r.cls] += 1
        unexplained = sum(int(r.fit.get("unexplained", 0)) for k in self.kernels.values() for r in k.regions
                          if isinstance(r.fit, dict) and isinstance(r.fit.get("unexplained", 0), int))
        return {"kernels": len(self.kernels), "kernels_by_class": by, "regions_by_class": regions,
                "unexplained_launches": unexplained}


# ---- saving and loading --------------------------------------------------------

def save_model(model: Model, path, force: bool = False) -> Path:
    path = Path(path)
    if path.exists() and not force:
        raise OutputExistsError(path)
    if path.is_dir():
        raise ModelError(f"{path} is a directory; a model is one JSON file")
    write_json_atomic(path, model.to_json(), indent=1, force=force)
    model.path = path
    return path


def load_model(path) -> Model:
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{path}: no such model file")
    if path.is_dir():
        raise ModelError(f"{path}: is a directory; a model is a JSON file written by 'pagecast fit'")
    doc = read_json(path, ModelError)
    try:
        return model_from_json(doc, path)
    except ModelError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ModelError(f"{path}: {e}") from None


def _int(d: dict, key: str, where: str, minimum: int | None = None) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or (minimum is not None and v < minimum):
        raise ValueError(f"{where}: {key} must be an integer" + (f" >= {minimum}" if minimum is not None else "")
                         + f", found {v!r}")
    return v


def model_from_json(doc: Any, path: Path | None = None) -> Model:
    where = str(path) if path else "model"
    if not isinstance(doc, dict):
        raise ModelError(f"{where}: expected a JSON object, found {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise ModelError(f"{where}: format is {doc.get('format')!r}; this reader reads {FORMAT!r}")
    if type(doc.get("version")) is not int or doc.get("version") != VERSION:  # true and 1.0 are not 1
        raise ModelError(f"{where}: model version is {doc.get('version')!r}; this pagecast reads version {VERSION}"
                         " (refit with 'pagecast fit')")
    ps = _int(doc, "page_size", "model", 1)
    if ps & (ps - 1):
        raise ValueError(f"page_size must be a power of two, found {ps}")
    big = _int(doc, "big_page", "model", ps) if "big_page" in doc else BIG_PAGE
    if big & (big - 1):
        raise ValueError(f"big_page must be a power of two, found {big}")
    kernels_doc = doc.get("kernels")
    if not isinstance(kernels_doc, dict):
        raise ValueError("'kernels' must be an object mapping kernel names to templates")
    fp = doc.get("fit_params")
    if fp is not None:
        fp = _fit_params(fp)   # checked; older model files have none
    m = Model(page_size=ps, big_page=int(big), traces=list(doc.get("traces") or []),
              created=str(doc.get("created") or ""), producer=str(doc.get("producer") or ""), path=path,
              fit_params=fp)
    for name, kd in kernels_doc.items():
        m.kernels[name] = _kernel_from_json(name, kd, f"kernel {name!r}")
    return m


def _kernel_from_json(name: str, kd: Any, kw: str, variant: bool = False) -> KernelModel:
    if not isinstance(kd, dict):
        raise ValueError(f"{kw}: expected an object")
    sizes = kd.get("param_sizes")
    offs = kd.get("param_offsets")
    if (not isinstance(sizes, list) or not isinstance(offs, list) or len(sizes) != len(offs)
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sizes + offs)):
        raise ValueError(f"{kw}: param_sizes and param_offsets must be equal-length lists of integers >= 0")
    km = KernelModel(name, tuple(sizes), tuple(offs), launches=_int(kd, "launches", kw, 0),
                     traces=_int(kd, "traces", kw, 0), note=str(kd.get("note") or ""))
    if kd.get("pinned") is not None:
        km.pinned = Pinning.from_json(kd["pinned"], kw)
    fb = kd.get("feedback")
    if isinstance(fb, dict):
        km.feedback.update(fb)
    regs = kd.get("regions")
    if not isinstance(regs, list):
        raise ValueError(f"{kw}: regions must be a list")
    for i, rd in enumerate(regs):
        km.regions.append(_region_from_json(rd, f"{kw} region {i}", sizes, offs))
    vs = kd.get("variants", [])
    if not isinstance(vs, list) or (vs and variant):
        raise ValueError(f"{kw}: variants must be a list of kernel objects (other parameter layouts), "
                         "themselves without variants")
    for i, vd in enumerate(vs):
        v = _kernel_from_json(name, vd, f"{kw} variant {i}", variant=True)
        if any(v.param_sizes == k.param_sizes and v.param_offsets == k.param_offsets for k in (km, *km.variants)):
            raise ValueError(f"{kw} variant {i}: its parameter layout is the kernel's or another variant's")
        km.variants.append(v)
    return km


def _region_from_json(rd: Any, where: str, sizes, offs) -> Region:
    if not isinstance(rd, dict):
        raise ValueError(f"{where}: expected an object")
    cls = rd.get("class")
    if cls not in CLASSES:
        raise ValueError(f"{where}: class must be one of {', '.join(CLASSES)}, found {cls!r}")
    base = rd.get("base")
    _check_word(base, where, sizes, offs, pointer=True)
    r = Region(base=base, cls=cls, fit=rd.get("fit") if isinstance(rd.get("fit"), dict) else {})
    need = {"fixed": ("start", "end"), "linear": ("start", "end"),
            "strided": ("start", "count", "chunk", "stride"),
            "indexed": ("start", "count", "chunk", "stride")}.get(cls, ())
    for k in need:
        if k not in rd:
            raise ValueError(f"{where}: a {cls} region needs {k!r}")
        try:
            f = Formula.from_json(rd[k])
        except ValueError as e:
            raise ValueError(f"{where}: {k}: {e}") from None
        for n in f.names():
            _check_word(n, f"{where}: {k}", sizes, offs)
        setattr(r, k, f)
    if cls == "unresolved" and rd.get("index") is not None:
        # the allocations the first `count` 64-bit values at `index` point into (a table of addresses)
        _check_word(rd["index"], f"{where}: index", sizes, offs, pointer=True)
        try:
            r.count = Formula.from_json(rd.get("count"))
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"{where}: an unresolved region with an index needs a count: {e}") from None
        if r.count.terms or not 1 <= r.count.const <= 1 << 20:
            raise ValueError(f"{where}: an unresolved region's count must be a constant from 1 to 2**20 (the "
                             f"addresses its table holds)")
        r.index, r.elem = rd["index"], 8
    if cls == "fixed" and (r.start.terms or r.end.terms):
        raise ValueError(f"{where}: a fixed region's start and end must be constants")
    if cls == "indexed":
        # rows by position (no index word): read up to their lengths, or up to a count read from
        # another buffer (predict/indexed.py)
        by_pos = rd.get("index") is None and (rd.get("lengths") is True or (
            rd.get("count_index") is not None and rd.get("row_stride") is None))
        if not by_pos:
            _check_word(rd.get("index"), f"{where}: index", sizes, offs, pointer=True)
        elem = rd.get("elem", 4)
        if elem not in INDEX_ELEMS or isinstance(elem, bool):
            raise ValueError(f"{where}: elem must be one of {', '.join(map(str, INDEX_ELEMS))} (bytes per index"
                             f" value), found {elem!r}")
        r.index, r.elem = rd.get("index"), int(elem)
        vd = rd.get("value_div", 1)
        if not isinstance(vd, int) or isinstance(vd, bool) or not 1 <= vd <= 1 << 30:
            raise ValueError(f"{where}: value_div must be an integer from 1 to 2**30 (each value is divided by it, "
                             f"rounded down), found {vd!r}")
        r.value_div = vd
        bs = rd.get("block_split")
        if bs is not None:
            r.block_split = _block_split(bs, vd, where)
        if rd.get("count_index") is not None:
            _check_word(rd["count_index"], f"{where}: count_index", sizes, offs, pointer=True)
            ce = rd.get("count_elem", 4)
            if ce not in INDEX_ELEMS or isinstance(ce, bool):
                raise ValueError(f"{where}: count_elem must be one of {', '.join(map(str, INDEX_ELEMS))}, found {ce!r}")
            r.count_index, r.count_elem = rd["count_index"], int(ce)
            cd = rd.get("count_div", 1)
            if not isinstance(cd, int) or isinstance(cd, bool) or not 1 <= cd <= 1 << 30:
                raise ValueError(f"{where}: count_div must be an integer from 1 to 2**30 (the count is the value "
                                 f"read, divided by it, rounded up), found {cd!r}")
            r.count_div = cd
            cv = rd.get("count_valid", False)
            if not isinstance(cv, bool):
                raise ValueError(f"{where}: count_valid must be true or false, found {cv!r}")
            if cv and (rd.get("row_stride") is not None or rd.get("lengths", False)):
                raise ValueError(f"{where}: count_valid (the count of values not negative) needs no row_stride "
                                 f"and no lengths")
            r.count_valid = cv
        ln = rd.get("lengths", False)
        if not isinstance(ln, bool):
            raise ValueError(f"{where}: lengths must be true or false, found {ln!r}")
        if ln and (r.count_index is None or rd.get("row_stride") is not None):
            raise ValueError(f"{where}: lengths (each value's chunk length read from another buffer) needs a "
                             f"count_index (the buffer that holds them) and no row_stride")
        r.lengths = ln
        ld = rd.get("length_diff", False)
        if not isinstance(ld, bool):
            raise ValueError(f"{where}: length_diff must be true or false, found {ld!r}")
        if ld and not ln:
            raise ValueError(f"{where}: length_diff (each length the difference of consecutive values) needs "
                             f"lengths")
        r.length_diff = ld
        if rd.get("row_stride") is not None:
            if r.count_index is None:
                raise ValueError(f"{where}: a row_stride (a two-dimensional table) needs a count_index (the buffer"
                                 f" that holds each row's count)")
            try:
                r.row_stride = Formula.from_json(rd["row_stride"])
            except ValueError as e:
                raise ValueError(f"{where}: row_stride: {e}") from None
            for n in r.row_stride.names():
                _check_word(n, f"{where}: row_stride", sizes, offs)
            pl = rd.get("part_last", False)
            if not isinstance(pl, bool):
                raise ValueError(f"{where}: part_last must be true or false, found {pl!r}")
            r.part_last = pl
            if r.block_split is not None:
                raise ValueError(f"{where}: block_split (a slot's place in its block) needs values read one by one: "
                                 f"no lengths, no row_stride, an index")
            if rd.get("row_filter") is not None:
                r.row_filter = _row_filter(rd["row_filter"], f"{where}: row_filter", sizes, offs)
            if rd.get("count_sub") is not None:
                r.count_sub = _row_value(rd["count_sub"], f"{where}: count_sub", sizes, offs)
        else:
            if r.block_split is not None and (ln or r.position_range):
                raise ValueError(f"{where}: block_split (a slot's place in its block) needs values read one by one: "
                                 f"no lengths, no row_stride, an index")
            if rd.get("row_filter") is not None:
                if not ln:
                    raise ValueError(f"{where}: a row_filter needs a row_stride (a two-dimensional table's rows) "
                                     f"or lengths (chunks of their own lengths)")
                r.row_filter = _row_filter(rd["row_filter"], f"{where}: row_filter", sizes, offs)
            if rd.get("count_sub") is not None:
                if not ln:
                    raise ValueError(f"{where}: a count_sub needs a row_stride (a two-dimensional table's rows) "
                                     f"or lengths (chunks of their own lengths)")
                r.count_sub = _row_value(rd["count_sub"], f"{where}: count_sub", sizes, offs)
    if cls == "irregular":
        h = rd.get("history", [])
        if not isinstance(h, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
                and 0 <= p[0] < p[1] for p in h):
            raise ValueError(f"{where}: history must be a list of [start, end) page pairs, 0 <= start < end")
        r.history = h
    return r


def _row_value(fd: Any, where: str, sizes, offs) -> RowValue:
    """A table's per-row value from its JSON (RowValue), or ValueError naming what is wrong."""
    if not isinstance(fd, dict):
        raise ValueError(f"{where}: must be an object with index, elem and diff")
    _check_word(fd.get("index"), f"{where}: index", sizes, offs, pointer=True)
    elem, diff = fd.get("elem", 4), fd.get("diff", False)
    if elem not in INDEX_ELEMS or isinstance(elem, bool):
        raise ValueError(f"{where}: elem must be one of {', '.join(map(str, INDEX_ELEMS))}, found {elem!r}")
    if not isinstance(diff, bool):
        raise ValueError(f"{where}: diff must be true or false, found {diff!r}")
    return RowValue(fd["index"], int(elem), diff)


def _row_filter(fd: Any, where: str, sizes, offs) -> RowFilter:
    """A table's row filter from its JSON (RowFilter), or ValueError naming what is wrong."""
    rv = _row_value(fd, where, sizes, offs)
    op, value = fd.get("op"), fd.get("value")
    if op not in ("le", "ge"):
        raise ValueError(f"{where}: op must be 'le' or 'ge' (rows read where the value is at most or at least "
                         f"`value`), found {op!r}")
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) > 1 << 62:
        raise ValueError(f"{where}: value must be an integer, found {value!r}")
    return RowFilter(rv.index, rv.elem, rv.diff, op, value)


def _block_split(bs: Any, vd: int, where: str) -> BlockSplit:
    """An indexed region's `block_split` from the model file, checked: an object of three integers
    (slot_bytes >= 1, parts from 1 to 2**16, part_stride >= 0), on a region whose values are divided."""
    keys = ("slot_bytes", "parts", "part_stride")
    if not isinstance(bs, dict) or set(bs) - set(keys) or "slot_bytes" not in bs:
        raise ValueError(f"{where}: block_split must be an object with slot_bytes, parts and part_stride, found {bs!r}")
    x = {k: bs.get(k, 1 if k == "parts" else 0) for k in keys}
    if any(not isinstance(v, int) or isinstance(v, bool) for v in x.values()) or x["slot_bytes"] < 1 \
            or not 1 <= x["parts"] <= 1 << 16 or x["part_stride"] < 0 or max(x.values()) > 1 << 40:
        raise ValueError(f"{where}: block_split's slot_bytes (>= 1), parts (1 to 2**16) and part_stride (>= 0) must be "
                         f"integers, found {bs!r}")
    if vd < 2:
        raise ValueError(f"{where}: block_split needs value_div of 2 or more (a slot's place in its block), found {vd!r}")
    return BlockSplit(**x)


def _check_word(name: Any, where: str, sizes, offs, pointer: bool = False) -> None:
    if not isinstance(name, str):
        raise ValueError(f"{where}: a parameter word name must be a string, found {name!r}")
    try:
        w = Word.parse(name)
    except ValueError:
        raise ValueError(f"{where}: {name!r} is not a parameter word (p3, p0.w2, p0.d2, grid_x, ...)") from None
    if w.param < 0:
        if pointer:
            raise ValueError(f"{where}: base {name!r} is not a parameter")
        return
    if w.param >= len(sizes):
        raise ValueError(f"{where}: {name!r} names parameter {w.param}, but the kernel has {len(sizes)}")
    w = w.resolve(sizes)
    if w.size not in (1, 2, 4, 8) or w.within + w.size > sizes[w.param]:
        raise ValueError(f"{where}: {name!r} lies outside parameter {w.param} ({sizes[w.param]} bytes)")
    if pointer and w.size != 8:
        raise ValueError(f"{where}: base {name!r} is not an 8-byte word")


def _fit_params(d) -> dict:
    """The fit's thresholds a model records (`fit.params.FitParams`, which reads them back with its
    own types): an object of non-negative finite numbers. ValueError names the first bad one."""
    if not isinstance(d, dict):
        raise ValueError("fit_params must be an object")
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"fit_params.{k} must be a non-negative number, found {v!r}")
    return dict(d)
