"""torch.distributed with DistributedDataParallel: gloo on CPUs, NCCL on GPUs, initialised
from the MPI world (rank 0's host and a free port, broadcast over MPI). ``DistGroup`` is the
process group and its blocking collectives, shared with the FSDP backend."""

from __future__ import annotations

import inspect
import os
import socket
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hpcdl.parallel.backends import BACKENDS, MakeOptimizer, Traffic, Wrapped, allreduce_traffic
from hpcdl.parallel.backends.replicated import Replicated
from hpcdl.parallel.placement import rank_local
from hpcdl.parallel.world import World

NO_FORWARD_SYNC = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else "broadcast_buffers"
)
"""DDP's switch for broadcasting buffers before every forward (its name since torch 2.13)"""


def _routable_address() -> str | None:
    """This host's address on its default route (a UDP connect sends nothing; it only picks
    the interface), or None without one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
    except OSError:
        return None


def rendezvous_host(nodes: int) -> str:
    """Rank 0's address for the rendezvous: MASTER_ADDR when set, else its host name resolved;
    but a host name that resolves to loopback (stock Debian maps it to 127.0.1.1) is no address
    for ranks on other nodes, which then use the address of the default route's interface."""
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    host = socket.gethostbyname(socket.gethostname())
    if nodes > 1 and host.startswith("127."):
        return _routable_address() or host
    return host


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class DistGroup(Replicated):
    """The default torch.distributed process group of this run and the blocking collectives
    every backend offers, through it."""

    def __init__(self, world: World, device: torch.device, timeout_s: float = 120.0) -> None:
        self.device = device
        self.ranks = world.size
        if dist.is_initialized():  # an auto-fit trial's fake group (``measure.trial.Shard``): kept
            self.pg_backend = str(dist.get_backend())
            return
        addr = world.bcast((rendezvous_host(world.nodes), _free_port()) if world.rank == 0 else None)
        self.pg_backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            self.pg_backend,
            init_method=f"tcp://{addr[0]}:{addr[1]}",
            rank=world.rank,
            world_size=world.size,
            timeout=timedelta(seconds=timeout_s),
        )

    @staticmethod
    def unavailable() -> str | None:
        return None if dist.is_available() else "this torch build has no torch.distributed"

    def allreduce(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.new_empty(self.ranks * tensor.shape[0], *tensor.shape[1:])
        dist.all_gather_single(out, tensor.contiguous())
        return out

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.new_empty(tensor.shape[0] // self.ranks, *tensor.shape[1:])
        dist.reduce_scatter_single(out, tensor.contiguous())
        return out

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, tensor.contiguous())
        return out

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


@BACKENDS.register
class TorchBackend(DistGroup):
    name: ClassVar[str] = "torch"
    auto_priority: ClassVar[int | None] = 1
    shards_state: ClassVar[bool] = False
    keeps_gradients: ClassVar[bool] = True
    MESSAGE_BYTES: ClassVar[int] = 25 << 20
    """DistributedDataParallel's gradient bucket (``bucket_cap_mb``'s default)"""
    exposed_method: ClassVar[str] = "median backward with DDP minus median backward under no_sync()"
    compute_only_method: ClassVar[str] = (
        "median forward + median backward under no_sync() (5 calibration steps)"
    )

    def wrap(self, model: nn.Module, make_optimizer: MakeOptimizer, accumulation_steps: int = 1) -> Wrapped:
        # (accumulation: DDP reduces in every backward outside no_sync(), see accumulating)
        # DDP broadcasts rank 0's parameters and buffers when it is constructed; the optimizer
        # has no state yet, so nothing else needs broadcasting. Rank-local parameters are
        # neither broadcast nor reduced.
        local = rank_local(model)
        names = [n for n, p in model.named_parameters() if id(p) in local]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
        ids = [self.device.index] if self.device.type == "cuda" else None
        # buffers (batch norm's running statistics) stay each rank's own after the broadcast at
        # construction, as under Horovod: DDP's default would broadcast them before every
        # forward, a collective no traffic rule counts (torch 2.13 names that
        # forward_sync_buffers and warns of broadcast_buffers on every rank; older ones, as in
        # the containers' framework images, know only broadcast_buffers)
        buffers: dict[str, Any] = {NO_FORWARD_SYNC: False}
        # the gradients are views into the buckets DDP reduces, not a second copy beside them:
        # 4 x params less per rank, as one process whose gradients stay allocated between steps
        # holds (keeps_gradients; benchmarks/memory_ddp.py: 319 against 327 MiB at batch 4000)
        ddp = DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True, **buffers)
        return ddp, make_optimizer(ddp.parameters())

    def accumulating(self, model: nn.Module) -> AbstractContextManager[object]:
        # no_sync() around forward and backward: the buckets are not reduced, and the next
        # backward outside it reduces the gradients accumulated meanwhile
        return model.no_sync() if isinstance(model, DistributedDataParallel) else nullcontext()

    def no_reduction(self, model: nn.Module) -> AbstractContextManager[object] | None:
        return model.no_sync() if isinstance(model, DistributedDataParallel) else None

    def finish_reduction(self, optimizer: torch.optim.Optimizer) -> None:
        pass  # DDP's backward returns only once every bucket is reduced: exposed time is in backward

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        scaler.step(optimizer)

    @staticmethod
    def traffic(model: nn.Module, accumulation_steps: int = 1) -> list[Traffic]:
        return allreduce_traffic(model, TorchBackend.MESSAGE_BYTES)  # once per step

    @staticmethod
    def exposed_s(backward_s: float, local_backward_s: float | None, reduction_s: float) -> float | None:
        # DDP's backward returns only once every bucket is reduced: the exposed time is in it
        return max(0.0, backward_s - local_backward_s) if local_backward_s is not None else 0.0

    @staticmethod
    def compute_only_s(forward_s: float, backward_s: float, local_backward_s: float | None) -> float | None:
        # backward waits for the slowest rank's buckets: only no_sync()'s backward is its own
        return forward_s + local_backward_s if local_backward_s is not None else None
