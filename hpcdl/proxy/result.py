"""What a fit returns: the fitted spec with each figure's error (:class:`FitResult`), the
candidates it weighed (:class:`Candidate`) and how the search went in each family
(:class:`FamilySearch`). Plain data, written as the fit record (``schema: hpcdl.fit``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpcdl.proxy import objective as obj
from hpcdl.proxy.document import Profile
from hpcdl.records.schema import FIT, FIT_VERSION
from hpcdl.workloads.spec import Spec

TOLERANCE = 0.02
"""largest error of parameters and of training FLOPs that counts as reaching the profile"""

Point = tuple[int, ...]
"""a candidate's position in its family's space: one index per axis"""


@dataclass
class Candidate:
    """One spec with its errors: the cheap ones always, memory once screened, all once measured."""

    spec: Spec
    errors: dict[str, float]
    objective: float
    measured: dict[str, Any] | None = None
    """the finalist's own figures and mixes, measured as the profile's were"""

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "errors": self.errors,
            "objective": self.objective,
            "measured": self.measured,
        }


@dataclass
class FamilySearch:
    """Stage 1 in one family: its local optima, best first."""

    family: str
    evaluations: int = 0
    cut_by_budget: bool = False
    optima: list[Candidate] = field(default_factory=list)
    ends: list[Point] = field(default_factory=list)
    """the optima's points in the space"""
    memory_scale: float | None = None
    too_large: int = 0
    """candidates left out because training them would not fit in the memory there is"""


@dataclass
class FitResult:
    """The fitted spec, each figure's error, and how the search went. ``reached`` is False when
    the spec misses parameters or training FLOPs by more than ``tolerance``: it is then the
    closest spec found, not a fit (``miss`` says by how much)."""

    profile: Profile
    best: Candidate
    finalists: list[Candidate]
    families: list[FamilySearch]
    weights: obj.Weights
    seed: int
    budget_s: float
    elapsed_s: float
    verifications: list[dict[str, Any]] = field(default_factory=list)
    tolerance: float = TOLERANCE
    reached: bool = True
    memory_bytes: int | None = None
    """the memory candidates were checked against"""

    @property
    def spec(self) -> Spec:
        return self.best.spec

    @property
    def miss(self) -> str | None:
        """None when the fit reaches the tolerance, else one line saying which figures miss."""
        if self.reached:
            return None
        off = [
            f"{name} {self.best.errors[name]:+.1%}"
            for name in obj.CHEAP
            if abs(self.best.errors.get(name, 0.0)) > self.tolerance
        ]
        return f"the closest spec misses the {self.tolerance:.0%} tolerance: {', '.join(off)}"

    def to_record(self) -> dict[str, Any]:
        """The fit record (``schema: hpcdl.fit``): profile, spec, errors, search, verifications."""
        return {
            "schema": FIT,
            "schema_version": FIT_VERSION,
            "profile": self.profile.to_dict(),
            "spec": self.spec.to_dict(),
            "errors": self.best.errors,
            "tolerance": self.tolerance,
            "reached": self.reached,
            "objective": self.best.objective,
            "weights": self.weights.to_dict(),
            "seed": self.seed,
            "budget_s": self.budget_s,
            "elapsed_s": round(self.elapsed_s, 3),
            "memory_bytes": self.memory_bytes,
            "search": [
                {
                    "family": f.family,
                    "evaluations": f.evaluations,
                    "cut_by_budget": f.cut_by_budget,
                    "memory_scale": f.memory_scale,
                    "too_large": f.too_large,
                }
                for f in self.families
            ],
            "finalists": [c.to_dict() for c in self.finalists],
            "verifications": self.verifications,
        }
