"""What a list maintainer verifies about a submission's results, given its description: every
record audited and through the ranking's gate (``results.ranking.collect``, as ``hpcdl rank``
does), no record twice, rank counts consistent within each record, the class complete (every
workload of the suite at every rank count measured, with the stated repeats; their throughput
summarised olympic, as ``--repeat`` does), the description consistent with the records, and
the score (``results.score``). One line per problem."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from hpcdl.records import repeats
from hpcdl.records.audit import Audit
from hpcdl.records.views import Result
from hpcdl.results.ranking import collect
from hpcdl.results.score import SystemScore, record_class, score_system, scored_mode, suite_workload
from hpcdl.results.text import si
from hpcdl.submission.system import Description
from hpcdl.workloads import recipes

T = TypeVar("T")


def class_runs(
    items: Sequence[T], result: Callable[[T], Result], size_class: str, version: int
) -> dict[tuple[str, int], list[T]]:
    """(suite workload, world size) -> the items whose record ran it there, in the class and
    version given; time-to-target runs are scored apart and left out."""
    out: dict[tuple[str, int], list[T]] = {}
    for item in items:
        r = result(item)
        if record_class(r) != (size_class, version) or r.metrics.target is not None:
            continue
        name = suite_workload(r.spec, size_class)
        if name is not None:
            out.setdefault((name, r.world_size), []).append(item)
    return out


@dataclass
class Verified:
    """The results of one submission as a maintainer sees them."""

    accepted: list[Audit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    runs: dict[tuple[str, int], list[Audit]] = field(default_factory=dict)
    score: SystemScore | None = None


def verify(root: Path, results: Path, d: Description, described: str = "system.toml") -> Verified:
    """Verify the results tree ``results`` of the submission folder ``root`` against ``d`` (read
    from the file ``described``); paths in the lines are relative to ``root``."""
    out = Verified()
    accepted, rejected, _ = collect([(d.system.name, results)])
    out.accepted = accepted[d.system.name]
    out.problems += [f"{_rel(x.path, root)}: {x.reason}" for x in rejected]
    for a in out.accepted:
        out.problems += [f"{_rel(str(a.path), root)}: {p}" for p in rank_counts(a.result)]
    out.problems += consistency(d, out.accepted, root, described)
    out.problems += completeness(d, out)
    return out


def _rel(path: str, root: Path) -> str:
    return os.path.relpath(os.path.abspath(path), os.path.abspath(root))


def rank_counts(r: Result) -> list[str]:
    """A record's rank counts against each other (its per-rank rows, ranks by audit)."""
    s, hosts = r.settings, {x.host for x in r.metrics.per_rank}
    problems = []
    if s.global_batch != s.batch_per_rank * s.world_size:
        problems.append(
            f"settings.global_batch={s.global_batch} is not batch_per_rank x world_size "
            f"({s.batch_per_rank} x {s.world_size})"
        )
    if s.nodes != len(hosts) or sorted(set(s.hosts)) != sorted(hosts):
        ran = f"{len(hosts)} hosts ({', '.join(sorted(hosts))})"
        problems.append(f"settings.nodes={s.nodes}, settings.hosts={s.hosts}: its ranks ran on {ran}")
    return problems


