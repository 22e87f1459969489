"""Cost profiles: what the simulator charges for faults, transfers and kernels.

A profile is a small versioned JSON document (docs/cost-model.md explains every
field and where each built-in number comes from). Built-ins live in
`replay/profiles/NAME.json`; `pagecast calibrate` writes the same form with
`save_profile`. `load_profile` accepts a built-in name or a file path and raises
`ProfileError` naming the missing or malformed field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pagecast.errors import OutputExistsError, ProfileError, shown
from pagecast.jsonfile import read_json, write_json_atomic

FORMAT = "pagecast-cost-profile"
VERSION = 1
PROFILE_DIR = Path(__file__).with_name("profiles")


@dataclass(frozen=True)
class CostProfile:
    """What one GPU + link costs, as the simulator charges it.

    Times in seconds, bandwidths in bytes per second, sizes in bytes.
    """

    name: str
    description: str
    # -- demand paging (far faults) ------------------------------------------
    fault_time_s: float          # one GPU page fault, serviced, incl. moving its granularity unit
    faults_per_batch: int        # fault-buffer entries the driver fetches and services together
    batch_overhead_s: float      # fixed cost per serviced fault batch (fetch, preprocess, replay)
    # -- bulk transfers (cudaMemPrefetchAsync / planned migrations) -------------
    htod_bandwidth: float        # host to device, one copy engine
    dtoh_bandwidth: float        # device to host, one copy engine
    duplex: bool                 # eviction and population overlap on two copy engines
    pipelined_bandwidth: float   # combined htod+dtoh bytes/s when both directions run together
    transfer_latency_s: float    # fixed cost per bulk transfer (one contiguous range)
    # -- UVM driver geometry -------------------------------------------------
    granularity: int             # migration unit of a fault (the 64 KiB big page)
    eviction_unit: int           # eviction unit (the 2 MiB root chunk)
    prefetch_threshold: float    # tree prefetcher: a 2 MiB block region is prefetched past this residency
    # -- kernels ---------------------------------------------------------------
    launch_overhead_s: float     # minimum time of one kernel
    device_bandwidth: float      # HBM/GDDR bytes/s: kernel time = footprint / this (when the trace has no times)
    kernel_time: str = "auto"    # "auto" (trace times for synthetic traces, else model), "trace", "model"
    charges: bool = True         # False for `none`: count events, charge no time
    block_service_s: float = 0.0  # per 2 MiB VA block serviced in a batch (a lone fault: the three charges)
    host_bandwidth: float = 0.0  # a kernel's accesses to host-placed memory over the link (0: half htod_bandwidth)
    host_launch_s: float = 0.0   # host time of the GPU runner's launch callback (a kernel shorter than it waits)
    host_base_s: float = 0.0     # the planned runner's callback at a launch with calls, before its calls (0: host_launch_s)
    host_call_s: float = 0.0     # ... and what each call it issues there adds (the runner's planned path: Groups.calls)
    host_quiet_s: float = 0.0    # ... a callback with nothing due (the planned path's quiet launches; 0: host_launch_s)
    host_wait_s: float = 0.0     # ... one that only makes the launch's stream wait (light launches; 0: host_launch_s)
    source: dict = field(default_factory=dict)  # where each number comes from
    version: int = VERSION

    # ---- derived -----------------------------------------------------------
    def bulk_time(self, htod_bytes: float, dtoh_bytes: float, transfers: int = 0) -> float:
        """Seconds to move these bytes as planned bulk transfers."""
        if not self.charges:
            return 0.0
        h = htod_bytes / self.htod_bandwidth
        d = dtoh_bytes / self.dtoh_bandwidth
        if self.duplex:
            t = max(h, d, (htod_bytes + dtoh_bytes) / self.pipelined_bandwidth)
        else:
            t = h + d
        return t + transfers * self.transfer_latency_s

    def fault_time(self, faults: int, blocks: int | None = None, batches: int | None = None) -> float:
        """Seconds to service `faults` far faults in `blocks` VA-block services and `batches` batches
        (default: as few batches as hold them, one block per batch)."""
        if not self.charges or faults <= 0:
            return 0.0
        if batches is None:
            batches = math.ceil(faults / self.faults_per_batch)
        if blocks is None:
            blocks = batches
        return faults * self.fault_time_s + blocks * self.block_service_s + batches * self.batch_overhead_s

    @property
    def host_access_bandwidth(self) -> float:
        """Bytes/s of a kernel's accesses to host-placed memory (placement.py): `host_bandwidth`, or
        where a profile does not say, half the copy engines' host-to-device bandwidth (an assumption:
        docs/cost-model.md, "Host placement")."""
        return self.host_bandwidth if self.host_bandwidth > 0 else self.htod_bandwidth / 2

    def host_time(self, nbytes, first_touches):
        """Seconds a launch spends on host-placed memory: its `nbytes` accesses over the link, and
        its `first_touches` pages faulting once each (numpy arrays, per launch)."""
        if not self.charges:
            return np.zeros(len(nbytes))
        ft = np.asarray(first_touches, np.float64)
        batches = np.ceil(ft / self.faults_per_batch)
        return (np.asarray(nbytes, np.float64) / self.host_access_bandwidth + ft * self.fault_time_s
                + batches * (self.batch_overhead_s + self.block_service_s))

    @property
    def lone_fault_s(self) -> float:
        """What one fault alone costs: one fault, one block, one batch."""
        return self.fault_time(1)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d = {"format": FORMAT, **d}
        return d


_FIELDS = {f.name: f for f in dataclasses.fields(CostProfile)}
_REQUIRED = [f.name for f in dataclasses.fields(CostProfile)
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
_POSITIVE = ("htod_bandwidth", "dtoh_bandwidth", "pipelined_bandwidth", "device_bandwidth",
             "granularity", "eviction_unit", "faults_per_batch")
_NONNEG = ("fault_time_s", "batch_overhead_s", "transfer_latency_s", "launch_overhead_s", "block_service_s",
           "host_launch_s", "host_base_s", "host_call_s", "host_quiet_s", "host_wait_s")


_RANGES = {   # what a profile may say: far beyond any GPU and link, short of overflowing a run
    "fault_time_s": (0.0, 1.0), "batch_overhead_s": (0.0, 1.0), "block_service_s": (0.0, 1.0), "transfer_latency_s": (0.0, 1.0),
    "launch_overhead_s": (0.0, 1.0),
    "htod_bandwidth": (1e3, 1e15), "dtoh_bandwidth": (1e3, 1e15), "pipelined_bandwidth": (1e3, 1e15),
    "device_bandwidth": (1e3, 1e16),
    "granularity": (512, 1 << 30), "eviction_unit": (512, 1 << 30), "faults_per_batch": (1, 1 << 20),
}


def builtin_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def profile_from_dict(d: Any, where: str = "profile") -> CostProfile:
    """Validate a decoded JSON document and build a CostProfile (ProfileError names the field)."""
    if not isinstance(d, dict):
        raise ProfileError(f"{where}: expected a JSON object")
    if d.get("format", FORMAT) != FORMAT:
        raise ProfileError(f"{where}: format is {d.get('format')!r}; expected {FORMAT!r}")
    ver = d.get("version", None)
    if ver is None:
        raise ProfileError(f"{where}: missing field 'version'")
    if ver != VERSION:
        raise ProfileError(f"{where}: version is {ver!r}; this pagecast reads cost profile version {VERSION}")
    for k in _REQUIRED:
        if k not in d:
            raise ProfileError(f"{where}: missing field {k!r}")
    kw: dict[str, Any] = {}
    for k, f in _FIELDS.items():
        if k not in d:
            continue
        v = d[k]
        if k in ("name", "description", "kernel_time"):
            if not isinstance(v, str):
                raise ProfileError(f"{where}: field {k!r} must be a string, found {v!r}")
        elif k in ("duplex", "charges"):
            if not isinstance(v, bool):
                raise ProfileError(f"{where}: field {k!r} must be true or false, found {v!r}")
        elif k == "source":
            if not isinstance(v, dict):
                raise ProfileError(f"{where}: field 'source' must be an object")
        elif k in ("granularity", "eviction_unit", "faults_per_batch", "version"):
            if not isinstance(v, int) or isinstance(v, bool):
                raise ProfileError(f"{where}: field {k!r} must be an integer, found {v!r}")
        else:
            try:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            except OverflowError:   # an integer too large for a float
                ok = False
            if not ok:
                raise ProfileError(f"{where}: field {k!r} must be a number, found {shown(v, 40)}")
            v = float(v)
        kw[k] = v
    for k in _POSITIVE:
        if kw[k] <= 0:
            raise ProfileError(f"{where}: field {k!r} must be > 0, found {kw[k]!r}")
    for k in _NONNEG:
        if kw.get(k, 0.0) < 0:
            raise ProfileError(f"{where}: field {k!r} must be >= 0, found {kw[k]!r}")
    for k, (lo, hi) in _RANGES.items():   # beyond these, runs overflow to inf/nan or allocate petabytes
        if not lo <= kw[k] <= hi:
            raise ProfileError(f"{where}: field {k!r} must be from {lo:g} to {hi:g}, found {shown(kw[k], 40)}")
    if not 0.0 <= kw.get("host_bandwidth", 0.0) <= 1e15:
        raise ProfileError(f"{where}: field 'host_bandwidth' must be from 0 (half htod_bandwidth) to 1e+15,"
                           f" found {shown(kw['host_bandwidth'], 40)}")
    if not 0.0 <= kw["prefetch_threshold"] <= 1.0:
        raise ProfileError(f"{where}: field 'prefetch_threshold' must be in [0, 1]")
    for k in ("granularity", "eviction_unit"):
        if kw[k] & (kw[k] - 1):
            raise ProfileError(f"{where}: field {k!r} must be a power of two, found {kw[k]}")
    if kw["eviction_unit"] < kw["granularity"]:
        raise ProfileError(f"{where}: eviction_unit ({kw['eviction_unit']}) is smaller than granularity"
                           f" ({kw['granularity']})")
    if kw.get("kernel_time", "auto") not in ("auto", "trace", "model"):
        raise ProfileError(f"{where}: field 'kernel_time' must be auto, trace or model")
    return CostProfile(**kw)


def load_profile(name_or_path: str | Path | CostProfile) -> CostProfile:
    """A built-in profile by name (`msched-rtx5080`, `pcie4`, `pcie3`, `none`) or a JSON file."""
    if isinstance(name_or_path, CostProfile):
        return name_or_path
    s = str(name_or_path)
    p = Path(s)
    if not p.exists() and "/" not in s and not s.endswith(".json"):
        builtin = PROFILE_DIR / f"{s}.json"
        if not builtin.exists():
            raise ProfileError(f"no cost profile named {s!r} and no such file;"
                               f" built-in profiles: {', '.join(builtin_names())}")
        p = builtin
    if not p.exists():
        raise ProfileError(f"{p}: no such cost profile file")
    d = read_json(p, ProfileError)
    return profile_from_dict(d, str(p))


def save_profile(profile: CostProfile, path: str | Path, force: bool = False) -> Path:
    """Write a profile as JSON (refuses to overwrite without force)."""

    path = Path(path)
    if path.exists() and not force:
        raise OutputExistsError(path)
    profile_from_dict(profile.to_dict(), str(path))  # never write one we could not read back
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True)
    write_json_atomic(path, profile.to_dict())
    return path


def replace(profile: CostProfile, **changes: Any) -> CostProfile:
    """A copy with some fields changed (e.g. --granularity), re-validated."""
    d = profile.to_dict()
    d.update(changes)
    return profile_from_dict(d, f"profile {profile.name}")
