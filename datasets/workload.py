"""A workload model's description: name, category, description, kernels and their classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .engine import CLASSES, Builder, Kernel


@dataclass
class Workload:
    name: str
    category: str                      # scientific, deep-learning, llm
    description: str
    build: Callable[[Builder], None]   # issues the launches on a Builder (scale and seed are on it)
    kernels: list[Kernel] = field(default_factory=list)
    summary: str = ""                  # one short line for `datasets list`

    def kernel_classes(self) -> dict[str, str]:
        """Mangled kernel name -> its intended template class (the hardest of its parameters')."""
        return {k.mangled: k.tclass for k in self.kernels}

    def kernel_param_classes(self) -> dict[str, dict[str, str]]:
        """Mangled kernel name -> {pointer parameter (or struct.field): template class}."""
        return {k.mangled: dict(k.classes) for k in self.kernels}

    def templates(self) -> list[str]:
        """The template classes this workload exercises."""
        have = {c for k in self.kernels for c in k.classes.values()}
        return [c for c in CLASSES if c in have]

    def as_dict(self) -> dict:
        return {"name": self.name, "category": self.category, "description": self.description,
                "summary": self.summary,
                "templates": self.templates(), "kernels": len(self.kernels)}



def workload(name: str, category: str, description: str, build: Callable[[Builder], None],
             kernels: list[Kernel], summary: str = "") -> Workload:
    if category not in ("scientific", "deep-learning", "llm"):
        raise ValueError(f"{name}: unknown category {category!r}")
    return Workload(name, category, description, build, list(kernels), summary or description.split(". ")[0])
