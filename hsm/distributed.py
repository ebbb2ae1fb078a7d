"""Algorithm 1 under ``torch.distributed``: every rank learns the same tree.

Data-parallel training splits each global batch over ``world_size`` ranks. Gradients are averaged
as usual, but Algorithm 1 has a second piece of state that depends on the data: the node
statistics (SumProbas / Counts, :class:`hsm.NodeStatistics`), from which AssignLabels rebuilds the
tree. If every rank re-assigned from its own shard's statistics, the ranks would build different
trees and the model would silently fork. :class:`DistributedTreeLearner` therefore sums the
statistics collected since the last re-assignment over all ranks before each AssignLabels call, so
every rank runs Algorithm 3 (or 2) on the statistics of the *global* batch stream, exactly what a
single process seeing the same data would have; it then checks that the ranks agree on the new
tree (a checksum all-reduce) and, for Algorithm 2, broadcasts the parameters of re-initialised
nodes from rank 0.

The tree softmax's node gradients are sparse (``sparse=True``), which ``DistributedDataParallel``
does not all-reduce with NCCL. The pattern used here (and tested with gloo on CPU):

* wrap the representation ``f(x)`` in ``DistributedDataParallel`` as usual;
* keep the :class:`hsm.HierarchicalSoftmax` outside DDP and call
  :func:`average_gradients` on it after ``backward()``: row-sparse gradients are all-gathered
  (only the touched rows travel: B L M d numbers per rank, not N M d) and dense ones all-reduced;
* call ``learner.step()`` after ``optimizer.step()`` as in the single-process loop.

Launch (one process per GPU; ``--nnodes``/``--rdzv-endpoint`` for several machines)::

    torchrun --nproc-per-node 8 train.py            # one machine, 8 GPUs (backend "nccl")
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:29500 train.py     # two machines

with, in ``train.py``::

    dist.init_process_group("nccl")                 # "gloo" on CPU
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = DistributedDataParallel(encoder.cuda())  # the representation
    layer = HierarchicalSoftmax(d, tree, sparse=True).cuda()
    broadcast_parameters(layer)                      # same initial node parameters everywhere
    learner = DistributedTreeLearner(layer, reassign_every=...)
    for x, y in shard_of_each_global_batch:
        loss = layer(model(x), y).loss
        optimizer.zero_grad(); loss.backward()
        average_gradients(layer)
        optimizer.step(); learner.step()

Only the CPU/gloo path is tested (the tests run without a GPU); the NCCL path uses the same
collectives (all_gather, all_reduce, broadcast) on CUDA tensors.
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from .assign import Reassignment
from .layers import HierarchicalSoftmax
from .training import TreeLearner

__all__ = ["DistributedTreeLearner", "average_gradients", "broadcast_parameters", "tree_checksum"]


def _world(group: Any = None) -> int:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call dist.init_process_group(...) first")
    return dist.get_world_size(group)


def tree_checksum(tree) -> int:
    """A 62-bit fingerprint of a tree's structure (which label sits where)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(np.ascontiguousarray(tree.child_node).tobytes())
    digest.update(np.ascontiguousarray(tree.child_label).tobytes())
    return int.from_bytes(digest.digest(), "little") >> 2


def broadcast_parameters(module: nn.Module, src: int = 0, group: Any = None) -> None:
    """Copy ``src``'s parameters to every rank (DDP does this for the modules it wraps)."""
    _world(group)
    with torch.no_grad():
        for param in module.parameters():
            dist.broadcast(param.data, src, group=group)


def average_gradients(module: nn.Module, group: Any = None) -> None:
    """Average the gradients of ``module``'s parameters over the ranks, as DDP would.

    Sparse (COO, row-sparse) gradients are all-gathered: every rank sends its touched rows and
    their indices (padded to the largest count), and the result is the sum over ranks divided by
    the world size, coalesced. Dense gradients are all-reduced. A parameter without a gradient on
    some rank counts as zero there (its gradient becomes defined on every rank)."""
    world = _world(group)
    for param in module.parameters():
        grad = param.grad
        has = torch.tensor([0 if grad is None else (2 if grad.is_sparse else 1)], device=param.device)
        kinds = [torch.zeros_like(has) for _ in range(world)]
        dist.all_gather(kinds, has, group=group)
        kinds_set = {int(k) for k in kinds}
        if kinds_set == {0}:
            continue
        if 2 in kinds_set:
            if grad is None:
                grad = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long, device=param.device),
                                               param.new_zeros((0,) + param.shape[1:]), param.shape)
            elif not grad.is_sparse:
                grad = grad.to_sparse(1)
            param.grad = _all_gather_sparse(grad, world, group) / world
        else:
            if grad is None:
                grad = torch.zeros_like(param)
            dist.all_reduce(grad, group=group)
            param.grad = grad.div_(world)


