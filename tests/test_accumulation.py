"""Gradient accumulation (``accumulation_steps``): one step is that many micro-batches, their
gradients reduced and the optimizer run once. Checked on real training steps in this process,
and on 2 real MPI ranks (this file run under mpirun, see ``ranks_main``) under DDP, Horovod and
FSDP: the parameters after one step, and where in the step the gradients are reduced."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import hpcdl

if __package__:  # imported as tests.test_accumulation by mpirun's ranks (ranks_main)
    from tests import hpcdl_cli
else:
    import hpcdl_cli  # beside this file, on pytest's path
from hpcdl.measure.config import RunConfig
from hpcdl.measure.data import make_batch
from hpcdl.measure.fit import estimated_batch, fit_batch, rank_memory
from hpcdl.measure.loop import Trainer
from hpcdl.parallel.launch import mpi_env, mpirun_command
from hpcdl.parallel.world import World
from hpcdl.records.audit import audit
from hpcdl.records.loader import read_record
from hpcdl.results.score import suite_workload
from hpcdl.schedulers.load import load_job
from hpcdl.schedulers.point import points
from hpcdl.workloads import recipes
from hpcdl.workloads.spec import Spec

MLP = {"family": "mlp", "layers": 2, "width": 32, "input_size": 16, "output_size": 4}
"""no batch norm, no dropout: a batch's gradient is the mean of its samples' exactly"""
CPU = torch.device("cpu")


class Batches:
    """A batch source that hands out the given batches in order, each after ``delay_s``."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]], delay_s: float = 0.0) -> None:
        self.batches, self.delay_s, self.i = batches, delay_s, 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_s)
        self.i += 1
        return self.batches[(self.i - 1) % len(self.batches)]


def one_step(spec: Spec, batches: list[tuple[torch.Tensor, torch.Tensor]], optimizer: str) -> Trainer:
    """A trainer of ``spec`` that has taken one step over ``batches`` (its micro-batches)."""
    model = spec.build()
    make = torch.optim.SGD if optimizer == "sgd" else torch.optim.AdamW
    trainer = Trainer(
        model=model,
        optimizer=make(model.parameters(), lr=0.1),
        source=Batches(batches),
        device=CPU,
        precision="fp32",
        accumulation_steps=spec.accumulation_steps,
    )
    trainer.step()
    return trainer


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_n_micro_batches_step_like_one_batch_of_n_times_the_samples(optimizer: str) -> None:
    n, b = 3, 4
    accumulated = hpcdl.spec_from_dict({**MLP, "batch_size": b, "accumulation_steps": n})
    whole = accumulated.replace(batch_size=n * b, accumulation_steps=1)
    x, y = make_batch(whole, n * b, CPU, stream=7)
    start = {k: p.detach() for k, p in whole.build().named_parameters()}
    micro = one_step(accumulated, list(zip(x.split(b), y.split(b), strict=True)), optimizer)
    ref = one_step(whole, [(x, y)], optimizer)
    got = {k: p.detach() for k, p in micro.model.named_parameters()}
    want = {k: p.detach() for k, p in ref.model.named_parameters()}
    update = max(float((want[k] - start[k]).abs().max()) for k in want)
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert update > 1e-3 and diff <= 1e-4 * update, (diff, update)
    # the step's loss is the mean over its micro-batches: the whole batch's
    assert float(micro._losses[0]) == pytest.approx(float(ref._losses[0]), rel=1e-6)


def test_data_and_forward_phases_sum_over_the_micro_batches() -> None:
    """Each micro-batch's loading and forward pass are in the step's phases: 3 micro-batches
    that each wait 20 ms for data and sleep 20 ms before forward take at least 60 ms in each."""
    spec = hpcdl.spec_from_dict({**MLP, "batch_size": 2, "accumulation_steps": 3})
    model = spec.build()
    pool = list(zip(*(t.split(2) for t in make_batch(spec, 6, CPU)), strict=True))
    trainer = Trainer(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        source=Batches(pool, delay_s=0.02),
        device=CPU,
        precision="fp32",
        delay_s=0.02,
        accumulation_steps=3,
    )
    log = trainer.run(warmup=1, steps=2, duration_s=0)
    assert min(log.phases_s["data"]) >= 0.06 and min(log.phases_s["forward"]) >= 0.06
    assert all(sum(p[i] for p in log.phases_s.values()) <= s for i, s in enumerate(log.step_s))
    assert trainer.source.i == 3 * 3  # type: ignore[attr-defined]


