"""The policies, one module each, registered by name: what `--policy` and the GPU runner look up.

A policy is one object for both backends (base.py): the simulator calls its
planning hooks over the whole timeline; the GPU runner (and the simulator's
`runner` policy) calls its per-launch decisions through
`pagecast.replay.online.decide.LaunchDecider`. To add a policy: a module
here with a `Policy` subclass, and an entry in POLICIES.
"""

from __future__ import annotations

from typing import Callable

from pagecast.errors import UsageError

from .alloc import Alloc
from .base import Context, Given, Options, Planned, Policy
from .demand import Demand
from .oracle import Oracle
from .runner import Runner
from .swap import Swap
from .template import Template

POLICIES: dict[str, Callable[..., Policy]] = {
    "demand": Demand, "alloc": Alloc, "template": Template, "oracle": Oracle, "swap": Swap, "runner": Runner,
}

__all__ = ["POLICIES", "Alloc", "Context", "Demand", "Given", "Options", "Oracle", "Planned", "Policy", "Runner",
           "Swap", "Template", "add_relative", "check_policies", "online_names", "online_policy", "sizing_policy"]


def check_policies(names: list[str]) -> list[str]:
    for n in names:
        if n not in POLICIES:
            raise UsageError(f"unknown policy {n!r}; known policies: {', '.join(POLICIES)}")
    return names


def online_names() -> list[str]:
    """The policies that decide one launch at a time (what the GPU backend runs)."""
    return [n for n, p in POLICIES.items() if getattr(p, "online", False)]


def online_policy(policy: str | Policy) -> Policy:
    """A policy object that decides one launch at a time, by name or as given."""
    if isinstance(policy, Policy):
        return policy
    if policy not in online_names():
        raise UsageError(f"unknown policy {policy!r} for the GPU backend (choose from {', '.join(online_names())})")
    return POLICIES[policy]()


def sizing_policy() -> str:
    """The policy that moves nothing ahead (`Policy.sizes_runs`): what a run measuring the workload runs under."""
    return next(n for n, p in POLICIES.items() if p.sizes_runs)


def add_relative(rows: list[dict]) -> list[dict]:
    """Each run's time relative to the reference policies' at the same capacity (`Policy.compared_as`:
    speedup_vs_demand, fraction_of_oracle): the reference's time over the run's, null where the
    reference was not run (or the run took no time)."""
    refs = {name: cls.compared_as for name, cls in POLICIES.items() if cls.compared_as}
    by = {(r["policy"], r.get("capacity_bytes")): r for r in rows}
    for r in rows:
        for name, key in refs.items():
            ref = by.get((name, r.get("capacity_bytes")))
            r[key] = (ref["time_s"] / r["time_s"]) if ref and r["time_s"] else None
    return rows