def _all_gather_sparse(grad: torch.Tensor, world: int, group: Any) -> torch.Tensor:
    grad = grad.coalesce() if not grad.is_coalesced() else grad
    indices, values = grad.indices()[0], grad.values()
    count = torch.tensor([indices.numel()], device=values.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    width = int(max(int(c) for c in counts))
    padded_i = indices.new_zeros(width)
    padded_v = values.new_zeros((width,) + values.shape[1:])
    padded_i[: indices.numel()] = indices
    padded_v[: indices.numel()] = values
    all_i = [torch.empty_like(padded_i) for _ in range(world)]
    all_v = [torch.empty_like(padded_v) for _ in range(world)]
    dist.all_gather(all_i, padded_i, group=group)
    dist.all_gather(all_v, padded_v, group=group)
    rows = torch.cat([i[: int(c)] for i, c in zip(all_i, counts)])
    vals = torch.cat([v[: int(c)] for v, c in zip(all_v, counts)])
    return torch.sparse_coo_tensor(rows.unsqueeze(0), vals, grad.shape).coalesce()


class DistributedTreeLearner(TreeLearner):
    """:class:`hsm.TreeLearner` (Algorithm 1) for data-parallel training.

    Each rank collects node statistics from its own shard during the forward pass; before every
    AssignLabels call the statistics gathered since the previous one are summed over the ranks
    (the decayed statistics from before are already identical everywhere), then rank 0's sums are
    broadcast so every rank holds bit-identical inputs; every rank then runs the same
    deterministic re-assignment. A checksum all-reduce verifies that the ranks built the same tree
    (``RuntimeError`` otherwise), and nodes that Algorithm 2 re-initialises get rank 0's fresh
    parameters. Same arguments as :class:`hsm.TreeLearner`, plus ``group`` (default: the world).
    """

    _synchronises_ranks = True  # the plain TreeLearner refuses a group of several processes

    def __init__(self, layer: HierarchicalSoftmax, reassign_every: int, group: Any = None, **kwargs: Any) -> None:
        super().__init__(layer, reassign_every, **kwargs)
        self.group = group
        self.world_size = _world(group)
        self._check_ranks_agree()
        self._synced = self._snapshot()

    def _check_ranks_agree(self) -> None:
        """One all-reduce: every rank must start from the same tree with the same label count, or
        the first re-assignment would sum statistics of different shapes (an abort inside the
        backend) or build different trees; a frozen learner would never notice. ValueError on
        every rank otherwise (they all see the same reduced values, so none is left waiting)."""
        tree = self.layer.tree
        checksum, labels = tree_checksum(tree), tree.num_labels
        mine = torch.tensor([checksum, -checksum, labels, -labels], dtype=torch.int64, device=self.layer.weight.device)
        seen = mine.clone()
        dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=self.group)
        if seen[2].item() != -seen[3].item():
            raise ValueError(f"the ranks' layers have different label counts (K = {labels} here, from "
                             f"{-seen[3].item()} to {seen[2].item()} over the ranks): every rank must build the "
                             f"layer for the same labels")
        if seen[0].item() != -seen[1].item():
            raise ValueError(f"the ranks' layers hold different trees of K = {labels} labels: build the tree with the "
                             f"same seed on every rank (or load rank 0's state dict everywhere) before the learner")

    def _ranks_agree(self, value: int) -> bool:
        """Whether ``value`` is the same on every rank (the max of it and of its negation)."""
        check = torch.tensor([value, -value], dtype=torch.int64, device=self.layer.weight.device)
        dist.all_reduce(check, op=dist.ReduceOp.MAX, group=self.group)
        return check[0].item() == -check[1].item()

    def add_labels(self, examples: Any, label_names: Any = None, placement: str = "objective", seed: int = 0,
                   local_steps: int = 0, local_lr: float = 0.1) -> Any:
        """:meth:`hsm.TreeLearner.add_labels` on every rank: call it on every rank with the same
        examples. The statistics are first summed over the ranks (so that every rank places the
        labels from the same global statistics), the ranks then check they built the same grown
        tree (RuntimeError naming the cause otherwise), and rank 0's parameters are copied to every
        rank; re-assignments then go on over the grown tree."""
        self.synchronize_statistics()
        result = super().add_labels(examples, label_names=label_names, placement=placement, seed=seed,
                                    local_steps=local_steps, local_lr=local_lr)
        if not self._ranks_agree(tree_checksum(result.tree)):
            raise RuntimeError("the ranks placed the new labels differently: call add_labels on every rank with the "
                               "same examples, names and seed")
        broadcast_parameters(self.layer, group=self.group)
        self._synced = self._snapshot()  # the grown statistics, synchronised above
        return result

    def _snapshot(self) -> dict[str, torch.Tensor]:
        stats = self.statistics
        names = ("sum_probas", "path_counts", "label_counts", "stat_node")
        return {name: getattr(stats, name).clone() for name in names}

    def _follow_tree(self) -> None:
        """Map the last synchronised statistics onto the statistics' current layout.

        Loading a tree into the layer (``layer.load_state_dict``) makes the statistics follow it
        (:meth:`NodeStatistics.on_reassign` without decay: entries whose node changed are zeroed,
        the depth axis may grow or shrink). The snapshot must follow the same way, or the next
        synchronisation would take ``current - snapshot`` across two layouts and sum nonsense.
        """
        stats = self.statistics
        old_nodes, new_nodes = self._synced["stat_node"], stats.stat_node
        if old_nodes.shape == new_nodes.shape and torch.equal(old_nodes, new_nodes):
            return
        width = min(old_nodes.shape[1], new_nodes.shape[1])
        padded = torch.full_like(new_nodes, -3)  # -3: no node, as on_reassign pads
        padded[:, :width] = old_nodes[:, :width]
        changed = padded != new_nodes
        for name in ("sum_probas", "path_counts"):
            followed = torch.zeros_like(getattr(stats, name))
            followed[:, :width] = self._synced[name][:, :width]
            followed[changed] = 0.0
            self._synced[name] = followed
        self._synced["stat_node"] = new_nodes.clone()

    def synchronize_statistics(self) -> None:
        """Sum, over ranks, what each rank collected since the last synchronisation."""
        stats = self.statistics
        self._follow_tree()
        for name, before in self._synced.items():
            if name == "stat_node":
                continue
            current = getattr(stats, name)
            delta = current - before
            dist.all_reduce(delta, group=self.group)
            total = before + delta
            dist.broadcast(total, 0, group=self.group)  # bit-identical on every rank
            current.copy_(total)

    def reassign(self) -> Reassignment:
        self.synchronize_statistics()
        result = super().reassign()
        if not self._ranks_agree(tree_checksum(result.tree)):
            raise RuntimeError("ranks built different trees at re-assignment: their statistics differ "
                               "(did every rank call learner.step() the same number of times?)")
        if len(result.moved_nodes) and self.reset_moved_nodes:
            rows = torch.as_tensor(result.moved_nodes, device=self.layer.weight.device)
            with torch.no_grad():
                for param in (self.layer.weight, self.layer.bias):
                    if param is None:
                        continue
                    fresh = param[rows].contiguous()
                    dist.broadcast(fresh, 0, group=self.group)
                    param[rows] = fresh
        self._synced = self._snapshot()  # after on_reassign: the decayed global statistics
        return result

    def load_state_dict_statistics(self, state: dict[str, Any]) -> None:
        """Load statistics (e.g. from a checkpoint written by rank 0) and mark them synchronised."""
        self.statistics.load_state_dict(state)
        self._synced = self._snapshot()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """:meth:`TreeLearner.load_state_dict` (e.g. every rank loading rank 0's checkpoint); the
        loaded statistics count as synchronised."""
        super().load_state_dict(state)
        self._synced = self._snapshot()
