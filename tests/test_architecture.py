"""docs/architecture.md's rule, checked on the source: a module imports only from its own stage or
earlier ones, and no modules import each other round in a cycle.

Every import counts, wherever it stands: at the top, under ``if TYPE_CHECKING:``, inside a
function. The stage order and the modules below every stage are read from docs/architecture.md's
lines ``Stage order:`` and ``Below every stage:``, so that the document and the check cannot
drift apart. A parent package's ``__init__.py``, which Python runs before any module of the
package, is not counted as imported (``hpcdl/__init__.py``, the Python API, imports nearly
everything; the stages' own are docstrings)."""

from __future__ import annotations

import ast
import re
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hpcdl"
TOP = ("hpcdl", "hpcdl.__main__")  # the Python API and ``python -m hpcdl``: above every stage

Edge = tuple[str, str, int]  # importer, imported, line


def documented(line_start: str, doc: Path = ROOT / "docs" / "architecture.md") -> list[str]:
    """The names in backquotes on docs/architecture.md's line that starts with ``line_start``."""
    lines = [s for s in doc.read_text().splitlines() if s.startswith(line_start)]
    assert len(lines) == 1, f"docs/architecture.md needs exactly one line starting {line_start!r}"
    return re.findall(r"`([a-z_]+)`", lines[0])


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name (a package by its own)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(root: Path) -> list[Edge]:
    """Every import of one of the package's modules by another, as (importer, imported, line)."""
    found = modules(root)
    edges = []
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importer's package, up level - 1
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # ``from pkg import mod`` imports the module mod; ``from mod import name``, mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else base for a in node.names]
            else:
                continue
            edges += [(name, t, node.lineno) for t in targets if t == PACKAGE or t.startswith(PACKAGE + ".")]
    return sorted(set(edges))  # one edge per imported module and line


def level(module: str, stages: list[str], below: list[str]) -> int:
    """0 below every stage, 1.. the stages in order, above them all the API: or a failure naming
    a module that docs/architecture.md places nowhere."""
    if module in TOP:
        return len(stages) + 1
    first = module.split(".")[1]
    if first in below:
        return 0
    assert first in stages, f"{module}: hpcdl.{first} is no stage and not below them (docs/architecture.md)"
    return stages.index(first) + 1


def upward(edges: Iterable[Edge], stages: list[str], below: list[str]) -> list[str]:
    """The imports that go from a module to a later stage than its own."""
    return [
        f"{a}:{line} imports {b}" for a, b, line in edges if level(b, stages, below) > level(a, stages, below)
    ]


def cycles(edges: Iterable[Edge]) -> list[list[str]]:
    """The import cycles: every strongly connected group of more than one module (or a module
    that imports itself), by Tarjan's algorithm, iterative."""
    graph: dict[str, set[str]] = {}
    for a, b, _ in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    return [sorted(group) for group in _components(graph) if len(group) > 1 or group[0] in graph[group[0]]]


