"""``hpcdl list-site``: submissions checked (``check``) and published as a static site: an index,
one list per class and class version (the latest edition of each system, ranked by its score
from ``results.score``) with CSV and JSON exports, and a page per system with its description,
its figures, the report's plots (``results.report``) and its history across editions.
Submissions that fail the check, or that share records with another system's, are listed
apart with their problems, never ranked."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpcdl.errors import HpcdlError
from hpcdl.parallel.launch import private_folder
from hpcdl.records import schema
from hpcdl.results.output import output_dir
from hpcdl.results.ranking import FIGURE_COLUMNS
from hpcdl.results.report import write_report
from hpcdl.results.text import csv_text
from hpcdl.submission import pages
from hpcdl.submission.check import Report, check
from hpcdl.submission.layout import RESULTS
from hpcdl.submission.pages import Entry


@dataclass
class Site:
    entries: list[Entry] = field(default_factory=list)
    refused: list[Report] = field(default_factory=list)

    def lists(self) -> dict[tuple[str, int], list[Entry]]:
        """(class, version) -> the latest edition of each system in it, best score first."""
        latest: dict[tuple[str, int], dict[str, Entry]] = {}
        for e in sorted(self.entries, key=lambda e: e.edition):
            latest.setdefault(e.list_key, {})[e.name] = e
        return {
            key: sorted(found.values(), key=lambda e: -(e.score.score or 0.0))
            for key, found in sorted(latest.items())
        }

    def history(self, name: str) -> list[Entry]:
        """Every edition of a system, oldest first."""
        return sorted((e for e in self.entries if e.name == name), key=lambda e: (e.edition, e.list_key))

    @property
    def systems(self) -> list[str]:
        return sorted({e.name for e in self.entries})


def build(paths: Sequence[Path], out: Path, say: Callable[[str], None] = print) -> Site:
    """Check every submission, then write the site into ``out``; :class:`InputError` when
    ``out`` cannot be written."""
    site = Site()
    with private_folder("list") as tmp:
        owners: dict[str, str] = {}  # record digest -> the system whose submission holds it
        for i, path in enumerate(paths):
            work = Path(tmp) / str(i)
            work.mkdir()
            report = check(path, work)
            report.shown = path.name  # published: the submission's name, not the maintainer's path
            say(f"list-site: {path}: {'verified' if report.ok else f'{len(report.problems)} problems'}")
            _admit(site, report, owners)
        with output_dir("list.output", out):  # only writing the site below: its errors are out's
            _reports(site, out, say)
            write_site(site, out)
    return site


def _reports(site: Site, out: Path, say: Callable[[str], None]) -> None:
    """``hpcdl report`` of each entry's results, once per distinct set of results; the reports
    an earlier build made of results no entry holds now are removed."""
    made: set[str] = set()
    current = {results_id(e.report) for e in site.entries}
    for old in out.glob("reports/*"):
        if (
            REPORT_ID.fullmatch(old.name)
            and old.name not in current
            and old.is_dir()
            and not old.is_symlink()
        ):
            shutil.rmtree(old)
    for e in site.entries:
        e.report_dir = f"reports/{results_id(e.report)}"
        if e.report_dir in made:
            continue  # the same results submitted again (another edition): one report
        assert e.report.root is not None
        try:
            write_report([e.report.root / RESULTS], out / e.report_dir, say=lambda _m: None)
        except HpcdlError as err:  # a report needs records; a verified submission has them
            say(f"list-site: no report for {e.name} {e.edition}: {err}")
        made.add(e.report_dir)


REPORT_ID = re.compile(r"[0-9a-f]{16}")
"""the name of a report's folder (``results_id``): what a rebuild may remove"""


