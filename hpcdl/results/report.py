"""HTML report of result records (``hpcdl report``): the systems measured, a table of every
record, figures (scaling, step phases, per-rank throughput, power, memory) as PNG files beside
``index.html``, and the records that no longer verify.

Every string taken from a record is escaped: a record is data written by whoever ran it.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import torch

from hpcdl.errors import HpcdlError
from hpcdl.measure.environment import hpcdl_version
from hpcdl.metrics import memory_estimate
from hpcdl.records import schema
from hpcdl.records.audit import DIGEST_MISMATCH, integrity_problems
from hpcdl.records.store import json_files, load_record, read_steps
from hpcdl.results import figures as plots
from hpcdl.results.text import HTML_STYLE, html_table, si
from hpcdl.scaling.model import relative_error, sweep_predictor
from hpcdl.workloads.registry import spec_from_dict

Predictor = Callable[[dict[str, Any]], dict[int, float] | None]
EDITED = DIGEST_MISMATCH
NO_POWER = "no power trace (no GPU energy meter)"


@dataclass(frozen=True)
class Record:
    """A loaded ``hpcdl.result`` record and why it does not verify (empty when it does)."""

    path: Path
    data: dict[str, Any]
    problems: tuple[str, ...]

    @property
    def label(self) -> str:
        """Short name for figures: without the suite's timestamp, with the rank count."""
        name = re.sub(r"^\d{8}-\d{6}-", "", str(self.data.get("name", self.path.stem)))
        n = world_size(self.data)
        if n > 1 and not re.search(r"np\d+$", name):
            name += f" (np{n})"
        return name + (" (edited)" if self.problems else "")


@dataclass(frozen=True)
class Sweep:
    """Samples/s of one workload at several rank counts, in the ``hpcdl.scaling.sweep`` summary's shape
    (also for sweeps put together from records)."""

    label: str
    summary: dict[str, Any]


@dataclass(frozen=True)
class Plot:
    """A figure to draw: its file name, caption, HTML shown under it, and the drawing."""

    file: str
    caption: str
    draw: Callable[[Path], Path]
    extra: str = ""


def get(doc: Mapping[str, Any], *keys: str) -> Any:
    """``doc[k1][k2]...`` or None where a key is missing (older or hand-made records)."""
    value: Any = doc
    for k in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(k)
    return value


def system(rec: Mapping[str, Any]) -> str:
    """The machine a record ran on: its Slurm cluster, else rank 0's host."""
    return str(get(rec, "environment", "slurm", "cluster") or get(rec, "environment", "host") or "?")


def world_size(rec: Mapping[str, Any]) -> int:
    return int(get(rec, "settings", "world_size") or 1)


# --- loading -----------------------------------------------------------------------------------


def problems(path: Path, rec: Mapping[str, Any]) -> tuple[str, ...]:
    """Why a record does not verify (the checks ``hpcdl rank`` applies before its gate)."""
    return tuple(integrity_problems(rec, path))


def steps_path(path: Path, rec: Mapping[str, Any]) -> Path | None:
    name = rec.get("steps_file")
    return path.parent / str(name) if name else None


def load(
    files: Iterable[Path], say: Callable[[str], None]
) -> tuple[list[Record], list[tuple[Path, dict[str, Any]]], list[dict[str, Any]]]:
    """Records, sweep summaries and allreduce sweeps among ``files``; other JSON is skipped."""
    records: list[Record] = []
    summaries: list[tuple[Path, dict[str, Any]]] = []
    comms: list[dict[str, Any]] = []
    for f in files:
        try:
            doc = load_record(f)
        except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
            say(f"report: skipped {f}: not readable as JSON ({e})")
            continue
        kind = doc.get("schema") if isinstance(doc, dict) else None
        if kind == schema.RESULT:
            records.append(Record(f, doc, problems(f, doc)))
        elif kind == schema.SWEEP:
            summaries.append((f, doc))
        elif kind == schema.COMM:
            comms.append(doc)
    records.sort(key=lambda r: (str(get(r.data, "spec", "family")), r.label, world_size(r.data)))
    return records, summaries, comms


# --- sweeps ------------------------------------------------------------------------------------