def test_record_counts_samples_of_every_micro_batch(tmp_path: Path) -> None:
    spec = hpcdl.spec_from_dict({**MLP, "batch_size": 8, "accumulation_steps": 3})
    res = hpcdl.run(spec, RunConfig(steps=6, warmup_steps=1, min_duration_s=0), output_dir=tmp_path, name="a")
    rec = res.record
    s, m = rec["settings"], rec["metrics"]
    assert (s["batch_per_rank"], s["accumulation_steps"], s["global_batch"]) == (8, 3, 24)
    assert rec["spec"]["accumulation_steps"] == 3 and res.result.settings.samples_per_step == 24
    assert m["samples_per_s"] == pytest.approx(24 * 6 / m["timed_window_s"])
    assert m["ai_ops_per_s"] == pytest.approx(m["samples_per_s"] * spec.count().train_flops)
    assert res.passed, rec["validity"]
    assert audit(read_record(tmp_path / "a.json")).problems == ()  # the audit counts them too


@pytest.mark.slow(reason="auto-fit's trials in child processes, twice: about 30 s")
def test_memory_and_auto_fit_follow_the_micro_batch() -> None:
    """Accumulation runs the micro-batches one after the other, each freeing its activations;
    from the second on every gradient is alive beside them, so the batch that fits is smaller by
    at most the gradients' bytes over a sample's (here 12 of 911,183 samples: the last ReLU's
    backward, the peak, had only the head's 132 parameters' gradients beside it), and the fitted
    spec keeps its accumulation."""
    one = hpcdl.spec_from_dict({**MLP, "batch_size": 8})
    four = one.replace(accumulation_steps=4)
    gib = 1 << 30
    fewer = estimated_batch(one, "adamw", 0.5, gib) - estimated_batch(four, "adamw", 0.5, gib)
    assert 0 < fewer <= 4 * one.count().params // one.memory_per_sample() + 1, fewer
    target = 10 << 20  # the CPU libraries' 4.5 MiB and a few thousand samples: trials of a second
    fitted, fit = fit_batch(four, RunConfig(fit_fraction=target / rank_memory(CPU, World())), CPU, World())
    assert fitted.accumulation_steps == 4 and fitted.batch_size == fit.batch > 8


@pytest.mark.parametrize("value", ["0", "-1", "1.5"])
def test_bad_accumulation_is_one_line_exit_2(value: str) -> None:
    err = hpcdl_cli.one_line(
        hpcdl_cli.hpcdl("run", "--workload", "mlp", f"accumulation_steps={value}", "-o", "/nonexistent/x")
    )
    assert "mlp.accumulation_steps=" in err and value in err, err
    with pytest.raises(hpcdl.SpecError, match=r"^mlp\.accumulation_steps="):
        hpcdl.spec_from_dict({**MLP, "accumulation_steps": json.loads(value)})


def test_job_file_workload_takes_accumulation(tmp_path: Path) -> None:
    """In a job file's [workload] table like any knob: the points run it (tests/test_schedulers.py
    runs one with the local executor); a bad value is one line naming the job file's field."""
    knobs = "\n".join(f"{k} = {json.dumps(v)}" for k, v in MLP.items())
    text = 'name = "acc"\nnodes = [1]\n[workload]\n' + knobs + "\naccumulation_steps = {}\n"
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(text.format(4))
    bad.write_text(text.format(0))
    assert load_job(good).spec().accumulation_steps == 4
    (point,) = points(load_job(good), "here", tmp_path)
    assert point.spec["accumulation_steps"] == 4
    err = hpcdl_cli.one_line(hpcdl_cli.hpcdl("submit", str(bad), "--dry-run"))
    assert err == "hpcdl: error: job.workload.accumulation_steps=0 is invalid: must be in [1, 65536]"


def test_suites_default_to_one_and_accumulation_is_a_tunable_knob() -> None:
    """Every suite workload runs with accumulation 1 unless asked; a record run with more still
    runs the suite's workload (like its batch size, the submitter may choose it)."""
    for size_class in recipes.size_classes():
        for name, spec in recipes.suite(size_class).specs().items():
            assert spec.accumulation_steps == 1
            assert suite_workload(spec.replace(accumulation_steps=4).to_dict(), size_class) == name
    older = {
        k: v for k, v in recipes.suite("S").specs()["mlp-wide"].to_dict().items() if k != "accumulation_steps"
    }
    assert suite_workload(older, "S") == "mlp-wide"  # a record from before the knob


