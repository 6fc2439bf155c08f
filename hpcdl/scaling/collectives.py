"""α-β costs of the collectives a training step runs, as the libraries run them.

A one-level cost (:class:`Comm`) is one flat ring: every rank pays the same latency ``α`` per
ring step and the same bus bandwidth ``β``. A two-level cost (:class:`Hierarchy`) has a link
inside a node (NVLink, xGMI, PCIe, shared memory) and a fabric between nodes (every NIC of a
node together), and takes, per message size, the cheapest of the algorithms a library would
run (docs/metrics.md, "Prediction"):

- ring: ``2(p−1)`` steps of the slowest hop's latency; every ring edge carries
  ``2(p−1)/p · S``, inside a node and through the node's NICs alike (NCCL runs one ring
  per NIC, so the node's whole fabric carries it);
- tree (NCCL's double binary tree across nodes, a chain inside each): latency
  ``2(⌈log₂ N⌉·α_inter + (r−1)·α_intra)``, each node sends and receives ``S`` in each of
  the reduce and the broadcast: ``2S / min(β_intra, β_node)``;
- hierarchical (Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE``): reduce-scatter inside the
  node, an allreduce of ``S/r`` per rank across nodes (ring or tree, the cheaper), all-gather
  inside the node.

All-gather and reduce-scatter run as rings; an all-to-all sends ``S·(p−r)/p`` of each
rank's bytes out of its node, ``r`` ranks sharing the node's fabric. Where ``inter`` was fitted
to one rank a node (a sweep across two nodes) it is what one rank's all-to-all achieves, which
can be below the fabric (gloo's sends and receives in turn); ``fabric_bytes_per_s`` then gives
the fabric (the allreduce's fit), and the node's ranks together move at
``min(fabric, r · β_inter)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hpcdl import metrics


@dataclass(frozen=True, kw_only=True)
class Comm:
    """Ring cost of one collective: ``messages · s(p)·alpha_s + f(p) · bytes / beta_bytes_per_s``
    (``s(p) = p·f(p)`` ring steps; ``f`` its bus factor). One level: the same α and β for every
    pair of ranks."""

    alpha_s: float
    beta_bytes_per_s: float
    collective: str = "allreduce"
    alpha_se_s: float = 0.0
    """standard error of α from the fit's residuals (0: given, not fitted)"""
    beta_rse: float = 0.0
    """relative standard error of β from the fit's residuals (0: given, not fitted)"""

    def time(self, nbytes: float, p: int, messages: int = 1) -> float:
        if p <= 1:
            return 0.0
        factor = metrics.bus_factor(self.collective, p)
        return messages * p * factor * self.alpha_s + factor * nbytes / self.beta_bytes_per_s

    def algorithm(self, nbytes: float, p: int, messages: int = 1) -> str:
        return "ring"

    def shifted(self, parameter: str) -> Comm:
        """α one standard error up (``"alpha"``) or β one standard error down (``"beta"``)."""
        if parameter == "alpha":
            return replace(self, alpha_s=self.alpha_s + self.alpha_se_s)
        return replace(self, beta_bytes_per_s=self.beta_bytes_per_s / (1 + self.beta_rse))


@dataclass(frozen=True, kw_only=True)
class Hierarchy:
    """Two-level cost of one collective on nodes of ``ranks_per_node`` ranks: ``intra`` is one
    rank's link inside a node, ``inter`` the node's fabric (α per message across nodes, β of
    all its NICs together). ``p`` ranks fill ``⌈p / r⌉`` nodes."""

    intra: Comm
    inter: Comm
    ranks_per_node: int
    collective: str = "allreduce"
    algorithms: tuple[str, ...] = ("ring", "tree", "hierarchical")
    """the allreduce algorithms the library has (NCCL before 2.4: ring only)"""
    fabric_bytes_per_s: float = 0.0
    """all-to-all only: the node's fabric where ``inter`` is one rank's rate, not the node's
    (0: ``inter`` is the node's)"""

    def candidates(self, nbytes: float, p: int, messages: int = 1) -> dict[str, float]:
        """Seconds of each algorithm a library could run at ``p`` ranks."""
        if p <= 1:
            return {"none": 0.0}
        r = min(self.ranks_per_node, p)
        n = math.ceil(p / r)
        if n == 1:  # one node: the intra-node link alone
            return {"ring": replace(self.intra, collective=self.collective).time(nbytes, p, messages)}
        a_in, b_in = self.intra.alpha_s, self.intra.beta_bytes_per_s
        a_out, b_node = self.inter.alpha_s, self.inter.beta_bytes_per_s
        slowest = min(b_in, b_node)
        factor = metrics.bus_factor(self.collective, p)
        if self.collective == "all_to_all":  # pairwise: what leaves the node shares its fabric
            node = min(self.fabric_bytes_per_s, r * b_node) if self.fabric_bytes_per_s > 0 else b_node
            inside = nbytes * (r - 1) / p / b_in
            outside = r * nbytes * (p - r) / p / node
            return {"pairwise": messages * (p - 1) * max(a_in, a_out) + max(inside, outside)}
        ring = messages * p * factor * max(a_in, a_out) + factor * nbytes / slowest
        if self.collective != "allreduce":
            return {"ring": ring}
        log_n = math.ceil(math.log2(n))
        tree = messages * 2 * (log_n * a_out + (r - 1) * a_in) + 2 * nbytes / slowest
        across = min(
            messages * 2 * (n - 1) * a_out + 2 * (n - 1) / n * nbytes / b_node,
            messages * 2 * log_n * a_out + 2 * nbytes / b_node,
        )
        inside = messages * 2 * (r - 1) * a_in + 2 * (r - 1) / r * nbytes / b_in
        costs = {"ring": ring, "tree": tree, "hierarchical": inside + across}
        return {k: v for k, v in costs.items() if k in self.algorithms} or costs

    def time(self, nbytes: float, p: int, messages: int = 1) -> float:
        """The cheapest candidate (the stated rule: a tuned library picks the fastest)."""
        return min(self.candidates(nbytes, p, messages).values())

    def algorithm(self, nbytes: float, p: int, messages: int = 1) -> str:
        costs = self.candidates(nbytes, p, messages)
        return min(costs, key=lambda k: costs[k])

    def shifted(self, parameter: str) -> Hierarchy:
        return replace(self, intra=self.intra.shifted(parameter), inter=self.inter.shifted(parameter))


Cost = Comm | Hierarchy
"""The cost of one collective: ``time(nbytes, p, messages)``, ``algorithm(...)`` (the one
chosen) and ``shifted(parameter)`` (α or β moved by its standard error)."""
