"""How a prediction reads on the console (``hpcdl predict``): each model's assumptions, then a
table of its points with only the columns that hold something."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcdl.records.views import PredictionPoint
from hpcdl.results.text import si, table, wrapped

if TYPE_CHECKING:  # the model imports the backends (torch); describe imports it when it runs
    from hpcdl.scaling import model as model_mod


def describe(
    label: str, model: model_mod.Model, rpn: int, backend: str, skipped: list[int], rule: str
) -> None:
    from hpcdl.scaling import model as model_mod

    print(
        f"model [{label}]: gamma {si(model.gamma_flops_per_s, 'FLOP/s')} per rank, {model.mode} scaling, "
        f"overlap {model.overlap}, {rpn} rank(s) per node, accumulation_steps {model.accumulation_steps}"
    )
    print(wrapped(f"gamma: {rule}", indent="  "))
    print(f"  per step and rank ({backend}):")
    for t in model.traffic:
        c = model.comms[t.collective]
        levels = [("", c)] if isinstance(c, model_mod.Comm) else [("intra ", c.intra), ("inter ", c.inter)]
        text = ", ".join(
            f"{name}latency {lvl.alpha_s * 1e6:.1f} us, bandwidth {si(lvl.beta_bytes_per_s, 'B/s')}"
            for name, lvl in levels
        )
        print(f"    {t.collective}: {si(t.bytes, 'B')} in {t.calls} call(s); {text}")
    if skipped:
        print(f"  left out: {', '.join(map(str, skipped))} ranks, which the experts cannot be sharded across")


def rate(x: float) -> str:
    """Samples per second as a person reads them: ``11,190`` or ``45.2``, never ``1.119e+04``."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def render(points: list[PredictionPoint], several: bool) -> str:
    head = ["nodes", "ranks", "step ms", "+-", "compute ms", "comm ms", "hidden", "algorithm"]
    head += ["straggler ms", "sync ms", "data ms", "samples/s", "AI-ops/s", "efficiency"]
    compared = any(p.error is not None for p in points)  # measured columns only where there are some
    if compared:
        head += ["measured samples/s", "meas. hidden", "error"]
    costs = any(p.costed for p in points)
    if costs:
        head += ["hours", "energy kWh"]
    rows = []
    for p in points:
        hidden = "" if p.overlap is None else f"{p.overlap:.0%}"
        row = [
            str(p.nodes),
            str(p.np),
            f"{p.step_s * 1e3:.2f}",
            f"{p.step_rse:.1%}",
            f"{p.compute_s * 1e3:.2f}",
            f"{p.comm_s * 1e3:.2f}",
            hidden,
            p.algorithm,
            f"{p.straggler_s * 1e3:.2f}",
            f"{p.sync_s * 1e3:.2f}",
            f"{p.data_s * 1e3:.2f}",
            rate(p.samples_per_s),
            si(p.ai_ops_per_s, "FLOP/s"),
            f"{p.efficiency:.1%}",
        ]
        if compared:
            row += [
                rate(p.measured_samples_per_s) if p.measured_samples_per_s is not None else "",
                f"{p.measured_overlap:.0%}" if p.measured_overlap is not None else "",
                f"{p.error:+.1%}" if p.error is not None else "",
            ]
        if costs:
            hours = "n/a" if p.train_hours is None else f"{p.train_hours:,.3g}"
            row += [hours, kwh(p.train_energy_kwh, p.energy_estimated)]
        rows.append(([p.system] if several else []) + row)
    return table((["system"] if several else []) + head, rows)


def kwh(value: float | None, estimated: bool | None) -> str:
    """Energy as a person reads it, an estimate marked as one."""
    if value is None:
        return "n/a"
    return f"{value:,.4g}" + (" (est.)" if estimated else "")