# ------------------------------------------------------------------------------ 2 MPI ranks
N = 3
RANKS_SPEC = {**MLP, "batch_size": 4, "accumulation_steps": N}


def reductions(backend: Any, world: World, steps: int) -> dict[str, Any]:
    """Train ``steps`` steps of N micro-batches through ``backend`` and note, at every gradient
    reduction the library starts (DDP: a bucket's communication hook; Horovod: a parameter's
    allreduce), which micro-batch of which step was running."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    spec = hpcdl.spec_from_dict(RANKS_SPEC)
    model = spec.build()
    forwards = [0]
    model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    wrapped, opt = backend.wrap(model, lambda p: torch.optim.SGD(p, lr=0.1), N)
    at: list[int] = []  # the forward count when each reduction started
    if backend.name == "torch":

        def hook(state, bucket):  # no annotations: DDP would check them against its own types
            at.append(forwards[0])
            return default_hooks.allreduce_hook(state, bucket)

        wrapped.register_comm_hook(None, hook)
    else:
        start = opt._allreduce_grad_async

        def spy(p: torch.nn.Parameter) -> Any:
            at.append(forwards[0])
            return start(p)

        opt._allreduce_grad_async = spy
    x, y = make_batch(spec, 4 * spec.batch_size, CPU, stream=world.rank)
    source = Batches(list(zip(x.split(spec.batch_size), y.split(spec.batch_size), strict=True)))
    trainer = Trainer(
        model=wrapped, optimizer=opt, source=source, device=CPU, precision="fp32", backend=backend,
        accumulation_steps=N,
    )  # fmt: skip
    trainer.run(1, steps - 1, 0)
    return {
        "steps": steps,
        "micro_batches": sorted({(f - 1) % N for f in at}),
        "steps_reduced": sorted({(f - 1) // N for f in at}),
        "calls": len(at),
        "params": len(list(model.parameters())),
    }


def ranks_main() -> None:
    """On every rank (``mpirun -np 2 python -m tests.test_accumulation``): the equivalence
    check and the reductions of each backend; rank 0 prints them as JSON."""
    from hpcdl.measure.checks import one_step_equivalence
    from hpcdl.parallel.backends import make_backend
    from hpcdl.parallel.world import init_world

    torch.set_num_threads(1)
    world = init_world()
    out = {}
    for name in ("torch", "horovod", "fsdp"):
        backend = make_backend(name, world, CPU)
        try:
            check = one_step_equivalence(hpcdl.spec_from_dict(RANKS_SPEC), world, backend, CPU)
            out[name] = {"check": check.passed, "detail": check.detail}
            if name != "fsdp":
                out[name] |= reductions(backend, world, steps=4)
        finally:
            backend.close()
    if world.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


@pytest.fixture(scope="module")
def ranks() -> dict[str, Any]:
    cmd = mpirun_command(2, ["tests.test_accumulation"])
    p = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=mpi_env(), cwd=Path(__file__).parent.parent
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    (line,) = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    return dict(json.loads(line.removeprefix("RESULT ")))


@pytest.mark.mpi
@pytest.mark.slow(
    reason="two ranks started once for the module (10-25 s); the fast tier checks accumulation end to end"
)
@pytest.mark.parametrize("backend", ["torch", "horovod", "fsdp"])
def test_two_ranks_of_n_micro_batches_step_like_one_process(ranks: dict[str, Any], backend: str) -> None:
    """2 ranks x N micro-batches of b: one step gives the parameters of one process on the
    2·N·b samples at once (``measure.checks.one_step_equivalence``, run in every run)."""
    r = ranks[backend]
    assert r["check"] and f"of {N} micro-batches" in r["detail"], r["detail"]


@pytest.mark.mpi
@pytest.mark.slow(reason="shares the module's two ranks with the test above")
@pytest.mark.parametrize("backend", ["torch", "horovod"])
def test_gradients_are_reduced_once_per_step(ranks: dict[str, Any], backend: str) -> None:
    """Every reduction starts in the last micro-batch of a step, and every step has them: DDP's
    no_sync() and Horovod's backward_passes_per_step hold the first N-1 back."""
    r = ranks[backend]
    assert r["micro_batches"] == [N - 1], r
    assert r["steps_reduced"] == list(range(r["steps"])), r
    if backend == "horovod":  # one allreduce per parameter per step
        assert r["calls"] == r["steps"] * r["params"], r


if __name__ == "__main__":
    ranks_main()
    sys.exit(0)