def sweeps(records: Sequence[Record], summaries: Sequence[tuple[Path, dict[str, Any]]]) -> list[Sweep]:
    """The sweep summaries, then groups of records of one workload at several rank counts that
    no summary covers (e.g. the suite run at 1 and at N ranks)."""
    out: list[Sweep] = []
    covered: set[Path] = set()
    for path, s in summaries:
        points = measured_points(s)
        covered |= {
            (path.parent / str(p["record"])).resolve() for p in s.get("points", []) if p.get("record")
        }
        if points:
            out.append(Sweep(re.sub(r"-summary$", "", path.stem), s))
    return out + record_groups([r for r in records if r.path not in covered])


def measured_points(summary: Mapping[str, Any]) -> dict[int, float]:
    """Rank count -> samples/s of a summary's points that have a record."""
    return {
        int(p["np"]): float(p["samples_per_s"])
        for p in summary.get("points", [])
        if p.get("record") and p.get("samples_per_s")
    }


def record_groups(records: Sequence[Record]) -> list[Sweep]:
    """Weak-scaling sweeps from loose records: the same spec (batch per rank included) on the
    same system and device at two or more rank counts; the best record counts where a count has
    several, as in the score. Only records that verify and passed validity take part: a
    scaling curve from an edited or failed run would mislead."""
    groups: dict[str, dict[int, Record]] = {}
    for r in records:
        if r.problems or not get(r.data, "validity", "passed") or not get(r.data, "metrics", "samples_per_s"):
            continue
        key = json.dumps(
            [r.data.get("spec"), system(r.data), get(r.data, "environment", "device_name")],
            sort_keys=True,
        )
        best = groups.setdefault(key, {})
        n = world_size(r.data)
        if n not in best or r.data["metrics"]["samples_per_s"] > best[n].data["metrics"]["samples_per_s"]:
            best[n] = r
    return [_group_sweep(g) for g in groups.values() if len(g) > 1]


def _group_sweep(group: Mapping[int, Record]) -> Sweep:
    base = group[min(group)]
    points = [
        {
            "np": n,
            "record": group[n].path.name,
            "samples_per_s": group[n].data["metrics"]["samples_per_s"],
            "ai_ops_per_s": get(group[n].data, "metrics", "ai_ops_per_s"),
            "batch_per_rank": get(group[n].data, "settings", "batch_per_rank"),
            "backend": get(group[n].data, "settings", "backend"),
        }
        for n in sorted(group)
    ]
    summary = {"schema": schema.SWEEP, "mode": "weak", "spec": base.data["spec"], "base_np": min(group)}
    label = re.sub(r" \(np\d+\)$|-np\d+$", "", base.label)
    return Sweep(f"{label} (records)", {**summary, "points": points})


# --- figures -----------------------------------------------------------------------------------


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "x"


def scaling_plots(found: Sequence[Sweep], predicted: Predictor | None) -> list[Plot]:
    """One throughput-and-efficiency figure per sweep, with the predicted line when the model gives one."""
    out = []
    for i, s in enumerate(found, 1):
        measured = measured_points(s.summary)
        raw = predicted(s.summary) if predicted else None
        pred = {int(n): float(x) for n, x in raw.items()} if raw else None
        spec = s.summary.get("spec") or {}
        mode = str(s.summary.get("mode", "weak"))
        caption = (
            f"{s.label}: {mode} scaling of {spec.get('family', '?')} ({spec.get('precision', '?')}, "
            f"batch {spec.get('batch_size', '?')}{' per rank' if mode == 'weak' else ''}) at "
            f"{', '.join(map(str, sorted(measured)))} ranks: samples/s of all ranks and efficiency "
            "against the ideal (N/N₀)·X(N₀)" + ("; dotted: the scaling model's prediction" if pred else "")
        )
        draw = partial(plots.scaling, title=s.label, measured=measured, predicted=pred, mode=mode)
        extra = error_table(measured, pred) if pred else ""
        out.append(Plot(f"scaling-{i}-{slug(s.label)}.png", caption, draw, extra))
    return out


def error_table(measured: Mapping[int, float], predicted: Mapping[int, float]) -> str:
    """Predicted against measured samples/s at the measured rank counts, with the relative error."""
    rows = [
        [str(n), f"{x:.4g}", f"{predicted[n]:.4g}", f"{relative_error(predicted[n], x):+.1%}"]
        for n, x in sorted(measured.items())
        if n in predicted and x > 0
    ]
    if not rows:
        return "<p>prediction: no measured rank count to compare with</p>"
    head = ["ranks", "measured samples/s", "predicted samples/s", "error (predicted − measured) / measured"]
    return html_table(head, rows, "prediction")


