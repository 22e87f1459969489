"""One replay request: what `pagecast replay` runs, as one typed record, validated once.

`pagecast replay` parses its flags into a `ReplayRequest`; the simulator
(`sim.sweep.simulate`), the GPU runner (`gpu.backend.run_gpu_replay`) and the
GPU runner's measured child (`gpu/child.py`, which reads it as JSON from a
file) all take the same record. Building one checks everything the request
alone decides (values, choices, which policies need a model, a plan or a
trace, what each backend accepts); a bad one raises `UsageError`, one line
that names the flag (exit 2). What needs the files themselves (a trace's
footprint for `--oversub`, a model that parses) is checked where they are
read.

`to_json()` / `from_json()` carry it between processes: one JSON object with
a field per attribute (docs/replay-request.md); `from_json` refuses malformed
JSON, unknown or missing fields and values of the wrong type with one line.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from pagecast.errors import UsageError, shown

from .plan.adaptive import FALLBACKS as SIM_FALLBACKS
from .plan.sample import CHOOSE_ON
from .plan.spans import PLAN_SPANS
from .policies import POLICIES, check_policies, online_names
from .policies.base import VICTIM_ORDERS

BACKENDS = ("sim", "gpu")
OVERSUB_OF = ("managed", "touched")   # what --oversub R divides: managed bytes allocated, or the touched footprint
NO_WORKLOAD = ("the GPU backend needs the workload after '--', e.g. '-- python train.py' or"
               " '-- python -m mypackage.train --epochs 1'")
SPANS = ("auto",) + tuple(PLAN_SPANS)
PLACEMENTS = ("device", "auto")   # device: the driver's default placement; auto: planned policies also try host placement
GPU_FALLBACKS = ("allocation", "history", "none")   # the online predictor's (predict/model_io.FALLBACKS)
MAX_CAPACITY = 1 << 60   # 1 EiB: capacities stay far inside int64 arithmetic
MIN_UNIT = 512
FORMAT = "pagecast.replay-request/1"


def check_unit(flag: str, v: int) -> int:
    """A migration or eviction unit: a power of two of at least 512 bytes."""
    if v <= 0 or v & (v - 1) or v < MIN_UNIT:
        raise UsageError(f"{flag} must be a power of two of at least {MIN_UNIT} bytes, not {shown(v)}")
    return v


def check_capacity(c: int) -> int:
    if c <= 0:
        raise UsageError(f"--capacity must be > 0, not {c}")
    if c > MAX_CAPACITY:
        raise UsageError(f"--capacity {shown(c)} bytes is more than the simulator handles (1 EiB)")
    return c


def check_oversub(r: float) -> float:
    if not (r > 0) or not math.isfinite(r):
        raise UsageError(f"--oversub must be a positive number, not {r}")
    return r


def _choice(flag: str, v: str, choices) -> None:
    if v not in choices:
        raise UsageError(f"{flag} must be one of {', '.join(choices)}, not {v!r}")


# Each field's JSON kind (checked by from_json and by the constructor): str, int, float, bool, a list of
# them ("strs", "ints", "floats"), and "?" where null is allowed.
KINDS = {
    "backend": "str", "policies": "strs", "traces": "strs", "capacity": "ints?", "oversub": "floats?",
    "oversub_of": "str", "model": "str?", "plan": "str?", "feedback": "bool", "fallback": "str?",
    "repeat": "int", "costs": "str", "granularity": "int?", "eviction_unit": "int?", "eviction": "str",
    "driver_prefetch": "bool", "timeslice_ms": "float", "span": "str", "workload": "strs",
    "allow_oversubscription": "bool", "placement": "str", "lookahead": "bool",
    "discard_unfreed": "bool", "choose_on": "int", "jobs": "int?",
}


def _kind_ok(kind: str, v: Any) -> bool:
    if kind.endswith("?"):
        if v is None:
            return True
        kind = kind[:-1]
    if kind in ("strs", "ints", "floats"):
        return isinstance(v, (list, tuple)) and all(_kind_ok(kind[:-1], x) for x in v)
    if kind == "str":
        return isinstance(v, str)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    raise AssertionError(kind)


_TYPE_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
               "strs": "a list of strings", "ints": "a list of integers", "floats": "a list of numbers"}


@dataclass(frozen=True)
class ReplayRequest:
    """What one `pagecast replay` runs: policies x capacities on traces (simulator) or a workload (GPU)."""

    policies: tuple[str, ...]                  # registered policy names (pagecast.replay.policies.POLICIES)
    backend: str = "sim"                       # sim | gpu
    traces: tuple[str, ...] = ()               # trace directories (GPU: at most one, a full-mode trace of the workload)
    capacity: tuple[int, ...] | None = None    # GPU memory sizes, bytes
    oversub: tuple[float, ...] | None = None   # or: capacity = oversub basis / R (see oversub_of)
    oversub_of: str = "managed"                # managed bytes allocated (the literature's) or "touched" footprint
    model: str | None = None                   # a model file (template, runner; the GPU runner's predictions)
    plan: str | None = None                    # a plan directory from `pagecast plan`, carried out by the policies
                                               # that follow one (template; the simulator's runner); GPU: the runs'
                                               # children also get the plans made at start, oracle's too
    feedback: bool = False                     # refine the model online from the faults it missed
    fallback: str | None = None                # None: the backend's default (sim: adaptive; GPU: by feedback)
    repeat: int = 1                            # GPU runs per (policy, capacity): the median is reported
    costs: str = "msched-rtx5080"              # cost profile, a name or a JSON file (GPU: the lookahead's depth)
    granularity: int | None = None             # simulator: migration unit of a fault (None: the profile's)
    eviction_unit: int | None = None           # simulator: eviction unit (None: the profile's)
    eviction: str = "driver"                   # simulator: fault-path victim order
    driver_prefetch: bool = True               # simulator: the driver's tree prefetcher
    timeslice_ms: float = 10.0                 # simulator: round-robin slice between tasks, ms of kernel time
    span: str = "auto"                         # simulator: what template and oracle plan on
    placement: str = "device"                  # simulator: PLACEMENTS (replay/placement.py)
    choose_on: int = CHOOSE_ON                 # simulator: launches the planner compares plans on (plan/sample.py)
    jobs: int | None = None                    # simulator: runs going at once, in threads (replay/cells.py;
                                               # None: by cores and memory, sim/sweep.py's sweep_jobs)
    workload: tuple[str, ...] = ()             # GPU: the command after --
    allow_oversubscription: bool = False       # GPU: let the workload allocate more than the free memory
    lookahead: bool = True                     # GPU: planned policies prefetch the next launch early (with a trace)
    discard_unfreed: bool = False              # GPU lookahead: data never freed is discarded after its last use too

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, list):   # lists are taken (argparse, JSON) and kept as tuples: the record is frozen
                object.__setattr__(self, f.name, tuple(v))
            if not _kind_ok(KINDS[f.name], v):
                raise UsageError(f"replay request: {f.name} must be {_TYPE_WORDS[KINDS[f.name].rstrip('?')]}"
                                 f"{' or null' if KINDS[f.name].endswith('?') else ''}, not {shown(v)}")
        try:
            if self.oversub is not None:
                object.__setattr__(self, "oversub", tuple(float(r) for r in self.oversub))
            object.__setattr__(self, "timeslice_ms", float(self.timeslice_ms))
        except OverflowError:   # an integer too large for a float
            raise UsageError("--oversub and --timeslice must be numbers a float holds") from None
        self._validate()

    def _validate(self) -> None:
        _choice("--backend", self.backend, BACKENDS)
        if not self.policies:
            raise UsageError("--policy names no policy")
        gpu = self.backend == "gpu"
        if gpu:
            on = online_names()
            for p in self.policies:
                if p not in on:
                    raise UsageError(f"policy {p!r} is not available on the GPU backend (choose from {', '.join(on)})")
        check_policies(list(self.policies))
        if self.capacity is not None and self.oversub is not None:
            raise UsageError("give exactly one of --capacity SIZE,... and --oversub R,...")
        for name, vals in (("--capacity", self.capacity), ("--oversub", self.oversub)):
            if vals is not None and not vals:
                raise UsageError(f"empty list for {name}")
        for c in self.capacity or ():
            check_capacity(c)
        for r in self.oversub or ():
            check_oversub(r)
        _choice("--oversub-of", self.oversub_of, OVERSUB_OF)
        _choice("--eviction", self.eviction, VICTIM_ORDERS)
        _choice("--span", self.span, SPANS)
        _choice("--placement", self.placement, PLACEMENTS)
        if self.choose_on < 0:
            raise UsageError(f"--choose-on must be a number of launches >= 0 (0: the whole timeline), not {self.choose_on}")
        if self.jobs is not None and self.jobs < 1:
            raise UsageError(f"--jobs must be at least 1, not {self.jobs}")
        for flag, v in (("--granularity", self.granularity), ("--eviction-unit", self.eviction_unit)):
            if v is not None:
                check_unit(flag, v)
        if self.granularity is not None and self.eviction_unit is not None and self.eviction_unit < self.granularity:
            raise UsageError("--eviction-unit must not be smaller than --granularity")
        if not (self.timeslice_ms >= 0) or not math.isfinite(self.timeslice_ms):
            raise UsageError(f"--timeslice must be >= 0 ms, not {self.timeslice_ms}")
        if self.repeat < 1:
            raise UsageError(f"--repeat must be >= 1, not {shown(self.repeat)}")
        if self.fallback is not None:
            _choice("fallback", self.fallback, GPU_FALLBACKS if gpu else SIM_FALLBACKS)
        if not self.costs:
            raise UsageError("--costs names no cost profile")
        (self._validate_gpu if gpu else self._validate_sim)()

    def _validate_sim(self) -> None:
        if self.workload:
            raise UsageError("a workload command after -- needs --backend gpu")
        if not self.traces:
            raise UsageError("the simulator needs at least one TRACE")
        if self.capacity is None and self.oversub is None:
            raise UsageError("give --capacity SIZE,... or --oversub R,...")
        if self.plan is not None and len(self.traces) != 1:
            raise UsageError("--plan is for one trace; with several traces give --model and plans are made on the fly")
        for p in self.policies:
            need, follows = POLICIES[p].requires, POLICIES[p].follows_plan
            if self.model is not None or (follows and self.plan is not None):
                continue   # a policy that follows a plan carries out the --plan given, without the model
            if need == "model-or-plan" or (need == "model" and follows):
                raise UsageError(f"policy {p} needs --model MODEL or --plan PLAN")
            if need == "model":
                raise UsageError(f"policy {p} needs --model MODEL (it predicts as the GPU runner does)")
        if self.feedback and self.model is None and any(POLICIES[p].requires == "model-or-plan"
                                                        for p in self.policies):
            raise UsageError("--feedback needs --model (a fixed --plan cannot be refined)")

    def _validate_gpu(self) -> None:
        if not self.workload:
            raise UsageError(NO_WORKLOAD)
        if self.placement != "device":
            raise UsageError("--placement auto is for the simulator: the GPU runner does not place memory on the host yet")
        for p in self.policies:
            if POLICIES[p].predicts and not self.model:
                if self.plan is not None and POLICIES[p].follows_plan:
                    raise UsageError(f"policy {p} needs --model MODEL on the GPU even with --plan: where the run"
                                     " leaves the plan (the workload's launches stop matching the plan's trace, or"
                                     " what moved overflows the emulated capacity) the runner decides each launch"
                                     " from the model's predictions; give the model the plan was made from")
                raise UsageError(f"policy {p} needs --model MODEL (make one with 'pagecast fit TRACE -o MODEL')")
        if len(self.traces) > 1:
            raise UsageError("the GPU backend replays one workload: give at most one trace (a full-mode trace of it)")
        for p in self.policies:
            if POLICIES[p].needs_relocator and not self.traces:
                raise UsageError(f"policy {p} needs a full-mode trace of the same workload (pagecast collect --mode full)")
        if self.plan is not None and not self.traces:
            raise UsageError("--plan needs the TRACE it was made for (the runner matches the workload's launches to"
                             " the plan's through it): give the trace before --")
        if self.plan is not None and self.feedback and any(POLICIES[p].requires == "model-or-plan"
                                                           for p in self.policies):
            raise UsageError("--feedback refines the model online, and a fixed --plan cannot be refined: give one of them")
        if self.oversub is not None and not self.traces and self.oversub_of == "touched":
            raise UsageError("--oversub-of touched needs a trace of the workload (its launches' footprints); give one,"
                             " or size by the managed memory it allocates (--oversub-of managed, measured in a first run)")

    # ---- what the consumers read -------------------------------------------------------------

    @property
    def levels(self) -> tuple:
        """The capacities or oversubscriptions asked for, in order (GPU without either: the whole GPU)."""
        return self.capacity or self.oversub or (None,)

    def one_run(self, policy: str, capacity: int | None) -> ReplayRequest:
        """This request narrowed to one policy at one capacity (None: the whole GPU), run once; a
        --plan stays with the policies that follow one (`follows_plan`), no other run carries it out."""
        return replace(self, policies=(policy,), capacity=None if capacity is None else (int(capacity),),
                       oversub=None, repeat=1, plan=self.plan if POLICIES[policy].follows_plan else None)

    # ---- JSON ----------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"format": FORMAT, **{k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Any, where: str = "replay request") -> ReplayRequest:
        if not isinstance(d, dict):
            raise UsageError(f"{where}: not a JSON object but {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise UsageError(f"{where}: format must be {FORMAT!r}, not {shown(d.get('format'))}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names - {"format"})
        if unknown:
            raise UsageError(f"{where}: unknown field {shown(unknown[0])}")
        if "policies" not in d:
            raise UsageError(f"{where}: missing field 'policies'")
        for k, v in d.items():
            if k != "format" and not _kind_ok(KINDS[k], v):
                raise UsageError(f"{where}: {k} must be {_TYPE_WORDS[KINDS[k].rstrip('?')]}"
                                 f"{' or null' if KINDS[k].endswith('?') else ''}, not {shown(v)}")
        try:
            return cls(**{k: v for k, v in d.items() if k != "format"})
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "replay request") -> ReplayRequest:
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as e:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise UsageError(f"{where}: not JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        return cls.from_dict(d, where)
