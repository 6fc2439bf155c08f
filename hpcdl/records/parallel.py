"""What the ranks of a run moved and how its parallel dimensions shared the work: every
collective of a step, the exposed communication, a layout's per-rank counts and a pipeline's
block (docs/metrics.md, "Several ranks", "Communication", "Parallel layouts")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hpcdl import metrics
from hpcdl.measure.measurement import RankMeasurement
from hpcdl.parallel.backends import BACKENDS
from hpcdl.parallel.layout import Layout
from hpcdl.parallel.tensor import rank_count
from hpcdl.records.views import Collective, Communication, PipelineFigures, PipelineRank, Stats
from hpcdl.workloads.spec import Spec


def collectives_of(ranks: Sequence[RankMeasurement], layout: Layout) -> dict[str, Collective]:
    """Every collective of a step: the backend's, each timed after training as one blocking
    call of its bytes per step, and the in-step ones (the experts' all-to-all), timed as they
    ran; each the slowest rank's bytes, calls and median time (a pipeline's ranks move
    different amounts: a middle stage sends both ways, the first stage holds the most blocks).
    Under a layout that splits the model, a collective named ``DIM.KIND`` (``tp.allreduce``,
    ``pp.send``) runs among the ranks of one ``DIM`` group, the others among the dp replicas;
    each says how many ranks it ran among."""
    n, out = len(ranks), {}
    for name in (t.collective for t in ranks[0].traffic):
        slowest = max(ranks, key=lambda r: r.collective_s[name])
        seconds = slowest.collective_s[name]
        t = next(x for x in slowest.traffic if x.collective == name)
        dim, _, kind = t.collective.rpartition(".")
        if layout.model_parallel:
            group = getattr(layout, dim or "dp")
            timing = f"after training, its calls of one step among the {group} ranks of a {dim or 'dp'} group"
            out[t.collective] = collective(kind, t.bytes, t.calls, seconds, group, timing, group)
            continue
        out[t.collective] = collective(
            t.collective, t.bytes, t.calls, seconds, n, "one blocking call after training"
        )
    log = ranks[0].log
    if log.in_step_calls:
        per_step = [metrics.summarize(r.log.in_step_per_step())["median"] for r in ranks]
        out["all_to_all"] = collective(
            "all_to_all", log.in_step_bytes, log.in_step_calls, max(per_step), n, "in the step, as it ran"
        )
    return out


def collective(
    name: str, nbytes: int, calls: int, seconds: float, ranks: int, timing: str, group: int | None = None
) -> Collective:
    algbw = metrics.algbw(nbytes, seconds)
    return Collective(nbytes, calls, seconds, algbw, metrics.busbw(algbw, ranks, name), timing, group)


def communication(
    backend: str, ranks: Sequence[RankMeasurement], phases: dict[str, Stats], layout: Layout
) -> Communication:
    """Communication figures: every collective of a step (the slowest rank sets the pace), the
    allreduce of data parallelism also in the fields it always had, and the communication left
    exposed, by the backend's own rule."""
    grad_bytes = ranks[0].grad_bytes
    if len(ranks) == 1:
        return Communication(grad_bytes_per_step=grad_bytes)
    local = [t for r in ranks for t in r.local_backward_s]
    rules = BACKENDS.get(backend)
    if ranks[0].pipeline is not None:  # its point-to-point traffic is in the pipeline block
        exposed = phases["allreduce"].median if grad_bytes else None  # the dp replicas' alone
        return Communication(
            grad_bytes_per_step=grad_bytes,
            exposed_s=exposed,
            exposed_method=rules.exposed_method,
            collectives=collectives_of(ranks, layout),  # tp x pp: the stages' tp allreduces
        )
    exposed = rules.exposed_s(
        phases["backward"].median,
        metrics.summarize(local)["median"] if local else None,
        phases["allreduce"].median,
    )
    collectives = collectives_of(ranks, layout)
    allreduce = collectives.get("allreduce")
    return Communication(
        grad_bytes_per_step=grad_bytes,
        allreduce_s=allreduce.seconds_per_step if allreduce else None,
        algbw_bytes_per_s=allreduce.algbw_bytes_per_s if allreduce else None,
        busbw_bytes_per_s=allreduce.busbw_bytes_per_s if allreduce else None,
        exposed_s=exposed,
        exposed_method=rules.exposed_method,
        collectives=collectives,
    )


def rank_counts(spec: Spec, layout: Layout) -> dict[str, int]:
    """One rank's share of the work under tensor parallelism alone (``Counts.rank_*``), else
    none (a pipeline's ranks: the parameters each holds are its pipeline block's ``per_rank``)."""
    if layout.tp == 1 or layout.pp > 1:
        return {}
    mine = rank_count(spec, layout.tp)
    return {
        "rank_params": mine.params,
        "rank_forward_flops_per_sample": mine.forward_flops,
        "rank_train_flops_per_sample": mine.train_flops,
    }


def pipeline_of(spec: Spec, ranks: Sequence[RankMeasurement], layout: Layout) -> PipelineFigures | None:
    """The pipeline block: the schedule, the bubble measured beside the theoretical one, and
    the point-to-point bytes of a step (one pipeline's: all ranks' over the dp replicas)."""
    if ranks[0].pipeline is None:
        return None
    rows = []
    for r in ranks:
        s = r.pipeline
        assert s is not None
        rows.append(
            PipelineRank(
                rank=r.rank,
                pp_rank=s.pp_rank,
                stages=s.stages,
                params=s.params,
                busy_s=metrics.summarize(s.busy_s)["median"],
                span_s=metrics.summarize(s.span_s)["median"],
                bubble=s.bubble,
                sent_bytes_per_step=s.sent_bytes,
            )
        )
    virtual = len(rows[0].stages)
    return PipelineFigures(
        schedule=layout.schedule,
        stages=layout.pp,
        stages_per_rank=virtual,
        microbatches=layout.chunks,
        microbatch_size=spec.batch_size // layout.chunks,
        bubble_theoretical=metrics.theoretical_bubble(layout.pp, layout.chunks, virtual),
        bubble_measured=float(np.mean([row.bubble for row in rows])),
        p2p_bytes_per_step=sum(row.sent_bytes_per_step for row in rows) // layout.dp,
        p2p_sends_per_step=sum(r.pipeline.sends for r in ranks if r.pipeline) // layout.dp,
        per_rank=rows,
    )