def phase_plots(records: Sequence[Record]) -> list[Plot]:
    rows = [
        (r.label, {p: float(get(r.data, "metrics", "phases_s", p, "median") or 0.0) for p in plots.PHASES})
        for r in records
        if get(r.data, "metrics", "phases_s")
    ]
    if not rows:
        return []
    caption = (
        "Median time of each step phase (data, forward with loss, backward, allreduce, optimizer) "
        "per record, in ms and as a share of their sum"
    )
    return [Plot("phases.png", caption, partial(plots.phases, rows=rows))]


def rank_figures(r: Record) -> plots.RankFigures:
    ranks = get(r.data, "metrics", "per_rank") or []
    compute = [x.get("compute_median_s") for x in ranks]
    return plots.RankFigures(
        r.label,
        [float(x.get("samples_per_s") or 0.0) for x in ranks],
        [float(c) for c in compute] if all(isinstance(c, int | float) for c in compute) else [],
    )


def per_rank_plots(records: Sequence[Record]) -> list[Plot]:
    groups = [rank_figures(r) for r in records if world_size(r.data) > 1]
    groups = [g for g in groups if len(g.samples_per_s) > 1]
    if not groups:
        return []
    caption = (
        "Each rank of multi-rank records against the median over the record's ranks: samples/s, and "
        "median compute time (forward + backward, which shows a straggler: synchronous ranks wait for "
        "each other, so their samples/s hardly differ); spread = (max − min) / median"
    )
    return [Plot("per-rank.png", caption, partial(plots.per_rank, groups=groups))]


def power_traces(records: Sequence[Record]) -> list[plots.PowerTrace]:
    """Rank 0's GPU power trace of every record whose steps file holds one."""
    traces = []
    for r in records:
        steps = steps_path(r.path, r.data)
        if steps is None or not steps.exists():
            continue
        try:
            cols = read_steps(steps)
        except OSError:  # not HDF5: reported as a changed steps file already
            continue
        t, w = cols.get("gpu_time_s"), cols.get("gpu_power_w")
        if t is not None and w is not None and len(t) > 1 and len(t) == len(w):
            traces.append(plots.PowerTrace(r.label, t.tolist(), w.tolist()))
    return traces


def power_plots(records: Sequence[Record]) -> list[Plot]:
    traces = power_traces(records)
    if not traces:
        return []
    caption = "GPU power of rank 0 over the timed window (NVML, sampled every 0.1 s), one line per record"
    return [Plot("power.png", caption, partial(plots.power, traces=traces))]


SIZE_KNOBS = ("batch_size", "seq_len", "image_size")  # what a workload may vary along one memory curve


def sample_elements(spec: Mapping[str, Any]) -> int | None:
    """Elements of one input sample of a record's spec (pixels × channels, tokens, features,
    spectrogram bins), or None when the spec is not valid. The sample is made on the meta
    device: its shape, and no memory."""
    try:
        parsed = spec_from_dict(dict(spec))
    except (HpcdlError, TypeError):
        return None
    return parsed.sample_inputs(1, torch.Generator(), torch.device("meta")).numel()


def memory_points(records: Sequence[Record]) -> list[plots.MemoryPoint]:
    """For each record with a peak memory figure, a valid spec and counts: the input size of one
    rank's step (batch per rank × elements of one sample), the measured peak memory and
    ``metrics.memory_estimate`` for the same batch. Records of one workload, the same spec but
    for its size knobs on the same device and rank count with the same optimizer and kind of peak,
    share a key."""
    points = []
    for r in records:
        d = r.data
        measured = get(d, "metrics", "peak_memory_bytes")
        params = get(d, "counts", "params")
        act = get(d, "counts", "activation_bytes_per_sample")
        batch = get(d, "settings", "batch_per_rank")
        spec = get(d, "spec")
        per_sample = sample_elements(spec) if isinstance(spec, Mapping) else None
        if not measured or params is None or act is None or not batch or not per_sample:
            continue
        optimizer = str(get(d, "run", "optimizer") or "adamw")
        estimate = memory_estimate(params, act, batch, optimizer)
        kind = str(get(d, "metrics", "peak_memory_kind") or "")
        family = str(spec.get("family"))
        workload = json.dumps(
            [
                {k: v for k, v in spec.items() if k not in SIZE_KNOBS},
                system(d),
                get(d, "environment", "device_name"),
                world_size(d),
                optimizer,
                kind,
            ],
            sort_keys=True,
        )
        points.append(
            plots.MemoryPoint(r.label, family, workload, batch * per_sample, estimate, measured, kind)
        )
    return points