def _components(graph: Mapping[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            nxt = next(successors, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    groups.append(group)
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return groups


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return imports(ROOT)


def test_stages_are_the_package_folders() -> None:
    """docs/architecture.md names every folder of hpcdl/ as a stage, and every module beside them
    as below the stages (or the API on top): nothing new escapes the rule unplaced."""
    stages, below = documented("Stage order:"), documented("Below every stage:")
    folders = {p.name for p in (ROOT / PACKAGE).iterdir() if (p / "__init__.py").is_file()}
    beside = {p.stem for p in (ROOT / PACKAGE).glob("*.py")} - {"__init__", "__main__"}
    assert sorted(stages) == sorted(folders)
    assert sorted(below) == sorted(beside)


def test_no_import_goes_to_a_later_stage(edges: list[Edge]) -> None:
    """A module imports only from its own stage or earlier ones (docs/architecture.md)."""
    assert upward(edges, documented("Stage order:"), documented("Below every stage:")) == []


def test_no_import_cycles(edges: list[Edge]) -> None:
    assert cycles(edges) == []


def test_the_checks_find_what_they_look_for() -> None:
    """On a made-up graph: an import from an earlier stage to a later one is found, and so are a
    cycle through TYPE_CHECKING and one within a stage; nothing else is."""
    fake = [
        ("hpcdl.workloads.moe", "hpcdl.errors", 1),
        ("hpcdl.parallel.placement", "hpcdl.workloads.moe", 2),
        ("hpcdl.workloads.moe", "hpcdl.parallel.placement", 3),
        ("hpcdl.schedulers.a", "hpcdl.schedulers.b", 4),
        ("hpcdl.schedulers.b", "hpcdl.schedulers.c", 5),
        ("hpcdl.schedulers.c", "hpcdl.schedulers.a", 6),
        ("hpcdl", "hpcdl.cli", 7),
    ]
    stages, below = ["workloads", "parallel", "schedulers", "cli"], ["errors"]
    assert upward(fake, stages, below) == ["hpcdl.workloads.moe:3 imports hpcdl.parallel.placement"]
    assert sorted(cycles(fake)) == [
        ["hpcdl.parallel.placement", "hpcdl.workloads.moe"],
        ["hpcdl.schedulers.a", "hpcdl.schedulers.b", "hpcdl.schedulers.c"],
    ]


def test_every_kind_of_import_counts(tmp_path: Path) -> None:
    """Imports under TYPE_CHECKING, inside functions, relative ones and ``from hpcdl import
    module`` are all edges of the graph."""
    pkg = tmp_path / PACKAGE
    (pkg / "measure").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "measure" / "__init__.py").write_text("")
    (pkg / "measure" / "loop.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from hpcdl import errors\n"
        "if TYPE_CHECKING:\n    from hpcdl.measure.fit import Fit\n"
        "def f():\n    import hpcdl.measure.data\n"
        "from . import peaks\n"
    )
    for name in ("fit", "data", "peaks"):
        (pkg / "measure" / f"{name}.py").write_text("")
    assert sorted(b for a, b, _ in imports(tmp_path) if a == "hpcdl.measure.loop") == [
        "hpcdl.errors",
        "hpcdl.measure.data",
        "hpcdl.measure.fit",
        "hpcdl.measure.peaks",
    ]


# --- what a family does differently is the family's own: hooks on its Spec -------------------


def family_branches(source: str, where: str = "<source>") -> list[str]:
    """The places in ``source`` that branch on a family by name: a family (``x.family``, or a
    variable ``family``) compared (``==``, ``!=``, ``in``, ``not in``) with a name in quotes, a
    literal collection of such names, or a module-level constant holding one (a tuple, list or
    set of names, or a dict keyed by them), or such a dict looked up by a family. A test against
    the registry (``family in FAMILIES``) is no branch: every family is in it."""
    tree = ast.parse(source, where)
    tables = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and node.value is not None
        and _names_family(node.value)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }

    def named(n: ast.expr) -> bool:
        return _names_family(n) or (isinstance(n, ast.Name) and n.id in tables)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_family(o) for o in operands) and any(named(o) for o in operands if not _is_family(o)):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Subscript) and _is_family(node.slice) and named(node.value):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def _is_family(node: ast.expr) -> bool:
    """``x.family``, or a variable ``family`` that holds one."""
    return (isinstance(node, ast.Attribute) and node.attr == "family") or (
        isinstance(node, ast.Name) and node.id == "family"
    )


def _names_family(node: ast.expr) -> bool:
    """A string, or a literal tuple, list, set or dict of strings (a dict: its keys)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return bool(node.elts) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
        )
    if isinstance(node, ast.Dict):
        return bool(node.keys) and all(
            isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys
        )
    return False


def test_no_module_outside_the_families_branches_on_a_family() -> None:
    """Tensor and pipeline parallelism, the scaling model and the run's execution ask a spec's
    hooks (``Spec.tp_*``, ``Spec.pp_*``, ``Spec.channels_last``), which each family implements in
    its own file: no module outside ``hpcdl/workloads/families/`` branches on a family by name
    (``family_branches``), so that a new family, a plugin among them, is still one file."""
    families = ROOT / PACKAGE / "workloads" / "families"
    found = [
        hit
        for path in sorted((ROOT / PACKAGE).rglob("*.py"))
        if families not in path.parents and path not in PER_FAMILY_BY_DESIGN
        for hit in family_branches(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == []


PER_FAMILY_BY_DESIGN = {ROOT / PACKAGE / "proxy" / "space.py"}
"""the proxy's fit spaces: which knobs a fit searches for each family it can fit, a table of
its own (docs/guide: a family without a space is not fitted); not a spec's behaviour"""


def test_the_family_check_finds_what_it_looks_for() -> None:
    """On made-up code: each way the package once branched on a family is found; a registry
    lookup, a CPU's family number and a family's name in a message are not."""
    branching = (
        'TP_FAMILIES = ("attention", "mlp")\n'
        'SPLITS = {"attention": 1, "mlp": 2}\n'
        'if spec.family == "attention": pass\n'
        "if spec.family not in TP_FAMILIES: pass\n"
        'if spec.family in ("attention", "mlp"): pass\n'
        "parts = SPLITS[spec.family]\n"
        "family = spec.family\n"
        "if family not in SPLITS: pass\n"
    )
    assert [hit.split(": ", 1)[1] for hit in family_branches(branching)] == [
        "spec.family == 'attention'",
        "spec.family not in TP_FAMILIES",
        "spec.family in ('attention', 'mlp')",
        "SPLITS[spec.family]",
        "family not in SPLITS",
    ]
    innocent = (
        'if args.family in FAMILIES: pass\nif info.family == 0x17: pass\nprint(f"{spec.family}.layers")\n'
    )
    assert family_branches(innocent) == []


# --- records are read through their typed views --------------------------------------------


