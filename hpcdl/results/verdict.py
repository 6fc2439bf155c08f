"""What a class run's records add up to, as ``hpcdl rank`` would score them: the class score,
whether it is rankable, and why each record that does not count does not (``hpcdl run --class``
and ``hpcdl status`` print it after their tables, so that nobody needs to open a record's JSON
to find why it failed).

The records are read, audited and gated exactly as ``hpcdl rank`` does (``results.ranking``'s
gate), then scored by ``results.score.score_system``: one rule, wherever it is applied."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpcdl.records.audit import Audit, audit, gate_problems
from hpcdl.records.loader import Unreadable, read_record
from hpcdl.results.score import SystemScore, list_key, score_system, scored_mode, suite_workload
from hpcdl.results.text import si
from hpcdl.workloads import recipes


@dataclass
class Verdict:
    """A class's records judged: the score (or why there is none) and each record left out."""

    size_class: str
    score: SystemScore
    accepted: list[Audit] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    """(record file name, why it does not count), in the order given"""

    @property
    def rankable(self) -> bool:
        """Complete (a score: every workload at one scale) and every record accepted."""
        return self.score.score is not None and not self.rejected

    @property
    def repeats(self) -> int:
        """The fewest accepted records of one workload at the scored scale (docs/rules.md, 5)."""
        if self.score.world_size is None:
            return 0
        counts = Counter(
            suite_workload(a.result.spec, self.size_class)
            for a in self.accepted
            if a.result.world_size == self.score.world_size
        )
        return min(counts[w] for w in recipes.suite(self.size_class).workloads)

    def lines(self, rejected: bool = True) -> list[str]:
        """The verdict as a person reads it: the score line, whether it is rankable, and (with
        ``rejected``) one line per record left out."""
        s, suite = self.score, recipes.suite(self.size_class)
        head = f"class {list_key(self.size_class, s.mode)} v{suite.version}"
        if s.score is None:
            state = f"{head}: no score: {s.reason}"
        else:
            where = f"{s.world_size} rank(s) on {s.nodes} node(s)"
            state = f"{head} score: {si(s.score, 'FLOP/s')} (geometric mean of AI-ops/s at {where})"
        out = [state, self.rankable_line()]
        return out + [f"not counted: {name}: {why}" for name, why in self.rejected if rejected]

    def rankable_line(self) -> str:
        complete = "complete" if self.score.score is not None else "incomplete"
        valid = "every record valid" if not self.rejected else f"{len(self.rejected)} record(s) not counted"
        verdict = "rankable" if self.rankable else "not rankable"
        return f"{verdict}: {complete}, {valid}, {self.repeats} run(s) of each workload (hpcdl rank's rules)"


def judge(paths: Sequence[Path], size_class: str, system: str = "this system") -> Verdict:
    """Read, audit and gate the records at ``paths`` as ``hpcdl rank`` does, and score them in
    ``size_class``, in the execution mode they ran in (``score.scored_mode``)."""
    accepted: list[Audit] = []
    rejected: list[tuple[str, str]] = []
    for path in paths:
        try:
            record = read_record(path)
        except Unreadable as e:
            rejected.append((path.name, str(e)))
            continue
        checked = audit(record)
        problems = list(checked.problems) or gate_problems(record.result)
        if problems:
            rejected.append((path.name, "; ".join(problems)))
        else:
            accepted.append(checked)
    mode = scored_mode(accepted, size_class)
    return Verdict(size_class, score_system(system, accepted, size_class, mode), accepted, rejected)
