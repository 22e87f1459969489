"""The simulator's view of one or more traces: tasks, their launch order on a
shared GPU, and every footprint mapped to dense migration-unit ids.

Long because the universe, its memory chunks, the schedule and the needs
(with their gates and page counts) are one dense numbering that every stage
shares; split, each part would re-derive the others' indexing.

- Units: a unit is one migration granule (the profile's 64 KiB, or
  `--granularity`). Each task's units are numbered in its own address space
  (`address // granularity`); the *universe* is the union, per task, of the
  units that launches touch, that allocations cover and that predictions name,
  renumbered densely (task after task, ascending address) so the numba loops
  index plain arrays. Memory chunks (a 2 MiB chunk per VA block an allocation
  covers whole, 64 KiB chunks in a block it covers in part: `chunk_starts`) and
  tree-prefetch blocks (2 MiB) are then runs of consecutive dense ids; a chunk
  takes its whole size of the capacity while any of its units is resident.
- Schedule: several traces are several tasks on one GPU, run round-robin in
  time slices of `timeslice_s` *kernel* time, switching at launch boundaries
  (MSched's multitasking setting). Slices count execution time only, so every
  policy sees the same launch order and a planner can plan for it.
- Needs: the units each step (scheduled launch) touches, in CSR form
  (ascending unit ids within a step); for the truth (what the simulator
  replays) and for any prediction (what planners plan on).
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import numpy as np
import pyarrow.compute as pc
from numba import njit

from pagecast import footprints as F
from pagecast import trace as T
from pagecast.uvm import BIG_PAGE, VA_BLOCK
from .placement import host_split, split_footprints

I64 = np.int64
ID = np.int32   # what a per-use array of steps holds where every value fits (`narrow`; unit ids and page counts: UNIT_ID)


def narrow(a: np.ndarray | None) -> np.ndarray | None:
    """A per-use integer array (unit ids, steps, page counts: Needs, Groups) as int32 where every
    value fits, else as it is; int16 unit ids (UNIT_ID: made so by the universe, see `narrow_small`)
    are kept as they are. Those arrays are most of a replay's memory (10^6 launches: tens of
    millions of uses, each in several of them) and their values stay far below 2^31 (units and
    steps of a workload); a value that does not fit keeps the array int64, so nothing wraps. Every
    reader takes either width (the numba kernels compile for each; numpy widens where it meets
    int64), so results do not depend on it."""
    if a is None or a.dtype == ID or a.dtype == UNIT_ID or a.dtype.kind not in "iu":
        return a
    if len(a) == 0:
        return a.astype(ID)
    info = np.iinfo(ID)
    if int(a.min()) >= info.min and int(a.max()) <= info.max:
        return a.astype(ID)
    return a


UNIT_ID = np.int16   # unit ids where the universe has fewer units than its largest value; page counts that fit


def unit_width(n_units: int):
    """The width dense unit ids of a universe of `n_units` are written in: int16 (UNIT_ID) below
    2^15 - 1 units (2 GiB at 64 KiB units), else int32 (ID), else int64. Chosen by the universe,
    never by the values of one array: the planner's kernels write ids an array does not hold (a
    step's whole blocks, a victim resident from before) in that array's width, so every id of the
    universe must fit it. Unit ids in int16 halve the arrays a planned replay holds most of
    (Needs.unit, a plan's transfers)."""
    return UNIT_ID if n_units < np.iinfo(UNIT_ID).max else ID if n_units <= np.iinfo(ID).max else I64


def narrow_small(a: np.ndarray | None) -> np.ndarray | None:
    """`narrow` for page counts (Needs.pages: a unit's pages, bounded by the unit's size, never an
    id): int16 where every value fits, else `narrow`'s width. Readers take any width (numba
    compiles for each; numpy widens where it meets a wider array). Not for unit ids: `unit_width`."""
    if a is None or a.dtype == UNIT_ID or a.dtype.kind not in "iu":
        return a
    if len(a) == 0:
        return a.astype(UNIT_ID)
    info = np.iinfo(UNIT_ID)
    if int(a.min()) >= info.min and int(a.max()) < info.max:   # below it: an id + 1 (a run's end) fits too
        return a.astype(UNIT_ID)
    return narrow(a)


@dataclass
class Task:
    name: str
    trace: T.Trace
    truth: F.Footprints              # what the launches touched (truth, else observed)
    compute_s: np.ndarray            # per launch, seconds of kernel execution
    alloc_fp: F.Footprints | None = None   # pointer params -> whole allocations (alloc / swap)
    host_s: np.ndarray | float = 0.0       # per launch, the part of compute_s spent on host-placed memory


def task_names(traces: list[T.Trace]) -> list[str]:
    names = [t.name for t in traces]
    out = []
    for i, n in enumerate(names):
        out.append(n if names.count(n) == 1 else f"{n}#{names[:i + 1].count(n)}")
    return out


def compute_times(trace: T.Trace, truth: F.Footprints, profile) -> np.ndarray:
    """Kernel execution time per launch.

    `kernel_time` "trace" uses the launches' GPU timestamps; "model" charges
    footprint bytes at the profile's device bandwidth (at least the launch
    overhead); "auto" takes the timestamps of synthetic traces (the workload
    models' roofline clock, free of fault time) and the model elsewhere
    (collected `full`-mode timestamps include the faults we want to simulate).
    """
    n = trace.n_launches
    if not profile.charges:
        return np.zeros(n)  # `none`: counting only
    model = np.maximum(truth.pages_per_launch() * trace.page_size / profile.device_bandwidth,
                       profile.launch_overhead_s)
    mode = profile.kernel_time
    if mode == "model":
        return model
    st = trace.launches.column(T.START_NS)
    en = trace.launches.column(T.END_NS)
    have = n > 0 and st.null_count == 0 and en.null_count == 0
    use = mode == "trace" or (mode == "auto" and trace.manifest.get("source") == "synthetic")
    if not (have and use):
        return model
    d = (en.to_numpy() - st.to_numpy()).astype(np.float64) * 1e-9
    return np.where(d > 0, d, model)


def alloc_footprints(trace: T.Trace) -> F.Footprints:
    """Per launch, the whole allocations its pointer parameters point into.

    Every 8-byte-aligned word of every parameter of at least 8 bytes (so struct
    parameters too) that lands inside an allocation live at that launch counts
    (MSched's "Alloc." baseline). Vectorized over the whole trace.
    """
    L = trace.launches
    n = L.num_rows
    ps = trace.page_size
    A = trace.allocations
    if n == 0 or A.num_rows == 0:
        return F.Footprints.empty(n, ps, "predicted")
    offs = pc.list_flatten(L.column(T.PARAM_OFFSETS)).to_numpy(zero_copy_only=False).astype(I64)
    sizes = pc.list_flatten(L.column(T.PARAM_SIZES)).to_numpy(zero_copy_only=False).astype(I64)
    cnt = pc.list_value_length(L.column(T.PARAM_OFFSETS)).to_numpy(zero_copy_only=False).astype(I64)
    owner = np.repeat(np.arange(n, dtype=I64), cnt)
    data = L.column(T.PARAM_DATA).combine_chunks()
    bufs = data.buffers()
    voff = np.frombuffer(bufs[1], dtype=np.int32, count=len(data) + 1 + data.offset)[data.offset:].astype(I64)
    raw = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    nwords = np.where(sizes >= 8, sizes // 8, 0)
    w_owner = np.repeat(owner, nwords)
    w_pos = np.repeat(voff[owner] + offs, nwords) + 8 * F._ranges(np.zeros(len(nwords), I64), nwords)
    if len(w_pos) == 0:
        return F.Footprints.empty(n, ps, "predicted")
    b = raw[w_pos[:, None] + np.arange(8)]
    words = np.ascontiguousarray(b).view("<u8").ravel()
    a_addr = A.column(T.ADDRESS).to_numpy().astype(np.uint64)
    a_end = a_addr + A.column(T.BYTES).to_numpy().astype(np.uint64)
    a_first = A.column(T.FIRST_LAUNCH).to_numpy()
    a_last = pc.fill_null(A.column(T.LAST_LAUNCH), np.iinfo(I64).max).to_numpy()
    order = np.argsort(a_addr, kind="stable")
    sa, se, sf, sl = a_addr[order], a_end[order], a_first[order], a_last[order]
    pos = np.searchsorted(sa, words, side="right") - 1
    hit_l, hit_a = [], []
    # an address may be reused after a free: look at a few candidates below
    for back in range(4):
        k = pos - back
        ok = k >= 0
        kk = np.where(ok, k, 0)
        ok &= (words >= sa[kk]) & (words < se[kk]) & (sf[kk] <= w_owner) & (w_owner <= sl[kk])
        hit_l.append(w_owner[ok])
        hit_a.append(kk[ok])
    hl = np.concatenate(hit_l)
    ha = np.concatenate(hit_a)
    s, e = F.page_span(sa[ha], (se[ha] - sa[ha]).astype(I64), ps)
    return F.Footprints.from_intervals(hl, s, e, n, ps, "predicted")


def unit_page_counts(fp: F.Footprints, gran: int) -> tuple[np.ndarray, np.ndarray]:
    """Per launch, its units (ascending) and how many pages it touches in each, as CSR
    (indptr, pages): what its faults in a unit number (the driver counts a fault per page;
    one per unit where a unit is no larger than a page)."""
    ps = fp.page_size
    n = fp.n_launches
    lid = fp.launch_of_interval()
    if gran <= ps or not len(lid):
        l, s, e = unit_intervals(fp, gran)
        cnt = e - s
        indptr = np.zeros(n + 1, I64)
        np.cumsum(np.bincount(np.repeat(l, cnt), minlength=n), out=indptr[1:])
        return indptr, np.ones(int(cnt.sum()), I64)
    r = gran // ps
    if len(fp.start) and int(fp.end.max()) < np.iinfo(I64).max // 2:
        # a launch's intervals in order (a merged footprint's are): one pass, memory for the result
        # only (the sort below keeps eight arrays of every use: what needs_from peaked on)
        # a unit's page count is at most r (the kernel takes disjoint intervals only): written in the
        # width `narrow_small` keeps it in (an int64 array of every use, narrowed after, was the
        # largest transient of needs_from; an int32 one narrowed after, of an alternative's pages)
        like = np.empty(0, UNIT_ID if r < np.iinfo(UNIT_ID).max else ID if r <= np.iinfo(ID).max else I64)
        indptr, tot = _unit_pages_in_order(lid.astype(I64, copy=False), fp.start.astype(I64, copy=False),
                                           fp.end.astype(I64, copy=False), int(r), int(n), like)
        if indptr[0] == 0:
            return indptr, narrow_small(tot)
    su, eu = fp.start // r, (fp.end - 1) // r + 1
    k = eu - su
    u = F._ranges(su.astype(I64), k.astype(I64))
    iv = np.repeat(np.arange(len(su), dtype=I64), k)
    pages = np.minimum(fp.end[iv], (u + 1) * r) - np.maximum(fp.start[iv], u * r)
    key = lid[iv].astype(I64)
    order = np.lexsort((u, key))
    key, u, pages = key[order], u[order], pages[order]
    new = np.ones(len(u), bool)
    new[1:] = (key[1:] != key[:-1]) | (u[1:] != u[:-1])
    grp = np.cumsum(new) - 1
    tot = np.bincount(grp, weights=pages).astype(I64)
    indptr = np.zeros(n + 1, I64)
    np.cumsum(np.bincount(key[new], minlength=n), out=indptr[1:])
    return indptr, narrow_small(tot)


@njit(cache=True)
def _unit_pages_in_order(lid, start, end, r, n, like):
    """unit_page_counts' (indptr, pages) where every launch's units come ascending in interval order
    (launches ascending too): then its sort keeps them where they are and each (launch, unit) is a
    run of consecutive entries, summed here in two passes (count, then fill). indptr[0] = -1 where
    they do not come so, or where two intervals of a launch overlap (the caller sorts): a unit's
    count is then at most r, and comes in `like`'s width."""
    cnt = np.zeros(n + 1, np.int64)
    pl = -1
    pu = -1
    prev_l = -1
    prev_e = 0
    for i in range(len(start)):
        la = lid[i]
        if la == prev_l and start[i] < prev_e:
            cnt[0] = -1
            return cnt, np.zeros(0, like.dtype)
        prev_l = la
        prev_e = end[i]
        for u in range(start[i] // r, (end[i] - 1) // r + 1):
            if la < pl or (la == pl and u < pu):
                cnt[0] = -1
                return cnt, np.zeros(0, like.dtype)
            if la != pl or u != pu:
                cnt[la + 1] += 1
            pl = la
            pu = u
    for j in range(n):
        cnt[j + 1] += cnt[j]
    tot = np.zeros(cnt[n], like.dtype)
    j = -1
    pl = -1
    pu = -1
    for i in range(len(start)):
        la = lid[i]
        for u in range(start[i] // r, (end[i] - 1) // r + 1):
            if la != pl or u != pu:
                j += 1
                pl = la
                pu = u
            tot[j] += min(end[i], (u + 1) * r) - max(start[i], u * r)
    return cnt, tot


def unit_intervals(fp: F.Footprints, gran: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Page intervals -> merged unit intervals per launch: (launch, start_unit, end_unit)."""
    ps = fp.page_size
    lid = fp.launch_of_interval()
    if gran >= ps:
        r = gran // ps
        s = fp.start // r
        e = -((-fp.end) // r)
    else:
        r = ps // gran
        s = fp.start * r
        e = fp.end * r
    l, s, e = F.merge_intervals(lid, s.astype(I64), e.astype(I64), fp.n_launches)
    return l, s, e


def chunk_starts(keys: np.ndarray, gran: int, eviction_unit: int,
                 allocs: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """Per unit key (address // gran): the byte address of the GPU memory chunk that backs it and that
    chunk's size, as nvidia-uvm allocates them (docs/cost-model.md, "The driver model"): a 2 MiB VA
    block that an allocation covers whole is backed by one chunk of `eviction_unit` (the 2 MiB root
    chunk) as soon as any page of it is populated; a block allocations cover only in part (an
    allocation's first or last block) by 64 KiB chunks (`BIG_PAGE`, at most `eviction_unit`, at least
    `gran`). Decided per block, so every unit of a block has chunks of one size (allocations that
    reuse an address count as any that cover it). `allocs`: the task's allocations (start, end) in
    bytes; a block no allocation touches counts as whole."""
    addr = keys.astype(I64) * gran
    size = np.full(len(keys), max(int(eviction_unit), gran), I64)
    if allocs is not None and len(allocs[0]) and len(keys):
        a0, a1 = np.asarray(allocs[0], I64), np.asarray(allocs[1], I64)
        blk = addr // VA_BLOCK
        whole = _in_intervals(blk, -(-a0 // VA_BLOCK), a1 // VA_BLOCK)
        touched = _in_intervals(blk, a0 // VA_BLOCK, -(-a1 // VA_BLOCK))
        size[touched & ~whole] = max(min(BIG_PAGE, int(eviction_unit)), gran)
    return addr - addr % size, size


def _in_intervals(x: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Whether each x lies in the union of the intervals [s, e)."""
    ok = e > s
    _, ms, me = F.merge_intervals(np.zeros(int(ok.sum()), I64), s[ok], e[ok], 1)
    if not len(ms):
        return np.zeros(len(x), bool)
    k = np.searchsorted(ms, x, side="right") - 1
    return (k >= 0) & (x < me[np.maximum(k, 0)])


class Universe:
    """Dense unit ids for each task's unit intervals (see module doc). Chunks are the GPU memory
    chunks that back the units (chunk_starts): `chunk_weight[c]` is chunk c's size in units, what it
    takes of the capacity while any unit of it is resident."""

    def __init__(self, per_task: list[list[tuple[np.ndarray, np.ndarray]]], gran: int, eviction_unit: int,
                 allocs: list[tuple[np.ndarray, np.ndarray] | None] | None = None):
        self.gran = gran
        self.task_lo: list[int] = []
        keys, chunk_ids, block_ids, weights = [], [], [], []
        base = 0
        chunk_base = 0
        block_base = 0
        upb = max(VA_BLOCK // gran, 1)
        self.upb = upb
        self.iv: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for t, ivs in enumerate(per_task):
            s = np.concatenate([a for a, _ in ivs]) if ivs else np.zeros(0, I64)
            e = np.concatenate([b for _, b in ivs]) if ivs else np.zeros(0, I64)
            _, us, ue = F.merge_intervals(np.zeros(len(s), I64), s, e, 1)
            lens = ue - us
            off = base + np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(I64)
            self.task_lo.append(base)
            self.iv.append((us, ue, off))
            k = F.expand_intervals(us, ue)
            keys.append(k)
            ch, csz = chunk_starts(k, gran, eviction_unit, allocs[t] if allocs else None)
            bl = k // upb
            # renumber chunks/blocks densely, per task (tasks never share one)
            first, chd = np.unique(ch, return_index=True, return_inverse=True)[1:]
            weights.append(np.maximum(csz[first] // gran, 1).astype(I64))
            _, bld = np.unique(bl, return_inverse=True)
            chunk_ids.append(chd.astype(I64) + chunk_base)
            block_ids.append(bld.astype(I64) + block_base)
            chunk_base += int(chd.max()) + 1 if len(chd) else 0
            block_base += int(bld.max()) + 1 if len(bld) else 0
            base += int(lens.sum())
        self.task_lo.append(base)
        self.n_units = base
        self.key = np.concatenate(keys) if keys else np.zeros(0, I64)
        self.unit_chunk = np.concatenate(chunk_ids) if chunk_ids else np.zeros(0, I64)
        ublock = np.concatenate(block_ids) if block_ids else np.zeros(0, I64)
        self.n_chunks = chunk_base
        if len(self.unit_chunk) > 1 and (np.diff(self.unit_chunk) < 0).any():
            raise AssertionError("units of one chunk must be consecutive ids (unit_space.chunk_starts)")
        self.chunk_weight = np.concatenate(weights) if weights else np.zeros(0, I64)
        # consecutive ids per chunk / block
        self.chunk_lo = np.searchsorted(self.unit_chunk, np.arange(chunk_base), side="left").astype(I64)
        self.chunk_hi = np.searchsorted(self.unit_chunk, np.arange(chunk_base), side="right").astype(I64)
        blo = np.searchsorted(ublock, np.arange(block_base), side="left").astype(I64)
        bhi = np.searchsorted(ublock, np.arange(block_base), side="right").astype(I64)
        self.block_lo = blo[ublock] if len(ublock) else np.zeros(0, I64)
        self.block_hi = bhi[ublock] if len(ublock) else np.zeros(0, I64)

    def dense_intervals(self, task: int, s: np.ndarray, e: np.ndarray):
        """Unit intervals -> dense [d0, d1) and whether each lies inside the universe."""
        us, ue, off = self.iv[task]
        s, e = np.asarray(s, I64), np.asarray(e, I64)
        if len(us) == 0:
            z = np.zeros(len(s), I64)
            return z, z.copy(), np.zeros(len(s), bool)
        k = np.searchsorted(us, s, side="right") - 1
        kk = np.maximum(k, 0)
        inside = (k >= 0) & (e <= ue[kk]) & (e > s)
        d0 = np.where(inside, off[kk] + s - us[kk], 0)
        return d0, np.where(inside, d0 + e - s, 0), inside

    def dense(self, task: int, launch: np.ndarray, s: np.ndarray, e: np.ndarray,
              n_launches: int) -> tuple[np.ndarray, np.ndarray]:
        """Unit intervals of one task's launches -> CSR (indptr per launch, dense ids).

        Units outside the universe are dropped (only predictions can have them)."""
        us, ue, off = self.iv[task]
        s, e, launch = np.asarray(s, I64), np.asarray(e, I64), np.asarray(launch, I64)
        # intervals inside one universe interval (all but some predictions'):
        # map the interval, not every unit
        d0, d1, inside = self.dense_intervals(task, s, e)
        counts = d1 - d0
        rest = np.flatnonzero(~inside & (e > s))
        if not len(rest):
            # every interval inside the universe: the ids written once, in the universe's width (`unit_width`)
            # them in, and the launches' sizes counted per interval (F._ranges and a launch id per
            # use were three int64 arrays of every use beside the result)
            units = ranges(d0, counts, unit_width(self.n_units))
            nz = counts > 0
            indptr = np.zeros(n_launches + 1, I64)
            np.cumsum(np.bincount(launch[nz], weights=counts[nz], minlength=n_launches).astype(I64), out=indptr[1:])
            return indptr, units
        units = F._ranges(d0, counts)
        lid = np.repeat(launch, counts)
        if len(rest):
            ru = F.expand_intervals(s[rest], e[rest])
            rl = np.repeat(launch[rest], (e - s)[rest])
            k = np.searchsorted(us, ru, side="right") - 1 if len(us) else np.full(len(ru), -1, I64)
            kk = np.maximum(k, 0)
            ok = (k >= 0) & (ru < ue[kk]) if len(us) else np.zeros(len(ru), bool)
            units = np.concatenate([units, (off[kk] + ru - us[kk])[ok]])
            lid = np.concatenate([lid, rl[ok]])
            o = np.lexsort((units, lid))   # back to launch order, ascending units
            units, lid = units[o], lid[o]
        indptr = np.zeros(n_launches + 1, I64)
        np.cumsum(np.bincount(lid, minlength=n_launches), out=indptr[1:])
        return indptr, units.astype(unit_width(self.n_units))

    def address_ranges(self, task: int, dense_units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Dense unit ids -> (byte address, unit key) for plans."""
        us, ue, off = self.iv[task]
        k = np.searchsorted(off, dense_units, side="right") - 1
        key = us[k] + dense_units - off[k]
        return key * self.gran, key


@dataclass
class Needs:
    """Per-step units in CSR form (ascending within a step). `after`, where some units are known
    only from index values: per occurrence, the step after whose end that use's values exist
    (-1: known from the arguments, or before the first step); no plan may bring the unit in for
    that use earlier (plan/belady.py). It is given per use and held sparse (`set_gates`): the uses
    that wait (`gate_use`, ascending positions) and their steps (`gate_step`). Few uses wait (a few
    hundred in millions in docs/performance.md's case), and a per-use array of them was held
    through every plan of the predicted needs (4 bytes a use); `after` makes the per-use array again
    where one is read. `value_bytes`:
    per step, the bytes of index values its launch reads (what a runtime copies from the GPU before
    it can prefetch those units)."""

    ptr: np.ndarray
    unit: np.ndarray
    after: InitVar[np.ndarray | None] = None
    value_bytes: np.ndarray | None = None
    pages: np.ndarray | None = None   # per occurrence, the pages the launch touches in the unit (faults it makes)
    # makes `pages` where they are left to be made when first read (page_counts): a planner's
    # alternative needs them only after its plans are made
    pages_later: object = field(default=None, repr=False, compare=False)
    gate_use: np.ndarray = field(init=False, repr=False, compare=False)
    gate_step: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self, after: np.ndarray | None) -> None:
        # per-use arrays as int32 where they fit (`narrow`); the per-step ones (ptr, value_bytes) as given
        self.unit, self.pages = narrow(self.unit), narrow_small(self.pages)
        after = np.zeros(0, I64) if after is None else np.asarray(after)
        use = np.flatnonzero(after >= 0)
        self.set_gates(use, after[use])

    def set_gates(self, use: np.ndarray, step: np.ndarray) -> None:
        """The uses that wait (ascending positions) and the steps they wait for (each >= 0), held as
        int64 positions and steps in `narrow`'s width."""
        self.gate_use = np.asarray(use).astype(I64, copy=False)
        self.gate_step = narrow(np.asarray(step).astype(I64, copy=False))

    def dense_after(self) -> np.ndarray | None:
        """`after` per use (-1: none; steps in int32 where they fit, as `narrow` keeps them), or None
        where no use waits: made from the sparse form, for a reader of every use (plan/belady.py)."""
        if not self.gated:
            return None
        out = np.full(len(self.unit), -1, self.gate_step.dtype if self.gate_step.dtype == I64 else ID)
        out[self.gate_use] = self.gate_step
        return out

    def page_counts(self) -> np.ndarray | None:
        """`pages`, made now where they were left to be made when read (`pages_later`); None where
        the needs do not say."""
        if self.pages is None and self.pages_later is not None:
            pages, self.pages_later = self.pages_later(), None
            if len(pages) == len(self.unit):
                self.pages = narrow_small(pages)
        return self.pages

    def of(self, i: int) -> np.ndarray:
        return self.unit[self.ptr[i]:self.ptr[i + 1]]

    def sizes(self) -> np.ndarray:
        return np.diff(self.ptr)

    @property
    def gated(self) -> bool:
        return len(self.gate_use) > 0


# `after`, read as an attribute: the per-use array (dense_after). Set once the dataclass has taken the
# field's default for its __init__ (a property in the class body would be taken as that default).
Needs.after = property(Needs.dense_after)   # type: ignore[assignment,method-assign]


def attach_after(derived: Needs, base: Needs, block_lo: np.ndarray) -> Needs:
    """`derived` (needs made from `base`: widened to blocks, allocations added, narrowed back) with
    `after` carried over: a use `base` has keeps its own; a unit added beside it (the rest of a
    block) waits for the earliest of the uses `base` has in that step's block (-1 when one of them
    is known from the arguments, or when `base` has none there: an allocation the arguments name).
    One compiled pass over the steps that hold a use that waits (`_after_of_steps`; in any other step
    every derived use is -1), each step's uses matched among themselves: memory for the uses that wait
    only (the keys, sorts and matches of all uses at once were ten times a per-use result's memory,
    the peak of a planned replay of 10^6 launches)."""
    if not base.gated and base.value_bytes is None:
        return derived
    out = Needs(derived.ptr, derived.unit, None, base.value_bytes)
    if base.gated:
        out.set_gates(*_after_of_steps(base.ptr, base.unit, base.gate_use, base.gate_step, derived.ptr,
                                       derived.unit, block_lo))
    return out


ATTACH_USES = 1 << 19   # uses per piece of step_pieces' callers (gated_needs_from: its temporaries per use)


def step_pieces(*ptrs: np.ndarray, uses: int | None = None):
    """(s0, s1) ranges of whole steps, in order, covering every step of the CSR row pointers `ptrs`
    (one step count): each piece at least one step, and as many more as keep every `ptrs`' uses
    under `uses` (ATTACH_USES). Per-use work made piece by piece holds one piece's temporaries."""
    uses = ATTACH_USES if uses is None else uses
    n = len(ptrs[0]) - 1
    s0 = 0
    while s0 < n:
        s1 = min(int(np.searchsorted(p, p[s0] + uses, side="right")) - 1 for p in ptrs)
        s1 = min(max(s0 + 1, s1), n)
        yield s0, s1
        s0 = s1


@njit(cache=True, nogil=True)
def _after_of_steps(bptr, bunit, gate_use, gate_step, dptr, dunit, block_lo):
    """attach_after's waiting uses of `derived` (CSR dptr/dunit): (positions, steps), ascending. Per
    step holding one of base's waiting uses (`gate_use` ascending, `gate_step` theirs; base's other
    uses wait for nothing, -1): base's uses ordered by unit (stable: of a unit listed twice, the
    first), then each derived use found there (its own `after`) or else in base's blocks of that step
    (the least `after` among them; -1 where base has none in that block)."""
    n = len(bptr) - 1
    most = 0
    for s in range(n):
        if bptr[s + 1] - bptr[s] > most:
            most = bptr[s + 1] - bptr[s]
    raw = np.empty(most, np.int64)     # the step's `after`, per base use in base's order
    su = np.empty(most, np.int64)      # the step's base units, ascending
    sa = np.empty(most, np.int64)      # and their `after`
    blk = np.empty(most, np.int64)     # its blocks, ascending
    low = np.empty(most, np.int64)     # the least `after` in each
    out_u = np.empty(16, np.int64)
    out_s = np.empty(16, np.int64)
    n_out = 0
    g = 0
    s = 0
    while g < len(gate_use):
        while bptr[s + 1] <= gate_use[g]:
            s += 1
        lo = bptr[s]
        m = bptr[s + 1] - lo
        for k in range(m):
            raw[k] = -1
        while g < len(gate_use) and gate_use[g] < lo + m:
            raw[gate_use[g] - lo] = gate_step[g]
            g += 1
        asc = True
        for k in range(lo + 1, lo + m):
            if bunit[k] < bunit[k - 1]:
                asc = False
                break
        if asc:
            for k in range(m):
                su[k] = bunit[lo + k]
                sa[k] = raw[k]
        else:
            o = np.argsort(bunit[lo:lo + m], kind="mergesort")
            for k in range(m):
                su[k] = bunit[lo + o[k]]
                sa[k] = raw[o[k]]
        nb = 0
        for k in range(m):
            b = block_lo[su[k]]
            if nb == 0 or blk[nb - 1] != b:
                blk[nb] = b
                low[nb] = sa[k]
                nb += 1
            elif sa[k] < low[nb - 1]:
                low[nb - 1] = sa[k]
        for k in range(1, nb):
            if blk[k] <= blk[k - 1]:   # blocks not ascending with the units: order them, one entry each
                nb = _merge_blocks(blk, low, nb)
                break
        for k in range(dptr[s], dptr[s + 1]):
            x = dunit[k]
            a = _first_at_least(su, m, x)
            if a < m and su[a] == x:
                v = sa[a]
            else:
                b = block_lo[x]
                a = _first_at_least(blk, nb, b)
                v = low[a] if a < nb and blk[a] == b else -1
            if v >= 0:
                if n_out == len(out_u):
                    out_u = grow(out_u)
                    out_s = grow(out_s)
                out_u[n_out] = k
                out_s[n_out] = v
                n_out += 1
        s += 1
    return out_u[:n_out].copy(), out_s[:n_out].copy()


@njit(cache=True)
def grow(a):
    """`a` in an array twice its length (the rest unset): a compiled list's room when it is full."""
    b = np.empty(2 * len(a), a.dtype)
    b[:len(a)] = a
    return b


@njit(cache=True)
def _merge_blocks(blk, low, nb):
    """blk[:nb] sorted, equal blocks made one holding the least of their `low`; returns how many."""
    o = np.argsort(blk[:nb], kind="mergesort")
    b = blk[:nb][o]
    v = low[:nb][o]
    j = 0
    for k in range(nb):
        if j > 0 and blk[j - 1] == b[k]:
            if v[k] < low[j - 1]:
                low[j - 1] = v[k]
        else:
            blk[j] = b[k]
            low[j] = v[k]
            j += 1
    return j


@njit(cache=True, inline="always")
def _first_at_least(a, n, x):
    """The first place in ascending a[:n] holding x or more (n where none)."""
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


_NONE = object()   # Workload.kept: no value under that key


def ahead(key) -> tuple:
    """The `extra` key of a Future making the value Workload.kept keeps under `key` (made ahead)."""
    return ("ahead", key)


@dataclass
class Workload:
    tasks: list[Task]
    gran: int
    eviction_unit: int
    universe: Universe
    step_task: np.ndarray          # per step: task index
    step_launch: np.ndarray        # per step: launch id in that task
    truth: Needs                   # what each step touches
    footprint_bytes: int           # union of all launches' footprints (pages), all tasks
    extra: dict = field(default_factory=dict)
    managed_bytes: int = 0         # managed memory allocated (peak live, summed over tasks; managed_bytes())
    host: list | None = None       # per task, the placement.HostRanges left on the host (None: none)

    def oversub_basis(self, of: str) -> int:
        """What `--oversub R` divides by R: the managed bytes allocated ("managed", the literature's
        oversubscription; the touched footprint where a trace records no managed allocation) or the
        union of the launches' footprints ("touched")."""
        if of == "touched" or self.managed_bytes <= 0:
            return self.footprint_bytes
        return self.managed_bytes

    @property
    def n_steps(self) -> int:
        return len(self.step_task)

    def kept(self, key, make):
        """What `extra` keeps under `key`, made by make() and kept where it holds none. One read of
        `extra`, so a value the sweep lets go (sim/sweep.py drops what a policy's runs made, maybe
        while another policy's run is going: replay/cells.py) is made again, never missed. A value
        being made ahead (a Future under `ahead(key)`, started before the workload was built: the
        replay's blind predictions, plan/alternatives.py) is waited for instead, once."""
        v = self.extra.get(key, _NONE)
        if v is _NONE:
            pending = self.extra.pop(ahead(key), None)
            v = self.extra[key] = make() if pending is None else pending.result()
        return v

    def step_of(self, task: int, launch: np.ndarray | int):
        """Global step index of a task's launch."""
        return self._inv[task][launch]

    def __post_init__(self) -> None:
        self._inv = []
        for t, task in enumerate(self.tasks):
            inv = np.full(task.trace.n_launches, -1, I64)
            sel = np.flatnonzero(self.step_task == t)
            inv[self.step_launch[sel]] = sel
            self._inv.append(inv)

    def needs_from(self, per_task_fp: list[F.Footprints | None], with_pages: bool = True) -> Needs:
        """Footprints per task (None: empty) -> step needs in the global order; with `with_pages`, each
        use's page count (Needs.pages) too; with "later", made when first read (Needs.page_counts)."""
        csrs = []
        per_task_fp = [self.on_device(t, fp) for t, fp in enumerate(per_task_fp)]
        for t, fp in enumerate(per_task_fp):
            n = self.tasks[t].trace.n_launches
            if fp is None:
                csrs.append((np.zeros(n + 1, I64), np.zeros(0, I64)))
                continue
            l, s, e = unit_intervals(fp, self.gran)
            csrs.append(self.universe.dense(t, l, s, e, n))
        needs = gather_steps(csrs, self.step_task, self.step_launch)
        del csrs
        if with_pages == "later":
            needs.pages_later = lambda: self._pages_of(per_task_fp)
        elif with_pages:
            pages = self._pages_of(per_task_fp)
            if len(pages) == len(needs.unit):
                needs.pages = narrow_small(pages)
        return needs

    def _pages_of(self, per_task_fp: list[F.Footprints | None]) -> np.ndarray:
        """Per use of needs_from's needs (footprints already on the device), the pages the footprint
        touches in the unit: a missing unit's fault-buffer entries (a planner's trial run on
        predictions charges them as a run on the truth does)."""
        return gather_steps([unit_page_counts(fp, self.gran) if fp is not None else
                             (np.zeros(self.tasks[t].trace.n_launches + 1, I64), np.zeros(0, I64))
                             for t, fp in enumerate(per_task_fp)], self.step_task, self.step_launch).unit

    def on_device(self, task: int, fp: F.Footprints | None) -> F.Footprints | None:
        """`fp` without the task's host-placed ranges (placement.py): what GPU memory holds of it."""
        if fp is None or not self.host or not len(self.host[task]):
            return fp
        return split_footprints(fp, *self.host[task].pages(fp.page_size))[0]

    def gated_needs_from(self, per_task_fp: list[F.Footprints], per_task_gates: list) -> Needs:
        """needs_from with `after` (see Needs): `per_task_gates[t]` the task's predicted pieces that
        index values chose (predict.predictor.Gates: launch, pages, the launch after which their
        values exist, `plain` the footprint of the other pieces) and their launches' value bytes,
        or None. A use is gated only where no other piece of the same launch names the unit (then
        the arguments already tell)."""
        needs = self.needs_from(per_task_fp)
        if not any(g is not None and len(g.launch) for g in per_task_gates):
            return needs
        m = I64(self.universe.n_units + 1)
        keys, aft = [], []
        vb = np.zeros(self.n_steps, I64)
        for t, (fp, g) in enumerate(zip(per_task_fp, per_task_gates)):
            if g is None or not len(g.launch):
                continue
            # every gated (launch, unit) with its producer
            ps = fp.page_size
            if self.gran >= ps:
                r = self.gran // ps
                us, ue = g.start // r, -((-g.end) // r)
            else:
                r = ps // self.gran
                us, ue = g.start * r, g.end * r
            ptr, units = self.universe.dense(t, np.arange(len(g.launch), dtype=I64), us, ue, len(g.launch))
            piece = np.repeat(np.arange(len(g.launch), dtype=I64), np.diff(ptr))
            step = self.step_of(t, g.launch[piece])
            prod = g.after[piece]
            pstep = np.where(prod >= 0, self.step_of(t, np.maximum(prod, 0)), -1)
            keys.append(step * m + units)
            aft.append(pstep)
            if g.value_launch is not None and len(g.value_launch):
                np.add.at(vb, self.step_of(t, g.value_launch), g.value_bytes)
        key = np.concatenate(keys)
        after = np.concatenate(aft)
        uk, inv = np.unique(key, return_inverse=True)
        low = np.full(len(uk), np.iinfo(I64).max, I64)
        np.minimum.at(low, inv.reshape(-1), after)
        del keys, aft, key, after, inv
        # the ungated uses: needs from the pieces without a gate (their units only)
        plain = self.needs_from([g.plain if g is not None and len(g.launch) else fp
                                 for fp, g in zip(per_task_fp, per_task_gates)], with_pages=False)
        # per use, the step its values wait for: made a few steps at a time (`step_pieces`), as
        # attach_after is (the keys and matches of every use at once: ten arrays of every use)
        uses, steps = [], []   # the uses that wait, and their steps (Needs holds them sparse)
        for s0, s1 in step_pieces(needs.ptr, plain.ptr):
            a, b = int(needs.ptr[s0]), int(needs.ptr[s1])
            nstep = np.repeat(np.arange(s0, s1, dtype=I64), np.diff(needs.ptr[s0:s1 + 1]))
            nk = nstep * m + needs.unit[a:b]
            del nstep
            pa_, pb = int(plain.ptr[s0]), int(plain.ptr[s1])
            pstep_ = np.repeat(np.arange(s0, s1, dtype=I64), np.diff(plain.ptr[s0:s1 + 1]))
            pk = np.sort(pstep_ * m + plain.unit[pa_:pb])
            del pstep_
            j = np.minimum(np.searchsorted(uk, nk), max(len(uk) - 1, 0))
            gated = (uk[j] == nk) if len(uk) else np.zeros(len(nk), bool)
            if len(pk):
                q = np.minimum(np.searchsorted(pk, nk), len(pk) - 1)
                gated &= pk[q] != nk
            at = np.flatnonzero(gated)
            uses.append(at + a)
            steps.append(low[j[at]])
        out = Needs(needs.ptr, needs.unit, None, vb)
        out.pages = needs.pages
        use = np.concatenate(uses) if uses else np.zeros(0, I64)
        step = np.concatenate(steps) if steps else np.zeros(0, I64)
        wait = step >= 0
        out.set_gates(use[wait], step[wait])
        return out

    def chunk_needs_from(self, per_task_fp: list[F.Footprints]) -> Needs:
        """As needs_from, in eviction-chunk ids (for plans that move whole chunks)."""
        u = self.universe
        csrs = []
        for t, fp in enumerate(per_task_fp):
            n = self.tasks[t].trace.n_launches
            l, s, e = unit_intervals(self.on_device(t, fp), self.gran)
            d0, d1, ok = u.dense_intervals(t, s, e)
            c0 = u.unit_chunk[d0[ok]]
            c1 = u.unit_chunk[d1[ok] - 1] + 1
            l, c0, c1 = F.merge_intervals(l[ok], c0, c1, n)
            # the ids written once, in the chunks' width (`unit_width`), the launches' sizes counted
            # per interval (as Universe.dense: an int64 expansion and a launch id per use were three
            # int64 arrays of every chunk use, an alloc plan's peak over 10^6 launches)
            units = ranges(c0, c1 - c0, unit_width(u.n_chunks))
            indptr = np.zeros(n + 1, I64)
            np.cumsum(np.bincount(l, weights=c1 - c0, minlength=n).astype(I64), out=indptr[1:])
            csrs.append((indptr, units))
        return gather_steps(csrs, self.step_task, self.step_launch)


def gather_steps(csrs, step_task, step_launch) -> Needs:
    """Per-task CSR -> one CSR in step order (vectorized). One task whose launches are the steps, in
    order (a replay of one trace), is its CSR as it is: nothing is copied."""
    if len(csrs) == 1 and len(step_launch) == len(csrs[0][0]) - 1 and \
            np.array_equal(step_launch, np.arange(len(step_launch))):
        return Needs(np.asarray(csrs[0][0], I64), csrs[0][1])
    bases = np.concatenate([[0], np.cumsum([len(c[0]) - 1 for c in csrs])]).astype(I64)
    ptr_all = []
    unit_all = []
    ubase = 0
    for (p, u) in csrs:
        ptr_all.append(p[:-1] + ubase)
        unit_all.append(u)
        ubase += len(u)
    starts = np.concatenate(ptr_all) if ptr_all else np.zeros(0, I64)
    sizes = np.concatenate([np.diff(p) for p, _ in csrs]) if csrs else np.zeros(0, I64)
    # one task's units as they are (a concatenation copies every use)
    units = unit_all[0] if len(unit_all) == 1 else np.concatenate(unit_all) if unit_all else np.zeros(0, I64)
    g = bases[step_task] + step_launch
    st, sz = starts[g], sizes[g]
    ptr = np.zeros(len(g) + 1, I64)
    np.cumsum(sz, out=ptr[1:])
    # each step's run of units copied in step order (an index of every use, made by F._ranges, was
    # three int64 arrays of every use beside the result)
    out = np.empty(int(ptr[-1]), units.dtype)
    _gather_into(st, sz, units, out)
    return Needs(ptr, out)


def ranges(starts: np.ndarray, counts: np.ndarray, dtype=I64) -> np.ndarray:
    """F._ranges (arange(s, s + c) for each pair, concatenated) in `dtype`, with no array but the
    result (F._ranges makes two more of its size)."""
    out = np.empty(int(counts.sum()), dtype)
    _ranges_into(np.asarray(starts, I64), np.asarray(counts, I64), out)
    return out


@njit(cache=True)
def _ranges_into(starts, counts, out):
    j = 0
    for i in range(len(starts)):
        s = starts[i]
        for c in range(counts[i]):
            out[j] = s + c
            j += 1


@njit(cache=True)
def _gather_into(starts, sizes, units, out):
    j = 0
    for i in range(len(starts)):
        s = starts[i]
        for c in range(sizes[i]):
            out[j] = units[s + c]
            j += 1


def schedule(compute: list[np.ndarray], timeslice_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Round-robin over tasks in slices of `timeslice_s` kernel time, at launch boundaries."""
    if len(compute) == 1:
        n = len(compute[0])
        return np.zeros(n, I64), np.arange(n, dtype=I64)
    sl, tk, ln = [], [], []
    for t, c in enumerate(compute):
        start = np.cumsum(c) - c
        sl.append(np.floor(start / timeslice_s).astype(I64) if timeslice_s > 0 else np.arange(len(c), dtype=I64))
        tk.append(np.full(len(c), t, I64))
        ln.append(np.arange(len(c), dtype=I64))
    sl, tk, ln = np.concatenate(sl), np.concatenate(tk), np.concatenate(ln)
    # slices of a task that already finished are skipped: rank each task's slices densely
    dense_sl = np.zeros_like(sl)
    for t in range(len(compute)):
        m = tk == t
        _, dense_sl[m] = np.unique(sl[m], return_inverse=True)
    order = np.lexsort((ln, tk, dense_sl))
    return tk[order], ln[order]


def managed_bytes(trace: T.Trace) -> int:
    """The most managed memory live at once over the trace's launches (an allocation is live from its
    first to its last launch; one never freed, to the end)."""
    A = trace.allocations
    if A.num_rows == 0:
        return 0
    m = np.asarray(pc.equal(A.column(T.KIND), "managed").fill_null(False).to_numpy(zero_copy_only=False), bool)
    if not m.any():
        return 0
    b = A.column(T.BYTES).to_numpy().astype(I64)[m]
    first = A.column(T.FIRST_LAUNCH).to_numpy(zero_copy_only=False).astype(I64)[m]
    last = pc.fill_null(A.column(T.LAST_LAUNCH), np.iinfo(I64).max - 1).to_numpy().astype(I64)[m]
    t = np.concatenate([first, last + 1])
    d = np.concatenate([b, -b])
    o = np.lexsort((d, t))           # frees before allocations at the same launch
    return int(max(np.cumsum(d[o]).max(), 0))


def allocation_bounds(trace: T.Trace) -> tuple[np.ndarray, np.ndarray]:
    """A trace's allocations as (start, end) byte addresses."""
    A = trace.allocations
    a = A.column(T.ADDRESS).to_numpy().astype(I64)
    return a, a + A.column(T.BYTES).to_numpy().astype(I64)


def build_workload(traces: list[T.Trace], *, gran: int, eviction_unit: int, profile,
                   timeslice_s: float = 0.010, need_alloc: bool = True,
                   extra_fps: list[list[F.Footprints]] | None = None, host: list | None = None,
                   steps: tuple[np.ndarray, np.ndarray] | None = None) -> Workload:
    """Tasks, schedule, universe and true needs for a list of traces. `host`: per task, the
    placement.HostRanges left on the host (their accesses charged to the launches' time, over the
    link; placement.py), or None. `steps`: (step_task, step_launch), the order of another workload of
    the same traces, kept (else scheduled from the launches' times)."""
    tasks = []
    names = task_names(traces)
    for t, (tr, name) in enumerate(zip(traces, names)):
        truth = F.footprints(tr)
        comp_extra = 0.0
        if host and len(host[t]):
            truth, link_bytes, first = host_split(truth, host[t])
            comp_extra = profile.host_time(link_bytes, first)
        tasks.append(Task(name, tr, truth, compute_times(tr, truth, profile) + comp_extra,
                          alloc_footprints(tr) if need_alloc else None, host_s=comp_extra))
    per_task = []
    for t, task in enumerate(tasks):
        ivs = []
        for fp in [task.truth, task.alloc_fp] + [x[t] for x in (extra_fps or [])]:
            if fp is None:
                continue
            _, s, e = unit_intervals(fp, gran)
            ivs.append((s, e))
        per_task.append(ivs)
    uni = Universe(per_task, gran, eviction_unit, [allocation_bounds(t.trace) for t in tasks])
    step_task, step_launch = schedule([t.compute_s for t in tasks], timeslice_s) if steps is None else steps
    fp_bytes = sum(t.truth.union_pages() * t.trace.page_size for t in tasks)
    w = Workload(tasks, gran, eviction_unit, uni, step_task, step_launch, Needs(np.zeros(1, I64), np.zeros(0, I64)),
                 int(fp_bytes), managed_bytes=sum(managed_bytes(t.trace) for t in tasks), host=host)
    w.truth = w.needs_from([t.truth for t in tasks])   # with each use's page count (Needs.pages)
    return w