RECORD_BLOCKS = {
    *("record", "raw", "metrics", "counts", "validity"),
    *("memory", "io", "fit", "communication", "energy"),
}
"""attributes that hold a result record's JSON or one of its blocks (``records.views``), whose
names no other object of the package uses for a mapping"""
OWNED_BLOCKS = {"spec", "run", "settings", "environment", "execution", "pipeline", "target"}
"""blocks whose names other objects share (a job point's ``run``, a suite's ``settings``): a
record's only on a variable named for a record or its view (``RECORD_NAMES``, ``VIEW_NAMES``)
or on ``.result`` or ``.record``"""
RECORD_NAMES = {"rec", "record", "raw", "records"}
"""variables that hold a result record's JSON, by the names the package gives them"""
VIEW_NAMES = {"r", "v", "view", "result", "base", "res"}
"""variables that hold a record's view (or a run's result) where the package reads one"""


def string_key_reads(source: str, where: str = "<source>") -> list[str]:
    """The places in ``source`` that read a result record by string key: a subscript,
    ``.get(...)`` or ``in`` test with a name in quotes on a variable named for a record
    (``RECORD_NAMES``), on an attribute named for one of its blocks (``x.record``, ``m.memory``:
    ``RECORD_BLOCKS``; ``r.run``, ``v.spec``: ``OWNED_BLOCKS``), or on such a lookup of one. A
    lookup by a variable (``suite.settings[name]``) is no record's path, and a block's dict of
    figures by data name (``m.phases_s``) no block."""
    blocks = RECORD_BLOCKS

    def quoted(n: ast.expr | None) -> bool:
        return isinstance(n, ast.Constant) and isinstance(n.value, str)

    def recordish(n: ast.expr) -> bool:
        if isinstance(n, ast.Name):
            return n.id in RECORD_NAMES
        if isinstance(n, ast.Attribute) and n.attr in OWNED_BLOCKS:
            owner = n.value
            return (isinstance(owner, ast.Name) and owner.id in RECORD_NAMES | VIEW_NAMES) or (
                isinstance(owner, ast.Attribute) and owner.attr in ("result", "record")
            )
        if isinstance(n, ast.Attribute):
            return n.attr in blocks
        if isinstance(n, ast.Subscript):
            return quoted(n.slice) and recordish(n.value)
        return isinstance(n, ast.Call) and _reads(n, recordish, quoted)

    found = []
    for node in ast.walk(ast.parse(source, where)):
        by_key = isinstance(node, ast.Subscript) and quoted(node.slice) and recordish(node.value)
        by_get = isinstance(node, ast.Call) and _reads(node, recordish, quoted)
        by_in = (
            isinstance(node, ast.Compare)
            and quoted(node.left)
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and recordish(node.comparators[0])
        )
        if by_key or by_get or by_in:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")  # type: ignore[attr-defined]
    return found


def _reads(call: ast.Call, recordish: typing.Callable[[ast.expr], bool], quoted: typing.Any) -> bool:
    """``X.get("key", ...)`` with X a record or one of its blocks."""
    f = call.func
    return (
        isinstance(f, ast.Attribute)
        and f.attr == "get"
        and bool(call.args)
        and quoted(call.args[0])
        and (recordish(f.value))
    )


def test_no_module_outside_records_reads_a_record_by_string_key() -> None:
    """A pragmatic rule (``string_key_reads``): outside ``hpcdl/records/``, no module looks a
    result record's field up by its name in quotes on a record or one of its blocks; readers go
    through the typed views (``records.views``), which the record's schema version and its
    migrations (``records.migrate``) keep whole. Other documents (sweep summaries, job states,
    fit records) are read under other names."""
    records = ROOT / PACKAGE / "records"
    found = [
        hit
        for path in sorted((ROOT / PACKAGE).rglob("*.py"))
        if records not in path.parents
        for hit in string_key_reads(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == []


def test_the_string_key_check_finds_what_it_looks_for() -> None:
    """On made-up code: each way the package once read records by key is found; a class file's
    settings, a step's phases by name and a record's spec turned into a Spec are not."""
    reading = (
        'rate = record["metrics"]["samples_per_s"]\n'
        'total = r.metrics.memory.get("estimated", {}).get("total")\n'
        'old = "suite_class" not in r.run\n'
        'cls = r.run["suite_class"]\n'
        'seed = v.spec.get("seed")\n'
        'fit = res.record.get("fit")\n'
    )
    assert sorted(hit.split(": ", 1)[1] for hit in string_key_reads(reading)) == [
        "'suite_class' not in r.run",
        "r.metrics.memory.get('estimated', {})",
        "r.metrics.memory.get('estimated', {}).get('total')",
        "r.run['suite_class']",
        "record['metrics']",
        "record['metrics']['samples_per_s']",
        "res.record.get('fit')",
        "v.spec.get('seed')",
    ]
    innocent = (
        'lr = suite.settings[name]["lr"]\n'
        'pipe = m.phases_s.get("schedule")\n'
        "seed = spec_from_dict(v.spec).seed\n"
        'given = "lr" in point.run\n'
    )
    assert string_key_reads(innocent) == []
