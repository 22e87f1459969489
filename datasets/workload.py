"""A workload model's description: name, category, description, kernels and their classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .engine import _CLASS_RANK, CLASSES, Builder, Kernel


@dataclass
class Workload:
    name: str
    category: str                      # scientific, deep-learning, llm
    description: str
    build: Callable[[Builder], None]   # issues the launches on a Builder (scale and seed are on it)
    kernels: list[Kernel] = field(default_factory=list)
    summary: str = ""                  # one short line for `datasets list`
    # kernel name -> pointer parameters whose region has the same size in every launch of this
    # workload (at any scale), although the kernel computes it from arguments: in this workload's
    # traces such a region is indistinguishable from (and correctly learned as) `fixed`.
    constant: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def kernel_param_classes(self) -> dict[str, dict[str, str]]:
        """Mangled kernel name -> {pointer parameter (or struct.field): intended template class}."""
        out = {}
        for k in self.kernels:
            cl = dict(k.classes)
            for p in self.constant.get(k.name, ()):
                if cl[p] != "linear":
                    raise ValueError(f"{self.name}: {k.name}.{p} is {cl[p]}, not a constant-size linear region")
                cl[p] = "fixed"
            out[k.mangled] = cl
        return out

    def kernel_classes(self) -> dict[str, str]:
        """Mangled kernel name -> its intended template class (the hardest of its parameters')."""
        return {m: max(cl.values(), key=_CLASS_RANK.__getitem__) if cl else "fixed"
                for m, cl in self.kernel_param_classes().items()}

    def templates(self) -> list[str]:
        """The template classes this workload exercises."""
        have = {c for cl in self.kernel_param_classes().values() for c in cl.values()}
        return [c for c in CLASSES if c in have]

    def as_dict(self) -> dict:
        return {"name": self.name, "category": self.category, "description": self.description,
                "summary": self.summary, "templates": self.templates(), "kernels": len(self.kernels)}


def workload(name: str, category: str, description: str, build: Callable[[Builder], None],
             kernels: list[Kernel], summary: str = "",
             constant: dict[str, tuple[str, ...]] | None = None) -> Workload:
    if category not in ("scientific", "deep-learning", "llm"):
        raise ValueError(f"{name}: unknown category {category!r}")
    w = Workload(name, category, description, build, list(kernels), summary or description.split(". ")[0],
                 dict(constant or {}))
    known = {k.name for k in w.kernels}
    if set(w.constant) - known:
        raise ValueError(f"{name}: constant-size entries for unknown kernels {set(w.constant) - known}")
    w.kernel_param_classes()  # validates the entries
    return w
