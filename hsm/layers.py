"""Output layers with one interface: the tree (hierarchical) softmax and the flat softmax.

Both mirror :class:`torch.nn.AdaptiveLogSoftmaxWithLoss`, so one can stand in for another:

* ``forward(input, target)`` -> ``HSMOutput(output, loss)``: ``output[b] = log p(target[b] | input[b])``
  and ``loss`` the mean negative log-likelihood;
* ``log_prob(input)`` -> ``[B, K]`` log-probabilities of every label (rows sum to one in probability);
* ``predict(input)`` -> ``[B]`` the most likely label (exact);
* ``topk(input, k)`` -> ``TopK(values, indices, nodes_visited)``.

The hierarchical softmax (eq. 5, and eq. 11 for the log-bilinear model) factors
``p(y | h) = prod_d softmax(W_n h + b_n)[c_d]`` over the nodes ``n`` on the path of ``y``, each
node a softmax over its M children (a sigmoid when M = 2 is the same thing). All node parameters
sit in one tensor, gathered per batch, so a training step touches ``B * L * M * d`` numbers
instead of the flat softmax's ``K * d``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .tree import Tree

__all__ = ["FlatSoftmax", "HierarchicalSoftmax", "HSMOutput", "TopK"]


class HSMOutput(NamedTuple):
    """Like torch's ``_ASMoutput``: log-likelihood of each target and the mean NLL."""

    output: Tensor
    loss: Tensor


class TopK(NamedTuple):
    values: Tensor  #: [B, k] log-probabilities, best first
    indices: Tensor  #: [B, k] labels
    nodes_visited: Tensor  #: [B] internal nodes evaluated per example (K for the flat softmax)