def memory_plots(records: Sequence[Record]) -> list[Plot]:
    points = memory_points(records)
    if not points:
        return []
    caption = (
        "Peak memory per rank against the input size of one step (batch per rank × elements per "
        "sample), measured (filled) and estimated (hollow, dashed), by family; CPU peaks are process "
        "RSS, which includes the interpreter"
    )
    return [Plot("memory.png", caption, partial(plots.memory, points=points))]


# --- HTML --------------------------------------------------------------------------------------

STYLE = HTML_STYLE + (
    "td.num{text-align:right}.bad{color:#b00;font-weight:bold}figure{margin:1.5em 0}"
    "img{max-width:100%;border:1px solid #ddd}figcaption{color:#333;margin-top:.3em}"
)


def esc(value: Any) -> str:
    return html.escape(str(value))


def _join(values: Iterable[Any]) -> str:
    return ", ".join(sorted({str(v) for v in values if v})) or "n/a"


def systems_table(records: Sequence[Record]) -> str:
    """One row per system (Slurm cluster, else rank 0's host) and device: what was measured where, when,
    with which hpcdl."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        device = str(get(r.data, "environment", "device_name") or "?")
        groups.setdefault((system(r.data), device), []).append(r.data)
    rows = []
    for (name, device), recs in sorted(groups.items()):
        dates = sorted(str(d.get("created", ""))[:10] for d in recs if d.get("created"))
        rows.append(
            [
                name,
                _join(h for d in recs for h in (get(d, "settings", "hosts") or [])),
                f"{device} ({_join(get(d, 'settings', 'device') for d in recs)})",
                str(len(recs)),
                f"{dates[0]} – {dates[-1]}" if dates and dates[0] != dates[-1] else (dates or ["n/a"])[0],
                _join(get(d, "environment", "hpcdl") for d in recs),
                _join(get(d, "environment", "git") for d in recs),
                _join(get(d, "environment", "torch") for d in recs),
            ]
        )
    head = ["system", "hosts", "device", "records", "dates", "hpcdl", "git commit", "torch"]
    return html_table(head, rows)


def _step_time(stats: Mapping[str, Any] | None) -> str:
    if not stats or stats.get("median") is None:
        return "n/a"
    ms = {k: float(stats.get(k) or float("nan")) * 1e3 for k in ("median", "p10", "p90")}
    return f"{ms['median']:.3g} ms ({ms['p10']:.3g}–{ms['p90']:.3g})"


def _ratio(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) and value == value else "n/a"


def _validity(rec: Mapping[str, Any]) -> str:
    if get(rec, "validity", "passed"):
        return "passed"
    failed = [str(c.get("name")) for c in get(rec, "validity", "checks") or [] if not c.get("passed")]
    return "failed: " + (", ".join(failed) or "no checks")


def _energy(rec: Mapping[str, Any]) -> str:
    joules = get(rec, "metrics", "energy", "energy_to_solution_j")
    if joules is None:
        return "unavailable"
    per_sample = get(rec, "metrics", "energy", "energy_per_sample_j")
    return si(joules, "J") + (f" ({si(per_sample, 'J')}/sample)" if per_sample is not None else "")


def record_row(r: Record) -> list[str]:
    d, m = r.data, r.data.get("metrics") or {}
    return [
        str(d.get("name", r.path.stem)),
        str(get(d, "spec", "family")),
        str(world_size(d)),
        str(get(d, "settings", "backend") or "n/a"),
        str(get(d, "settings", "precision") or get(d, "spec", "precision")),
        si(m.get("samples_per_s")),
        si(m.get("ai_ops_per_s"), "FLOP/s"),
        _ratio(m.get("mfu")),
        _step_time(m.get("step_time_s")),
        _validity(d),
        _energy(d),
        "; ".join(r.problems) or "ok",
    ]


RECORD_HEAD = [
    "record",
    "family",
    "ranks",
    "backend",
    "precision",
    "samples/s",
    "AI-ops/s",
    "MFU",
    "step time median (p10–p90)",
    "validity",
    "energy",
    "integrity",
]


NUMERIC = {"ranks", "samples/s", "AI-ops/s", "MFU", "step time median (p10–p90)"}


def _cell_class(head: str, cell: str) -> str:
    if (head == "validity" and cell != "passed") or (head == "integrity" and cell != "ok"):
        return "bad"
    return "num" if head in NUMERIC else ""


def records_table(records: Sequence[Record]) -> str:
    """Every record; the file each came from as the name's tooltip; failures and edits in red."""
    rows = []
    for r in records:
        name, *cells = record_row(r)
        tds = [f"<td title='{esc(os.path.relpath(r.path))}'>{esc(name)}</td>"]
        for h, c in zip(RECORD_HEAD[1:], cells, strict=True):
            css = _cell_class(h, c)
            tds.append(f"<td class='{css}'>{esc(c)}</td>" if css else f"<td>{esc(c)}</td>")
        rows.append("<tr>" + "".join(tds) + "</tr>")
    th = "".join(f"<th>{esc(h)}</th>" for h in RECORD_HEAD)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def figure_html(p: Plot) -> str:
    return (
        f"<figure><img src='{esc(p.file)}' alt='{esc(p.caption)}'>"
        f"<figcaption>{esc(p.caption)}</figcaption>{p.extra}</figure>"
    )