def completeness(d: Description, out: Verified) -> list[str]:
    """The class stated, complete at every rank count measured, with the repeats stated; then
    its score (``results.score``), whose reason is the problem when there is none."""
    size_class, version, want = d.submission.size_class, d.submission.class_version, d.submission.repeats
    if size_class not in recipes.size_classes():
        return [
            f"submission.size_class={size_class!r} is invalid: allowed: {', '.join(recipes.size_classes())}"
        ]
    suite = recipes.suite(size_class)
    if suite.version != version:
        return [
            f"submission.class_version={version} is invalid: this hpcdl has class {size_class} version "
            f"{suite.version} only; check it with an hpcdl of that version"
        ]
    out.runs = class_runs(out.accepted, lambda a: a.result, size_class, version)
    counts = sorted({n for _, n in out.runs})
    if not counts:
        return [f"class {size_class} v{version}: no verified record of its suite"]
    problems = []
    for n in counts:
        for w in suite.workloads:
            found = len(out.runs.get((w, n), []))
            if found == 0:
                problems.append(f"class {size_class} v{version} at {n} ranks: workload {w} missing")
            elif found < want:
                problems.append(
                    f"class {size_class} v{version} at {n} ranks: workload {w} has {found} records, "
                    f"the description states {want} repeats"
                )
    out.score = score_system(d.system.name, out.accepted, size_class, scored_mode(out.accepted, size_class))
    if out.score.score is None and not problems:
        problems.append(f"class {size_class} v{version}: no score: {out.score.reason}")
    return problems


def consistency(d: Description, accepted: Sequence[Audit], root: Path, described: str) -> list[str]:
    """The description (the file ``described``) against every record's environment and
    settings: one line per field and value that disagrees, with how many records and the first."""
    found: dict[tuple[str, str, str], list[str]] = {}
    sw, sy = d.software, d.system
    accelerators = {a.model: a.count for a in sy.accelerators}
    for a in accepted:
        r, e = a.result, a.result.environment
        checks = [
            ("software.torch", sw.torch, e.torch),
            ("software.hpcdl", sw.hpcdl, e.hpcdl),
            ("software.python", sw.python, e.python or sw.python),  # records before 2026-11 lack it
            ("software.cuda", sw.cuda, e.cuda or ""),
        ]
        if e.cpu_count is not None:
            checks.append(("system.cpus_per_node", str(sy.cpus_per_node), str(e.cpu_count)))
        if r.settings.nodes > sy.nodes:
            checks.append(("system.nodes", str(sy.nodes), f"{r.settings.nodes} nodes used"))
        if r.settings.device == "cpu":
            checks.append(("system.processor.model", sy.processor.model, e.device_name))
        elif e.device_name not in accelerators:
            checks.append(("system.accelerators", ", ".join(accelerators) or "none", e.device_name))
        for model in set(e.gpus):
            shown = e.gpus.count(model)
            if shown > accelerators.get(model, 0):
                checks.append(
                    ("system.accelerators", f"{accelerators.get(model, 0)} x {model}", f"{shown} x {model}")
                )
        for name, stated, recorded in checks:
            if stated != recorded:
                found.setdefault((name, stated, recorded), []).append(_rel(str(a.path), root))
    return [
        f"{described}: {name}={stated!r} is invalid: {len(where)} records say {said!r} (first: {where[0]})"
        for (name, stated, said), where in found.items()
    ]


def summary_rows(v: Verified) -> list[list[str]]:
    """Per workload and rank count: records, olympic mean of samples/s and spread
    (``records.repeats``, as ``hpcdl run --repeat`` summarises)."""
    rows = []
    for (w, n), found in sorted(v.runs.items(), key=lambda x: (x[0][1], x[0][0])):
        stats = repeats.statistics([a.result.metrics.samples_per_s for a in found])
        rows.append([w, str(n), str(len(found)), f"{stats['olympic_mean']:.4g}", f"{stats['spread']:.1%}"])
    return rows


def score_line(s: SystemScore | None) -> str:
    if s is None or s.score is None:
        return "score: none" + (f" ({s.reason})" if s and s.reason else "")
    eff = (
        f", efficiency {s.efficiency:.1%} from {s.efficiency_base} ranks" if s.efficiency is not None else ""
    )
    energy = si(s.ai_ops_per_watt, "FLOP/J") if s.ai_ops_per_watt else "not measured"
    where = f"{s.world_size} ranks on {s.nodes} node" + ("s" if s.nodes != 1 else "")
    return f"score {si(s.score, 'FLOP/s')} at {where}{eff}; energy: {energy}"
