"""``hpcdl report``: read, draw and write, in that order (each step in its own module)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from hpcdl.errors import HpcdlError
from hpcdl.results.output import output_dir
from hpcdl.results.report.data import load
from hpcdl.results.report.knobs import knob_plots
from hpcdl.results.report.memory import memory_plots
from hpcdl.results.report.operators import operator_plots
from hpcdl.results.report.page import Section, page
from hpcdl.results.report.plots import (
    Predictor,
    cap_plots,
    layout_plots,
    per_rank_plots,
    phase_plots,
    power_plots,
    scaling_plots,
)
from hpcdl.results.report.sweeps import sweeps
from hpcdl.scaling.model import sweep_predictor

NO_POWER = "no power trace (no GPU energy meter)"


def write_report(
    paths: Sequence[Path | tuple[str, Path]],
    out_dir: Path,
    predicted: Predictor | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    """Write ``out_dir/index.html`` and its PNG figures from every record (``hpcdl.result``) and
    sweep summary (``hpcdl.sweep``) under ``paths`` (files or directories, searched
    recursively; a ``(NAME, path)`` pair names the system of the records under it, as
    ``hpcdl report NAME=DIR`` does, so that two machines' records stay apart); files that cannot
    be read are said and listed on the page, other hpcdl documents are skipped. ``predicted``
    maps a sweep summary to predicted samples/s by rank count (or None), drawn beside the
    measured points; by default the scaling model, calibrated on the allreduce sweeps
    (``hpcdl.comm``) under ``paths``. Returns the HTML file's path; :class:`InputError` when
    ``out_dir`` cannot be written."""
    sources = [p if isinstance(p, tuple) else ("", Path(p)) for p in paths]
    folders = [path for _, path in sources]
    data = load(sources, say)
    if not data.records and not data.summaries:
        raise HpcdlError(f"report: no hpcdl records under {', '.join(map(str, folders))}")
    found = sweeps(data.records, data.summaries)
    sections: list[Section] = [
        (
            "Scaling",
            scaling_plots(found, predicted or sweep_predictor(data.fits)),
            "no sweep: no workload measured at several rank counts",
        ),
        (
            "Along a knob",
            knob_plots(data.records, data.knob_sweeps),
            "no knob sweep (hpcdl sweep --knob NAME=V1,V2,...)",
        ),
        ("Step phases", phase_plots(data.records), "no record with phase times"),
        (
            "Operator classes",
            operator_plots(data.records),
            "no profiled record (hpcdl run --profile)",
        ),
        ("Per-rank throughput", per_rank_plots(data.records), "no multi-rank record"),
        ("Parallel layouts", layout_plots(data.records), "no record with a layout (--layout tp=N or pp=N)"),
        ("Power", power_plots(data.records), NO_POWER),
        ("Power and clock caps", cap_plots(data.records), "no cap sweep (hpcdl sweep --power-limit)"),
        ("Memory", memory_plots(data.records), "no record with a peak memory figure"),
    ]
    plotted = [p for _, ps, _ in sections for p in ps]
    counts = f"{len(data.records)} records, {len(found)} sweeps"
    say(f"report: {counts}; writing {len(plotted)} figures to {out_dir}")
    with output_dir("report.output", out_dir):
        for p in plotted:
            p.draw(out_dir / p.file)
        index = out_dir / "index.html"
        index.write_text(page(folders, data.records, found, sections, data.skipped), encoding="utf-8")
    say(f"report: wrote {index}")
    return index