def section(title: str, plotted: Sequence[Plot], absent: str) -> str:
    body = "".join(figure_html(p) for p in plotted) if plotted else f"<p>{esc(absent)}</p>"
    return f"<h3>{esc(title)}</h3>{body}"


def unverified_html(records: Sequence[Record]) -> str:
    bad = [r for r in records if r.problems]
    if not bad:
        return "<p>none: every record matches its digest and its steps file</p>"
    items = "".join(
        f"<li><b>{esc(r.data.get('name', r.path.stem))}</b> ({esc(os.path.relpath(r.path))}): "
        f"<span class='bad'>{esc('; '.join(r.problems))}</span></li>"
        for r in bad
    )
    note = "Shown above, but not to be trusted: their figures may not be what was measured."
    return f"<p>{note}</p><ul>{items}</ul>"


def page(
    paths: Sequence[Path],
    records: Sequence[Record],
    found: Sequence[Sweep],
    sections: Sequence[tuple[str, list[Plot], str]],
) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>hpcdl report</title>"
        f"<style>{STYLE}</style></head><body><h1>hpcdl report</h1>"
        f"<p>{len(records)} records and {len(found)} scaling sweeps from {esc(', '.join(map(str, paths)))}; "
        f"written {now} by hpcdl {esc(hpcdl_version())}. Formulas: METRICS.md.</p>"
        f"<h2>Systems</h2>{systems_table(records)}"
        f"<h2>Records</h2>{records_table(records)}"
        "<h2>Figures</h2>"
        + "".join(section(*s) for s in sections)
        + f"<h2>Records that do not verify</h2>{unverified_html(records)}</body></html>\n"
    )


def write_report(
    paths: Sequence[Path],
    out_dir: Path,
    predicted: Predictor | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    """Write ``out_dir/index.html`` and its PNG figures from every record (``hpcdl.result``) and
    sweep summary (``hpcdl.scaling.sweep``) under ``paths`` (files or directories, searched recursively);
    other JSON files are skipped. ``predicted`` maps a sweep summary to predicted samples/s by
    rank count (or None), drawn beside the measured points; by default the scaling model,
    calibrated on the allreduce sweeps (``hpcdl.comm``) under ``paths``. Returns the HTML
    file's path."""
    paths = [Path(p) for p in paths]
    records, summaries, comms = load(json_files(paths), say)
    if not records and not summaries:
        raise HpcdlError(f"report: no hpcdl records under {', '.join(map(str, paths))}")
    predicted = predicted or sweep_predictor(comms)
    found = sweeps(records, summaries)
    sections = [
        ("Scaling", scaling_plots(found, predicted), "no sweep: no workload measured at several rank counts"),
        ("Step phases", phase_plots(records), "no record with phase times"),
        ("Per-rank throughput", per_rank_plots(records), "no multi-rank record"),
        ("Power", power_plots(records), NO_POWER),
        ("Memory", memory_plots(records), "no record with a peak memory figure"),
    ]
    plotted = [p for _, ps, _ in sections for p in ps]
    say(f"report: {len(records)} records, {len(found)} sweeps; writing {len(plotted)} figures to {out_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in plotted:
        p.draw(out_dir / p.file)
    index = out_dir / "index.html"
    index.write_text(page(paths, records, found, sections), encoding="utf-8")
    say(f"report: wrote {index}")
    return index
