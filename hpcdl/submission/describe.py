"""``hpcdl system init``: a system description filled from what the records say (hosts,
devices, versions, node counts, class, repeats), with a placeholder (``FILL-IN: ...``) wherever
only the submitter knows the answer, so that ``hpcdl system check`` refuses it until filled."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hpcdl.records.views import Result
from hpcdl.results.score import record_class
from hpcdl.submission.system import PLACEHOLDER
from hpcdl.submission.verify import class_runs


def todo(what: str) -> str:
    return f"{PLACEHOLDER}: {what}"


def most_common(values: Sequence[Any]) -> Any:
    return Counter(values).most_common(1)[0][0]


def from_records(results: Sequence[Result]) -> dict[str, Any]:
    """A description object from records (at least one): every fact the records hold, and
    placeholders for the rest."""
    if not results:
        raise ValueError("a description is filled from at least one record")
    env = [r.environment for r in results]
    classes = [c for c in map(record_class, results) if c is not None]
    size_class, version = most_common(classes) if classes else (todo("size class, e.g. S"), 1)
    runs = class_runs(results, lambda r: r, size_class, version) if classes else {}
    counts = {key: len(found) for key, found in runs.items()}
    nodes = max(r.settings.nodes for r in results)
    accelerators: dict[str, int] = {}
    for e in env:
        for model, n in Counter(e.gpus).items():
            accelerators[model] = max(accelerators.get(model, 0), n)
    cuda = most_common([e.cuda or "" for e in env])
    system = most_common([r.system for r in results])
    return {
        "submission": {
            "submitter": todo("the organisation or person submitting"),
            "edition": _date(max(r.created for r in results)),  # the latest measurement's day
            "size_class": size_class,
            "class_version": version,
            "repeats": min(counts.values()) if counts else 1,
        },
        "system": {
            "name": re.sub(r"[^A-Za-z0-9._-]", "-", system)[:64] or todo("the system's name"),
            "vendor": todo("who built or integrated the system"),
            "nodes": nodes,
            "availability": todo("available, preview or research"),
            "processor": {
                "model": most_common([e.cpu_model for e in env]) or todo("processor model"),
                "count": todo("processor sockets per node"),
            },
            "cpus_per_node": most_common([e.cpu_count or 0 for e in env]) or todo("logical CPUs per node"),
            "memory_per_node_gib": todo("host memory of one node in GiB"),
            "interconnect": "none" if nodes == 1 else todo("the network between nodes"),
            "storage": todo("where data sets and records live"),
            "accelerators": [{"model": m, "count": n} for m, n in accelerators.items()],
        },
        "software": {
            "os": todo("operating system and release; the records say " + most_common([e.os for e in env])),
            "python": most_common([e.python for e in env]) or todo("Python version"),
            "torch": most_common([e.torch for e in env]),
            "hpcdl": most_common([e.hpcdl for e in env]),
            "mpi": todo("MPI library and version, or none")
            if any(r.world_size > 1 for r in results)
            else "none",
            "horovod": todo("Horovod version")
            if any(r.settings.backend == "horovod" for r in results)
            else "none",
            "cuda": cuda,
            "driver": todo("accelerator driver version") if accelerators else "",
        },
    }


def _date(created: str) -> str:
    """YYYY-MM-DD of a record's ``created`` (``20261123-060445``, or ISO)."""
    digits = re.sub(r"\D", "", created)[:8]
    return f"{digits[:4]}-{digits[4:6]}-{digits[6:8]}" if len(digits) == 8 else todo("YYYY-MM")