def _check_input(input: Tensor, in_features: int) -> None:
    if not isinstance(input, Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() != 2 or input.shape[1] != in_features:
        raise ValueError(f"input must have shape [B, {in_features}], got {list(input.shape)}")


def _check_target(target: Tensor, batch: int, num_labels: int) -> None:
    if not isinstance(target, Tensor) or target.dtype not in (torch.int64, torch.int32):
        raise TypeError("target must be an integer tensor of label ids")
    if target.shape != (batch,):
        raise ValueError(f"target must have shape [{batch}] to match input, got {list(target.shape)}")
    if batch and (int(target.min()) < 0 or int(target.max()) >= num_labels):
        bad = target[(target < 0) | (target >= num_labels)][0].item()
        raise ValueError(f"unknown label {bad}: labels are 0..{num_labels - 1}")


def _merge_topk(best_v: Tensor, best_i: Tensor, ex: Tensor, labels: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Merge candidate (example, label, value) triples into per-example top-k lists (no duplicates)."""
    batch, k = best_v.shape
    if ex.numel() == 0:
        return best_v, best_i
    all_e = torch.cat([torch.arange(batch, device=ex.device).repeat_interleave(k), ex])
    all_v = torch.cat([best_v.reshape(-1), values])
    all_i = torch.cat([best_i.reshape(-1), labels])
    real = all_i >= 0
    all_e, all_v, all_i = all_e[real], all_v[real], all_i[real]
    # drop a label found twice for the same example (keep its best value)
    order = torch.argsort(all_v, descending=True, stable=True)
    all_e, all_v, all_i = all_e[order], all_v[order], all_i[order]
    key = all_e * (int(all_i.max()) + 1) + all_i
    key_sorted, key_order = torch.sort(key, stable=True)
    first = torch.ones_like(key_sorted, dtype=torch.bool)
    first[1:] = key_sorted[1:] != key_sorted[:-1]
    keep = key_order[first].sort().values
    all_e, all_v, all_i = all_e[keep], all_v[keep], all_i[keep]
    # group by example (stable: values stay in decreasing order), rank within the example
    order = torch.argsort(all_e, stable=True)
    all_e, all_v, all_i = all_e[order], all_v[order], all_i[order]
    counts = torch.bincount(all_e, minlength=batch)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(all_e.numel(), device=ex.device) - starts[all_e]
    sel = rank < k
    new_v = torch.full_like(best_v, -math.inf)
    new_i = torch.full_like(best_i, -1)
    new_v[all_e[sel], rank[sel]] = all_v[sel]
    new_i[all_e[sel], rank[sel]] = all_i[sel]
    return new_v, new_i


class HierarchicalSoftmax(nn.Module):
    """Tree softmax over ``tree.num_labels`` labels (eq. 5 / 11).

    Parameters
    ----------
    in_features: d, the size of the representation ``h = f(x)``.
    tree: the label tree (:class:`hsm.Tree`).
    bias: learn a bias per child slot.
    sparse: node parameters get sparse gradients (``torch.optim.SGD``, ``Adagrad`` and
        ``SparseAdam`` accept them): a step then costs O(B L M d), not O(N M d).

    Shape: ``input`` [B, d], ``target`` [B] -> ``output`` [B], ``loss`` [].

    Node parameters when the tree changes (:meth:`set_tree`): every node keeps its parameters
    (node ids are positions: Algorithm 3 never moves them, and Algorithm 2 reuses ids in place);
    nodes named in ``reset_nodes`` (new positions) are re-initialised, as the thesis does for a
    new node (its Fig. 3.6 h).
    """

    def __init__(self, in_features: int, tree: Tree, bias: bool = True, sparse: bool = False) -> None:
        super().__init__()
        if in_features < 1:
            raise ValueError(f"in_features must be >= 1, got {in_features}")
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be an hsm.Tree, got {type(tree).__name__}")
        self.in_features = in_features
        self.arity = tree.arity
        self.num_nodes = tree.num_nodes
        self.sparse = sparse
        self.weight = nn.Parameter(torch.empty(tree.num_nodes, tree.arity * in_features))
        self.bias = nn.Parameter(torch.zeros(tree.num_nodes, tree.arity)) if bias else None
        self.statistics = None  # a NodeStatistics, attached by TreeLearner (Algorithm 1)
        self.reset_parameters()
        self.tree: Tree
        self.set_tree(tree)

    @property
    def num_labels(self) -> int:
        return self.tree.num_labels

    def reset_parameters(self, nodes: Tensor | np.ndarray | None = None) -> None:
        """Uniform(-1/sqrt(d), 1/sqrt(d)) weights and zero biases, like ``nn.Linear``; all nodes
        or only ``nodes``."""
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            if nodes is None:
                self.weight.uniform_(-bound, bound)
                if self.bias is not None:
                    self.bias.zero_()
            else:
                rows = torch.as_tensor(np.asarray(nodes), dtype=torch.long, device=self.weight.device)
                self.weight[rows] = torch.empty_like(self.weight[rows]).uniform_(-bound, bound)
                if self.bias is not None:
                    self.bias[rows] = 0.0

    def set_tree(self, tree: Tree, reset_nodes: Tensor | np.ndarray | None = None) -> None:
        """Switch to another tree over the same labels and nodes (after a re-assignment)."""
        if tree.arity != self.arity or tree.num_nodes != self.num_nodes:
            raise ValueError(
                f"the new tree has M={tree.arity}, N={tree.num_nodes}; the layer was built for "
                f"M={self.arity}, N={self.num_nodes}"
            )
        if hasattr(self, "tree") and tree.num_labels != self.tree.num_labels:
            raise ValueError(f"the new tree has {tree.num_labels} labels, the layer {self.tree.num_labels}")
        device = self.weight.device
        self.tree = tree
        as_t = lambda a: torch.as_tensor(np.ascontiguousarray(a), device=device)  # noqa: E731
        # buffers are not persistent: the tree is saved as JSON beside the state dict
        self.register_buffer("path_nodes", as_t(tree.path_nodes), persistent=False)
        self.register_buffer("path_children", as_t(tree.path_children), persistent=False)
        self.register_buffer("path_mask", as_t(tree.path_mask), persistent=False)
        self.register_buffer("slot_mask", as_t(tree.slot_mask), persistent=False)
        self.register_buffer("child_node", as_t(tree.child_node), persistent=False)
        self.register_buffer("child_label", as_t(tree.child_label), persistent=False)
        if reset_nodes is not None and len(reset_nodes):
            self.reset_parameters(reset_nodes)

    # ------------------------------------------------------------------ node computations
    def _node_logits(self, input: Tensor, nodes: Tensor) -> Tensor:
        """Logits of ``nodes`` [...] for rows of ``input``: [..., M] (masked slots at -inf)."""
        shape = nodes.shape
        flat = nodes.reshape(shape[0], -1)  # [B, L]
        weight = F.embedding(flat, self.weight, sparse=self.sparse)  # [B, L, M*d]
        weight = weight.view(flat.shape[0], flat.shape[1], self.arity, self.in_features)
        logits = torch.einsum("bd,blmd->blm", input, weight)
        if self.bias is not None:
            logits = logits + F.embedding(flat, self.bias, sparse=self.sparse)
        logits = logits.masked_fill(~self.slot_mask[flat], -math.inf)
        return logits.view(*shape, self.arity)

    def forward(self, input: Tensor, target: Tensor) -> HSMOutput:
        """Eq. 5: sum over the path of ``log softmax(W_n h + b_n)[c_d]``."""
        _check_input(input, self.in_features)
        _check_target(target, input.shape[0], self.num_labels)
        nodes = self.path_nodes[target]  # [B, L]
        children = self.path_children[target]
        mask = self.path_mask[target]
        log_probs = torch.log_softmax(self._node_logits(input, nodes), dim=-1)  # [B, L, M]
        picked = log_probs.gather(-1, children.unsqueeze(-1)).squeeze(-1)
        output = torch.where(mask, picked, torch.zeros_like(picked)).sum(dim=1)
        if self.statistics is not None and self.training:
            self.statistics.accumulate(target, log_probs.detach().exp(), mask)
        return HSMOutput(output, -output.mean())

    def log_prob(self, input: Tensor, batch_chunk: int = 256) -> Tensor:
        """Log-probabilities of all K labels, [B, K] (every node evaluated: O(N M d) per row)."""
        _check_input(input, self.in_features)
        num_labels = self.num_labels
        index = (self.path_nodes[:num_labels] * self.arity + self.path_children[:num_labels])  # [K, L]
        mask = self.path_mask[:num_labels]
        weight = self.weight.view(self.num_nodes * self.arity, self.in_features)
        rows = []
        for chunk in input.split(batch_chunk):
            logits = (chunk @ weight.t()).view(-1, self.num_nodes, self.arity)
            if self.bias is not None:
                logits = logits + self.bias
            logits = logits.masked_fill(~self.slot_mask, -math.inf)
            node_lp = torch.log_softmax(logits, dim=-1).reshape(chunk.shape[0], -1)
            per_step = node_lp[:, index]  # [b, K, L]
            rows.append(torch.where(mask, per_step, torch.zeros_like(per_step)).sum(-1))
        return torch.cat(rows)

    @torch.no_grad()
    def predict(self, input: Tensor) -> Tensor:
        """The most likely label of each row, exact (branch and bound, :meth:`topk`)."""
        return self.topk(input, 1).indices[:, 0]

    @torch.no_grad()
    def topk(self, input: Tensor, k: int = 1, method: str = "exact", beam: int | None = None) -> TopK:
        """The k most likely labels.

        ``method="exact"``: branch and bound (ICML §11.1, fastText's search): a beam search of
        width k gives k labels and a bound; then the tree is explored level by level, keeping a
        node only while its path log-probability is above the current k-th best label, which is
        exact because a node's path probability bounds every label below it.
        ``method="beam"``: beam search of width ``beam`` (default k), approximate.
        """
        _check_input(input, self.in_features)
        if k < 1 or k > self.num_labels:
            raise ValueError(f"k must be in 1..{self.num_labels}, got {k}")
        if method not in ("exact", "beam"):
            raise ValueError(f"method must be 'exact' or 'beam', got {method!r}")
        values, indices, visited = self._beam_search(input, k, max(beam or k, k))
        if method == "beam":
            return TopK(values, indices, visited)
        batch = input.shape[0]
        ex = torch.arange(batch, device=input.device)
        node = torch.zeros(batch, dtype=torch.long, device=input.device)
        score = torch.zeros(batch, dtype=input.dtype, device=input.device)
        while ex.numel():
            visited += torch.bincount(ex, minlength=batch)
            cand, kids, labs, leaf, inner = self._expand(input, ex, node, score)
            ex_rep = ex[:, None].expand_as(cand)
            take = leaf & (cand > values[ex, -1][:, None])
            values, indices = _merge_topk(values, indices, ex_rep[take], labs[take], cand[take])
            keep = inner & (cand > values[ex, -1][:, None])
            ex, node, score = ex_rep[keep], kids[keep], cand[keep]
        return TopK(values, indices, visited)

    def _expand(self, input: Tensor, ex: Tensor, node: Tensor, score: Tensor):
        logits = self._node_logits(input[ex], node[:, None])[:, 0]
        cand = score[:, None] + torch.log_softmax(logits, dim=-1)
        kids, labs, usable = self.child_node[node], self.child_label[node], self.slot_mask[node]
        leaf = (labs >= 0) & usable
        inner = (kids >= 0) & usable
        return cand, kids, labs, leaf, inner

    def _beam_search(self, input: Tensor, k: int, beam: int) -> tuple[Tensor, Tensor, Tensor]:
        batch = input.shape[0]
        device = input.device
        values = torch.full((batch, k), -math.inf, dtype=input.dtype, device=device)
        indices = torch.full((batch, k), -1, dtype=torch.long, device=device)
        visited = torch.zeros(batch, dtype=torch.long, device=device)
        ex = torch.arange(batch, device=device)
        node = torch.zeros(batch, dtype=torch.long, device=device)
        score = torch.zeros(batch, dtype=input.dtype, device=device)
        while ex.numel():
            visited += torch.bincount(ex, minlength=batch)
            cand, kids, labs, leaf, inner = self._expand(input, ex, node, score)
            ex_rep = ex[:, None].expand_as(cand)
            values, indices = _merge_topk(values, indices, ex_rep[leaf], labs[leaf], cand[leaf])
            e, n, s = ex_rep[inner], kids[inner], cand[inner]
            if e.numel() == 0:
                break
            order = torch.argsort(s, descending=True, stable=True)
            e, n, s = e[order], n[order], s[order]
            order = torch.argsort(e, stable=True)
            e, n, s = e[order], n[order], s[order]
            counts = torch.bincount(e, minlength=batch)
            rank = torch.arange(e.numel(), device=device) - (torch.cumsum(counts, 0) - counts)[e]
            sel = rank < beam
            ex, node, score = e[sel], n[sel], s[sel]
        return values, indices, visited

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, {self.tree!r}, sparse={self.sparse}"


class FlatSoftmax(nn.Module):
    """The flat softmax ``softmax(W h + b)`` over K labels, with the same interface (the baseline
    the tree is measured against: O(K d) per example)."""

    def __init__(self, in_features: int, num_labels: int, bias: bool = True) -> None:
        super().__init__()
        if num_labels < 2:
            raise ValueError(f"num_labels K must be >= 2, got {num_labels}")
        self.in_features = in_features
        self._num_labels = num_labels
        self.linear = nn.Linear(in_features, num_labels, bias=bias)

    @property
    def num_labels(self) -> int:
        return self._num_labels

    def forward(self, input: Tensor, target: Tensor) -> HSMOutput:
        _check_input(input, self.in_features)
        _check_target(target, input.shape[0], self.num_labels)
        log_probs = torch.log_softmax(self.linear(input), dim=-1)
        output = log_probs.gather(1, target[:, None]).squeeze(1)
        return HSMOutput(output, -output.mean())

    def log_prob(self, input: Tensor) -> Tensor:
        _check_input(input, self.in_features)
        return torch.log_softmax(self.linear(input), dim=-1)

    @torch.no_grad()
    def predict(self, input: Tensor) -> Tensor:
        _check_input(input, self.in_features)
        return self.linear(input).argmax(dim=-1)

    @torch.no_grad()
    def topk(self, input: Tensor, k: int = 1, method: str = "exact", beam: int | None = None) -> TopK:
        values, indices = self.log_prob(input).topk(k, dim=-1)
        visited = torch.full((input.shape[0],), self.num_labels, dtype=torch.long, device=input.device)
        return TopK(values, indices, visited)