def results_id(report: Report) -> str:
    """The results' identity: a hash of their manifest entries (names and checksums), so that
    the same results submitted twice share one report."""
    files = report.manifest.files if report.manifest else {}
    text = "\n".join(f"{n} {s.sha256}" for n, s in sorted(files.items()) if n.startswith(f"{RESULTS}/"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _admit(site: Site, report: Report, owners: dict[str, str]) -> None:
    """Add a checked submission as an entry, or to the refused ones with why."""
    d, score = report.description, report.verified.score
    if not report.ok or d is None or score is None:
        site.refused.append(report)
        return
    same = [
        e
        for e in site.entries
        if (e.name, e.edition, e.list_key)
        == (d.system.name, d.submission.edition, (d.submission.size_class, d.submission.class_version))
    ]
    if same:
        report.problems.append(f"a second submission of {d.system.name} to edition {d.submission.edition}")
    for a in report.verified.accepted:
        owner = owners.get(a.result.digest)
        if owner is not None and owner != d.system.name:
            report.problems.append(f"{a.path.name}: the same record as in {owner}'s submission")
    if report.problems:
        site.refused.append(report)
        return
    owners.update(dict.fromkeys((a.result.digest for a in report.verified.accepted), d.system.name))
    site.entries.append(Entry(report, d, score))


# --- exports ----------------------------------------------------------------------------------

COLUMNS = [
    "rank",
    "system",
    "submitter",
    "vendor",
    "availability",
    "edition",
    *FIGURE_COLUMNS,
]


def row(place: int, e: Entry) -> dict[str, Any]:
    """One system of a list, for CSV and JSON: figures as ``results.score`` computed them."""
    s, d = e.score, e.description
    return {
        "rank": place,
        "system": e.name,
        "submitter": d.submission.submitter,
        "vendor": d.system.vendor,
        "availability": d.system.availability,
        "edition": e.edition,
        "nodes": s.nodes,
        "ranks": s.world_size,
        "device": s.device,
        "score_ai_ops_per_s": s.score,
        "regulated_ai_ops_per_s": s.regulated,
        "efficiency": s.efficiency,
        "efficiency_base_ranks": s.efficiency_base,
        "ai_ops_per_watt": s.ai_ops_per_watt,
        "time_to_quality_s": s.time_to_quality_s,
        "date": s.date,
    }


def published_score(e: Entry) -> dict[str, Any]:
    """The full score as ``results.score`` gave it, each record named by its path inside the
    submission (``results/...``), not by where the checker extracted it."""
    doc = asdict(e.score)
    root = os.path.abspath(e.report.root or ".")
    for w in doc["workloads"].values():
        w["record"] = Path(os.path.relpath(os.path.abspath(w["record"]), root)).as_posix()
    return doc


def list_name(key: tuple[str, int]) -> str:
    return f"class-{key[0]}-v{key[1]}"


def write_site(site: Site, out: Path) -> None:
    """index.html, a page, CSV and JSON per list, a page per system. Pages of lists and systems
    an earlier build wrote and this one does not (a submission withdrawn) are removed, so that
    the folder never serves a ranking the submissions no longer support; other files are kept."""
    lists = site.lists()
    keep = {f"{list_name(k)}.{ext}" for k in lists for ext in ("csv", "json", "html")}
    keep |= {f"systems/{s}.html" for s in site.systems}
    written = [*out.glob("class-*-v*.csv"), *out.glob("class-*-v*.json"), *out.glob("class-*-v*.html")]
    for stale in [*written, *out.glob("systems/*.html")]:
        if stale.relative_to(out).as_posix() not in keep and stale.is_file():
            stale.unlink()
    for key, entries in lists.items():
        name = list_name(key)
        rows = [row(i, e) for i, e in enumerate(entries, 1)]
        table = csv_text(COLUMNS, [[r[c] for c in COLUMNS] for r in rows])
        (out / f"{name}.csv").write_text(table, encoding="utf-8", newline="")
        doc = {
            "schema": schema.LIST,
            "class": key[0],
            "class_version": key[1],
            "systems": rows,
            "scores": [published_score(e) for e in entries],
        }
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        (out / f"{name}.html").write_text(pages.list_page(key, entries), encoding="utf-8")
    (out / "systems").mkdir(exist_ok=True)
    for system in site.systems:
        history = site.history(system)
        page = pages.system_page(system, history, out)
        (out / "systems" / f"{system}.html").write_text(page, encoding="utf-8")
    (out / "index.html").write_text(pages.index_page(lists, site.systems, site.refused), encoding="utf-8")
