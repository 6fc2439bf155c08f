"""A saved spec read back: what ``hpcdl run --spec FILE`` and a job file's ``spec = "FILE"`` run.

A spec file is a table of knobs with ``family`` (the TOML ``hpcdl fit -o`` writes, or the same
as JSON), or a document that holds one under ``spec``: a fit record (``hpcdl.fit``) or a result
record (``hpcdl.result``). It is data: read by the bounded reader, never run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcdl import reader
from hpcdl.errors import InputError, SpecError
from hpcdl.workloads.registry import FAMILIES, spec_from_dict
from hpcdl.workloads.spec import Spec

HOLDERS = ("hpcdl.fit", "hpcdl.result")
"""documents that hold a spec under ``spec``"""
WHAT = "a spec file: a table with family= and its knobs (hpcdl fit -o), or a fit or result record"


def spec_table(path: Path, field: str) -> dict[str, Any]:
    """The knobs a spec file holds, ``family`` among them; one line naming ``field`` when the
    file is not a spec file."""
    doc = reader.document(path, field, "toml" if path.suffix == ".toml" else "json")
    if doc.get("schema") in HOLDERS:
        doc = doc.get("spec")  # type: ignore[assignment]
    if not isinstance(doc, dict) or "family" not in doc:
        raise InputError(field, str(path), f"not {WHAT}")
    return doc


def spec_file(path: Path, field: str, overrides: dict[str, Any] | None = None) -> Spec:
    """The spec a file holds, with knobs overridden; every error is one line naming ``field``
    (a knob's: ``FIELD.KNOB``)."""
    table = spec_table(path, field)
    if table["family"] not in FAMILIES:
        raise InputError(f"{field}.family", table["family"], "allowed: " + ", ".join(FAMILIES))
    try:
        return spec_from_dict({**table, **(overrides or {})})
    except SpecError as e:  # attention.heads -> FIELD.heads
        raise SpecError(f"{field}.{e.field.partition('.')[2] or e.field}", e.value, e.allowed) from None
