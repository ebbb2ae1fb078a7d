"""Output layers with one interface: the tree (hierarchical) softmax and the flat softmax.

Both mirror :class:`torch.nn.AdaptiveLogSoftmaxWithLoss`, so one can stand in for another:

* ``forward(input [B, d], target [B])`` -> ``HSMOutput(output [B], loss [])``:
  ``output[b] = log p(target[b] | input[b])`` and ``loss`` the mean negative log-likelihood;
* ``log_prob(input [B, d])`` -> ``[B, K]`` log-probabilities of every label (rows sum to one in probability);
* ``predict(input [B, d])`` -> ``[B]`` the most likely label (exact);
* ``topk(input [B, d], k)`` -> ``TopK(values [B, k], indices [B, k], nodes_visited [B])``.

Beyond that interface, as ``F.cross_entropy``: inputs ``[..., d]`` with targets ``[...]`` (a
sequence model's ``[B, T, d]`` and ``[B, T]``), ``ignore_index`` (padding) and ``reduction``
(:mod:`hsm._loss_options`).

The hierarchical softmax (ICML eq. 5, and eq. 11 for the log-bilinear model) factors
``p(y | h) = prod_d softmax(W_n h + b_n)[c_d]`` over the nodes ``n`` on the path of ``y``, each
node a softmax over its M children (a sigmoid when M = 2 is the same thing). All node parameters
sit in one tensor, gathered per batch, so a training step touches ``B * L * M * d`` numbers
instead of the flat softmax's ``K * d``.

This module says what is computed; how it is computed fast lives elsewhere: the batch's pairs
grouped by node, the custom autograd functions and the compiled kernels in :mod:`hsm.backend`, the
searches of :meth:`HierarchicalSoftmax.predict` / :meth:`~HierarchicalSoftmax.topk` in
:mod:`hsm.search`, the row-sparse optimisers in :mod:`hsm.optim` (re-exported here, as are the
input checks of :mod:`hsm._checks`, for code that imports them from this module).
"""
from __future__ import annotations

import functools
import math
import sys
import threading
import warnings
import zlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import backend, engine as static_engine, label_addition, search
from ._checks import (NonFiniteInputError, check_choice, check_input, check_logits_finite, check_k, check_target,
                      check_target_shape)
from ._loss_options import check_loss_options, forward_rows, over_leading_dims
from .backend import EmptyBatch, NodeDistributions, TreeTables, in_compute_dtype
from .tree import Tree, check_integer

__all__ = ["FlatSoftmax", "HierarchicalSoftmax", "HSMOutput", "NonFiniteInputError", "TopK"]


class HSMOutput(NamedTuple):
    """Like torch's ``_ASMoutput``: log-likelihood of each target and the mean NLL."""

    output: Tensor
    loss: Tensor


class TopK(NamedTuple):
    """What ``topk`` returns: the k most likely labels of each row and the search's cost."""

    values: Tensor  #: [B, k] log-probabilities, best first
    indices: Tensor  #: [B, k] labels
    nodes_visited: Tensor  #: [B] internal nodes evaluated per example (K for the flat softmax)


# ------------------------------------------------------------------ torch.compile and torch.autocast
#
# torch.compile: the layer plans every batch on the host from the *values* of the targets (numpy
# and the compiled kernels of hsm.kernels), reads a sum back to refuse NaN rows, and hands its
# node distributions to Algorithm 1's statistics: data-dependent host work that Dynamo cannot
# trace (it stops inside numba's dispatcher). So the entry points run outside compilation
# (``torch.compiler.disable``): ``torch.compile(model)`` compiles the model around the layer, breaks
# the graph at the layer's call, and the layer runs its eager fast path unchanged (kernels, sparse
# gradients, statistics); autograd joins the compiled parts and the layer. Opaque custom ops
# (``torch.library.custom_op``) were the alternative: they need fake implementations whose output
# sizes depend on the targets' paths, the statistics would become a side channel, and the speed
# would not change (the layer's work is one kernel call either way).
#
# torch.autocast: as autocast does for losses (``nll_loss``, ``log_softmax`` run in float32), an
# input in the autocast dtype (bf16 from the encoder's matmuls) is converted to the layer's dtype
# and the layer runs with autocast off: log-likelihoods, gradients and statistics in float32. A
# deep path sums L log-probabilities whose differences bf16's 8-bit mantissa would blur.


def _layer_entry(method: Callable) -> Callable:
    """Wrap an entry point (``forward``, ``log_prob``, ``predict``, ``topk``) of an output layer
    for ``torch.compile`` and ``torch.autocast`` (the comment above says why): run outside Dynamo,
    and under autocast compute in the layer's dtype with autocast off
    (:func:`hsm.backend.in_compute_dtype`)."""
    compute = in_compute_dtype(lambda layer: layer._compute_dtype())(method)
    outside = torch.compiler.disable(compute)

    @functools.wraps(method)
    def entry(layer: Any, *args: Any, **kwargs: Any) -> Any:
        # the static engine (hsm.engine) reads nothing back from the device: Dynamo traces it
        if method.__name__ == "forward" and getattr(layer, "_static_engine", lambda: False)():
            return compute(layer, *args, **kwargs)
        return outside(layer, *args, **kwargs)

    return entry


# ------------------------------------------------------------------ the tree in the state dict
#
# A learned tree is as much part of the model as the node parameters (the parameters of node n
# mean nothing under another tree), so ``state_dict()`` carries it, as torch's "extra state"
# (key ``<prefix>_extra_state``): one 1-D int64 tensor, ``[header, child_node, child_label]``,
# 2 N M + 9 integers (4.5 MB at K = 250k, M = 65, beside the weights' 223 MB at d = 200). A
# tensor rather than a dict: ``torch.load(weights_only=True)`` takes it, and so does code that
# maps every entry of a state dict through ``.double()`` / ``.to(...)`` (the header's small
# numbers survive a cast to float64, or to float32 below 2**24; a checksum says whether they did).

#: the header of the tree in a state dict: magic, version, K, N, M, depth limit (-1: none),
#: in_features, checksum (two 16-bit halves: every header entry stays exact in float32)
_TREE_MAGIC, _TREE_VERSION, _TREE_HEADER = 1447, 1, 9  # a magic below 2048 survives even a float16 cast


def _caller_outside_torch() -> int:
    """The ``stacklevel`` for a warning raised in a module hook that points at the user's
    ``load_state_dict`` call, however deep the module sits (torch recurses through its children)."""
    # frame k above this one is stacklevel k of a warning raised by its caller (the hook)
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == nn.modules.module.__file__:
        frame, level = frame.f_back, level + 1
    return level


def _tree_checksum(header: np.ndarray, body: np.ndarray) -> int:
    """CRC-32 of the header (checksum slots excluded) and the body, as int64 bytes."""
    return zlib.crc32(body.tobytes(), zlib.crc32(np.ascontiguousarray(header[:7], dtype=np.int64).tobytes()))


def _encode_tree(tree: Tree, in_features: int) -> Tensor:
    """The tree as the 1-D int64 tensor ``[header, child_node, child_label]`` (:func:`_decode_tree`)."""
    body = np.concatenate([tree.child_node.ravel(), tree.child_label.ravel()]).astype(np.int64)
    header = np.array([_TREE_MAGIC, _TREE_VERSION, tree.num_labels, tree.num_nodes, tree.arity,
                       -1 if tree.depth_limit is None else tree.depth_limit, in_features, 0, 0],
                      dtype=np.int64)
    crc = _tree_checksum(header, body)
    header[-2:] = crc >> 16, crc & 0xFFFF
    return torch.from_numpy(np.concatenate([header, body]))


def _decode_tree(state: Any, layer: "HierarchicalSoftmax") -> Tree:
    """Decode :func:`_encode_tree`'s tensor for ``layer``; ValueError when it is not one, is damaged,
    or describes a layer of another shape (both shapes named)."""
    if not isinstance(state, Tensor) or state.dim() != 1 or state.numel() < _TREE_HEADER:
        raise ValueError("not the tree of an hsm.HierarchicalSoftmax (expected the 1-D tensor that "
                         f"HierarchicalSoftmax.state_dict() writes, got {type(state).__name__})")
    values = state.detach().cpu()
    cast = values.dtype if values.is_floating_point() else None
    if cast is not None:  # a state dict cast entry by entry: the checksum says if it survived
        values = values.double().round()
    values = values.to(torch.int64).numpy()
    header, body = values[:_TREE_HEADER], values[_TREE_HEADER:]
    # bfloat16 keeps 8 bits of mantissa: even the magic number is rounded (to what such a cast makes of it)
    rounded_magic = cast is not None and header[0] == int(torch.tensor(float(_TREE_MAGIC)).to(cast).double())
    if header[0] != _TREE_MAGIC and rounded_magic:
        raise ValueError(f"the tree in the state dict is damaged: it was cast to {str(cast).replace('torch.', '')}, "
                         f"which rounds its integers; cast the layer's parameters, not the whole state dict")
    if header[0] != _TREE_MAGIC or header[1] != _TREE_VERSION:
        raise ValueError(f"not the tree of an hsm.HierarchicalSoftmax (format {header[:2].tolist()}, expected "
                         f"{[_TREE_MAGIC, _TREE_VERSION]})")
    num_labels, num_nodes, arity, depth, in_features = (int(v) for v in header[2:7])
    crc = (int(header[7]) << 16) | int(header[8])
    if num_nodes < 1 or arity < 2 or body.size != 2 * num_nodes * arity or _tree_checksum(header, body) != crc:
        raise ValueError("the tree in the state dict is damaged (its checksum does not match): was the state "
                         "dict cast to a low-precision dtype, or edited?")
    saved = f"K={num_labels}, M={arity}, N={num_nodes}, in_features={in_features}"
    mine = f"K={layer.num_labels}, M={layer.arity}, N={layer.num_nodes}, in_features={layer.in_features}"
    if saved != mine:
        raise ValueError(f"the state dict holds a layer with {saved}; this layer has {mine}: build the layer "
                         "on a tree of the saved shape (any such tree: the saved one replaces it)")
    size = num_nodes * arity
    # label names name label ids, which no tree change renumbers: they are not saved, and the
    # loaded tree keeps this layer's
    names = layer.tree.label_names
    return Tree(body[:size].reshape(num_nodes, arity), body[size:].reshape(num_nodes, arity), num_labels,
                depth_limit=None if depth < 0 else depth, label_names=names)



class _TreeInStateDict:
    """The state-dict hooks of :class:`HierarchicalSoftmax`: the tree travels with the node
    parameters (their meaning depends on it), encoded by :func:`_encode_tree`. Mixed into the layer,
    whose ``tree``, ``set_tree``, ``statistics`` and shape attributes they use.

    ``load_state_dict`` into a layer built on *any* tree of the same K, M, N and ``in_features``
    installs the saved tree (and refuses, before copying anything, a state dict of another shape,
    naming both). Label names are not saved: the loaded tree keeps the layer's. A state dict without
    a tree (written by an older version) still loads, with a warning, and the layer keeps its tree.
    The learner's statistics and step count are in ``TreeLearner.state_dict()``."""

    def get_extra_state(self) -> Tensor:
        """The tree, for ``state_dict()`` (see :meth:`set_extra_state` and :func:`_encode_tree`)."""
        return _encode_tree(self.tree, self.in_features)

    def _tree_from_state(self, state: Any) -> Tree:
        """Decode :meth:`get_extra_state`'s tensor (:func:`_decode_tree`)."""
        return _decode_tree(state, self)

    def set_extra_state(self, state: Any) -> None:
        """Install the tree :meth:`get_extra_state` saved, through :meth:`set_tree` (so every
        derived table follows). When a :class:`~hsm.TreeLearner` is attached, its statistics follow
        the tree too (as after a re-assignment, without decay); load the learner's own
        ``state_dict`` to restore them.

        The same tree is not a no-op: the tables derived from it are rebuilt all the same, since
        the load may be into storage that ``to_empty()`` left uninitialised, or (``assign=True``)
        into a layer built on the ``meta`` device (:meth:`HierarchicalSoftmax._register_tree_buffers`)."""
        pending = self.__dict__.pop("_pending_tree", None)
        tree = pending[1] if pending is not None and pending[0] is state else self._tree_from_state(state)
        if tree == self.tree:
            self._register_tree_buffers()
            return
        self.set_tree(tree)
        if self.statistics is not None:
            self.statistics.on_reassign(tree, apply_decay=False)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        """torch's hook, extended: the saved tree is decoded and checked *before* any parameter is
        copied (a tree of another shape loads nothing and is reported as torch reports a size
        mismatch: ``load_state_dict`` raises RuntimeError with our message); a state dict without
        a tree (saved before the tree was part of it) loads with a warning, keeping this layer's."""
        key = prefix + "_extra_state"
        if key in state_dict:
            try:
                self.__dict__["_pending_tree"] = (state_dict[key], self._tree_from_state(state_dict[key]))
            except ValueError as error:
                error_msgs.append(f"{key}: {error}")
                return
        try:
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                          unexpected_keys, error_msgs)
        finally:
            self.__dict__.pop("_pending_tree", None)
        if key not in state_dict:
            self._register_tree_buffers()  # no set_extra_state to rebuild them (see there)
            if key in missing_keys:
                missing_keys.remove(key)
            if prefix + "weight" in state_dict:
                warnings.warn(f"the state dict has no tree ({key!r}: saved by an older hsm?): the layer keeps its "
                              f"tree, {self.tree!r}; if the parameters were trained with another (learned) tree, "
                              "call layer.set_tree(that tree) or the parameters are read under the wrong tree",
                              stacklevel=_caller_outside_torch())


class HierarchicalSoftmax(_TreeInStateDict, nn.Module):
    """Tree softmax over ``tree.num_labels`` labels (eq. 5 / 11).

    Parameters
    ----------
    in_features: d, the size of the representation ``h = f(x)``.
    tree: the label tree (:class:`hsm.Tree`).
    bias: learn a bias per child slot.
    sparse: node parameters get sparse gradients (``torch.optim.SGD``, ``Adagrad`` and
        ``SparseAdam`` accept them): a step then costs O(B L M d), not O(N M d).
    ignore_index: rows whose target is this value are skipped, as ``nn.CrossEntropyLoss`` skips
        them: ``output`` 0, no gradient, not in the mean, not in Algorithm 1's statistics.
    reduction: ``"mean"`` (default) or ``"sum"`` of the negative log-likelihoods, for ``loss``.
    engine: how :meth:`forward` computes: ``"auto"`` (default) the static engine of
        :mod:`hsm.engine` on a GPU (any device but the CPU) and the compiled kernels on the CPU;
        ``"torch"`` the static engine everywhere, the CPU included (what a GPU runs: no
        host-device synchronisation, the same ops for every batch, ``torch.compile(fullgraph=True)``
        and CUDA graphs; a NaN input then gives a NaN loss instead of an error).

    Shape: ``input`` [B, d], ``target`` [B] -> ``output`` [B], ``loss`` []; or ``input`` [..., d],
    ``target`` [...] -> ``output`` [...] (e.g. [B, T, d] and [B, T] from a sequence model), as
    ``F.cross_entropy`` takes them. ``log_prob``, ``predict`` and ``topk`` take [..., d] too.

    Speed (``python -m hsm bench``; the book's performance chapter): :meth:`forward` hands the batch
    to a backend (:mod:`hsm.backend`) that groups the (example, path node) pairs by node, reads each
    node's ``[M, d]`` block once and writes one gradient row per node; :meth:`predict` is a greedy
    descent then branch and bound (:mod:`hsm.search`). For float32 CPU tensors this runs in
    compiled kernels (:mod:`hsm.kernels`, on ``torch.get_num_threads()`` threads); set
    ``layer.use_kernels = False`` for the grouped PyTorch implementation. On a GPU (and with
    ``engine="torch"``) :meth:`forward` runs the static engine (:mod:`hsm.engine`) instead. Use
    :class:`~hsm.optim.RowSparseAdagrad` or :class:`~hsm.optim.RowSparseSGD` with ``sparse=True``.
    On Linux, ``THP_MEM_ALLOC_ENABLE=1`` in the environment before Python starts (huge pages for
    tensors of 2 MB or more) removes most of the page-fault cost of the per-batch temporaries,
    several-fold for large arities. :meth:`forward_reference` is the plain eq. 5 everything is
    tested against.

    Node parameters when the tree changes (:meth:`set_tree`): every node keeps its parameters
    (node ids are positions: Algorithm 3 never moves them, and Algorithm 2 reuses ids in place);
    nodes named in ``reset_nodes`` (new positions) are re-initialised, as the thesis does for a
    new node (its Fig. 3.6 h).

    The tree is part of :meth:`state_dict` (key ``_extra_state``; :class:`_TreeInStateDict`), so a
    layer trained with a :class:`~hsm.TreeLearner` round-trips through ``load_state_dict``.

    PyTorch's tools (tests/test_torch_tools.py):

    * ``torch.compile(model)`` (inductor, ``"aot_eager"``, ``"eager"``): with the static engine
      (``engine="torch"``, and on a GPU by default) :meth:`forward` is traced like any module:
      ``fullgraph=True`` holds and new targets do not recompile (:mod:`hsm.engine`; a whole step
      goes into one CUDA graph with :func:`hsm.engine.capture_step`). Otherwise the model is
      compiled around the layer, whose entry points run outside compilation
      (``torch.compiler.disable``): it plans each batch on the host from the targets' values, which
      Dynamo cannot trace, and runs its eager fast path (same values, gradients and statistics);
      ``fullgraph=True`` and ``torch.export`` then refuse a model containing the layer.
    * ``torch.autocast``: an input in the autocast dtype (bf16) is converted to the layer's dtype
      and the node softmaxes run with autocast off, as autocast treats losses: ``output``,
      ``loss`` and ``log_prob`` are float32. TF32 / ``set_float32_matmul_precision`` apply as to
      any matmul.
    * ``sparse=True``: clip with :func:`hsm.clip_grad_norm_` (torch's has no sparse norm); step
      with ``torch.optim.SGD``, ``Adagrad``, ``SparseAdam``, :class:`~hsm.optim.RowSparseAdagrad`
      or :class:`~hsm.optim.RowSparseSGD` (``Adam`` / ``AdamW`` refuse sparse gradients, and
      ``SparseAdam`` dense ones); ``DistributedDataParallel`` buckets only dense gradients, so keep
      the layer outside it and call :func:`hsm.distributed.average_gradients` after ``backward()``.

    Input checks (every entry point): TypeError when ``input``'s dtype is not the parameters'
    (as ``nn.Linear``: convert one of them), ValueError for a wrong shape or device and for rows
    holding NaN or inf (named). An empty batch gives empty results (and a NaN mean loss).
    """

    def __init__(self, in_features: int, tree: Tree, bias: bool = True, sparse: bool = False,
                 ignore_index: int = -100, reduction: str = "mean", engine: str = "auto") -> None:
        super().__init__()
        self.ignore_index, self.reduction = check_loss_options(ignore_index, reduction)
        self.engine = check_choice(engine, "engine", static_engine.ENGINES)
        in_features = check_integer(in_features, "in_features")
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
        #: a RowSparseAdagrad whose update of this layer's parameters runs inside the compiled
        #: backward (RowSparseAdagrad.fuse), or None
        self.fused_optimizer = None
        self.reset_parameters()
        self.tree: Tree
        self.set_tree(tree)

    @property
    def num_labels(self) -> int:
        return self.tree.num_labels

    def reset_parameters(self, nodes: Tensor | np.ndarray | None = None) -> None:
        """Uniform(-1/sqrt(d), 1/sqrt(d)) weights and zero biases, like ``nn.Linear``; all nodes
        or only ``nodes``. Resetting all nodes also rebuilds the tables derived from the tree, as
        ``nn.BatchNorm``'s resets its running statistics: after ``to_empty()`` it is what makes the
        layer usable without a state dict."""
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            if nodes is None:
                self.weight.uniform_(-bound, bound)
                if self.bias is not None:
                    self.bias.zero_()
                if hasattr(self, "tree"):  # not yet during __init__, which calls set_tree next
                    self._register_tree_buffers()
            else:
                rows = torch.as_tensor(np.asarray(nodes), dtype=torch.long, device=self.weight.device)
                self.weight[rows] = torch.empty_like(self.weight[rows]).uniform_(-bound, bound)
                if self.bias is not None:
                    self.bias[rows] = 0.0

    def set_tree(self, tree: Tree, reset_nodes: Tensor | np.ndarray | None = None) -> None:
        """Switch to another tree over the same labels and nodes (after a re-assignment).
        Raises TypeError for a non-Tree, ValueError for a tree of another M, N or K."""
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be an hsm.Tree, got {type(tree).__name__}")
        if tree.arity != self.arity or tree.num_nodes != self.num_nodes:
            raise ValueError(
                f"the new tree has M={tree.arity}, N={tree.num_nodes}; the layer was built for "
                f"M={self.arity}, N={self.num_nodes}"
            )
        if hasattr(self, "tree") and tree.num_labels != self.tree.num_labels:
            raise ValueError(f"the new tree has {tree.num_labels} labels, the layer {self.tree.num_labels}")
        self._install_tree(tree)
        if reset_nodes is not None and len(reset_nodes):
            self.reset_parameters(reset_nodes)

    def add_labels(self, examples: Sequence[Tensor], label_names: Sequence[str] | None = None,
                   placement: str = "objective", seed: int = 0, local_steps: int = 0, local_lr: float = 0.1,
                   reference: Tensor | None = None, rehearsal: tuple[Tensor, Tensor] | None = None,
                   statistics: Any = None) -> Any:
        """Add labels the layer was not trained on, without retraining: :func:`hsm.label_addition.add_labels`
        on this layer (``examples[i]`` [n_i, d]: representations of a few examples of new label ``K + i``),
        returning its :class:`~hsm.label_addition.LabelAddition`. ``statistics``: the trained labels' node
        statistics, when kept (a frozen learner's); placement then uses the nodes' marginals. With
        ``local_steps`` > 0 the slots on the new labels' paths are trained on the examples (with
        ``rehearsal``, examples of trained labels, against forgetting), which changes parameters that
        trained labels share. The parameters are new ``nn.Parameter`` objects: build the
        optimiser after adding.

        Raises RuntimeError while a :class:`~hsm.TreeLearner` is learning the tree (call its
        ``add_labels``, which keeps its statistics in step), and the function's errors otherwise."""
        if self.statistics is not None:
            raise RuntimeError("a TreeLearner is learning this layer's tree: call learner.add_labels(...), which "
                               "grows its node statistics with the tree")
        return label_addition.add_labels(self, examples, statistics=statistics, label_names=label_names,
                                         placement=placement, seed=seed, local_steps=local_steps, local_lr=local_lr,
                                         reference=reference, rehearsal=rehearsal)

    def grow(self, tree: Tree, weight: Tensor, bias: Tensor | None) -> None:
        """Switch to a tree with more labels (and perhaps more internal nodes) together with its
        node parameters ``weight`` [N', M * d] and ``bias`` [N', M] (None for a layer without
        bias): what :func:`hsm.label_addition.add_labels` does after placing new labels.

        The parameters are new ``nn.Parameter`` objects: build the optimiser after growing, or add
        them to it. The node statistics of a :class:`~hsm.TreeLearner` and a fused optimiser belong
        to the old tree and are detached (``TreeLearner.add_labels`` attaches statistics for the new
        one). Raises TypeError / ValueError before changing anything when ``tree`` has another M,
        fewer labels or nodes, or the parameters' shapes do not match it."""
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be an hsm.Tree, got {type(tree).__name__}")
        if tree.arity != self.arity or tree.num_nodes < self.num_nodes or tree.num_labels < self.num_labels:
            raise ValueError(f"a grown tree keeps M={self.arity} and has at least N={self.num_nodes} nodes and "
                             f"K={self.num_labels} labels; got M={tree.arity}, N={tree.num_nodes}, K={tree.num_labels}")
        shape = (tree.num_nodes, tree.arity * self.in_features)
        if tuple(weight.shape) != shape:
            raise ValueError(f"weight must be {list(shape)} for the grown tree, got {list(weight.shape)}")
        if (bias is None) != (self.bias is None) or (bias is not None and tuple(bias.shape) != shape[:1] + (self.arity,)):
            raise ValueError(f"bias must be {'None' if self.bias is None else [shape[0], self.arity]} for this layer")
        device, dtype = self.weight.device, self.weight.dtype
        self.weight = nn.Parameter(weight.detach().to(device=device, dtype=dtype).contiguous())
        if bias is not None:
            self.bias = nn.Parameter(bias.detach().to(device=device, dtype=dtype).contiguous())
        self.num_nodes = tree.num_nodes
        self.statistics = None
        self.fused_optimizer = None
        self._install_tree(tree)

    def _install_tree(self, tree: Tree) -> None:
        """``tree`` becomes the layer's, with the buffers and the host-side tables the engines and
        searches read derived from it (:meth:`set_tree` and :meth:`grow` check it first)."""
        self.tree = tree
        self._register_tree_buffers()
        self.tables = TreeTables.from_tree(tree)

    def _register_tree_buffers(self) -> None:
        """(Re)derive the device-side tables of ``self.tree`` on the parameters' device and dtype.

        Besides :meth:`set_tree`, a load and :meth:`reset_parameters` call it: these buffers are not
        in the state dict, so after ``to_empty()`` (PyTorch's deferred initialisation: a model built
        on the ``meta`` device, then given real but uninitialised storage) their memory holds
        garbage, and after ``load_state_dict(assign=True)`` into a meta model they are still on
        ``meta``; either way only a rebuild from the tree, which lives on the host, makes them right."""
        tree = self.tree
        device = self.weight.device
        as_t = lambda a: torch.as_tensor(np.ascontiguousarray(a), device=device)  # noqa: E731
        # buffers are not persistent: they derive from the tree, which the state dict carries
        # (get_extra_state)
        self.register_buffer("path_nodes", as_t(tree.path_nodes), persistent=False)
        self.register_buffer("path_children", as_t(tree.path_children), persistent=False)
        self.register_buffer("path_mask", as_t(tree.path_mask), persistent=False)
        self.register_buffer("slot_mask", as_t(tree.slot_mask), persistent=False)
        self.register_buffer("child_node", as_t(tree.child_node), persistent=False)
        self.register_buffer("child_label", as_t(tree.child_label), persistent=False)
        # Empty slots (M**D > K, ragged taxonomies) get -inf added to their logit; a tree without
        # any (a full M-ary tree) skips that work entirely.
        # the static engine's tables: rebuilt in place when they keep their shape, so that a
        # compiled or captured step (which holds their addresses) reads the new tree
        current_paths = getattr(self, "engine_paths", None)
        length = (current_paths.shape[1] - 1) // 3 if current_paths is not None else 0
        for name, table in static_engine.path_tables(tree, self.weight.dtype, device, length).items():
            current = getattr(self, name, None)
            if (current is not None and current.shape == table.shape and current.dtype == table.dtype
                    and current.device == table.device):
                current.copy_(table)
            else:
                self.register_buffer(name, table, persistent=False)
        penalty = None
        if not tree.slot_mask.all():
            penalty = torch.as_tensor(np.where(tree.slot_mask, 0.0, -np.inf), dtype=self.weight.dtype, device=device)
        self.register_buffer("slot_penalty", penalty, persistent=False)

    # ------------------------------------------------------------------ node computations
    def node_logits(self, input: Tensor, nodes: Tensor) -> Tensor:
        """The logits ``W_n h + b_n`` of ``nodes`` [B, ...] for the rows ``h`` of ``input`` [B, d]:
        [B, ..., M], unusable slots (no real label below them) at -inf, so that a ``log_softmax``
        over the last dimension gives ``log p(child | node, h)`` (eq. 9). The reference per-pair
        evaluation: one weight block is copied per (row, node) pair, where the fast paths group
        pairs by node instead."""
        shape = nodes.shape
        flat = nodes.reshape(shape[0], math.prod(shape[1:]))  # [B, L] (no -1: B may be 0)
        weight = F.embedding(flat, self.weight, sparse=self.sparse)  # [B, L, M*d]
        weight = weight.view(flat.shape[0], flat.shape[1], self.arity, self.in_features)
        logits = torch.einsum("bd,blmd->blm", input, weight)
        if self.bias is not None:
            logits = logits + F.embedding(flat, self.bias, sparse=self.sparse)
        logits = logits.masked_fill(~self.slot_mask[flat], -math.inf)
        return logits.view(*shape, self.arity)

    def __getstate__(self) -> dict:
        """For pickling (``copy.deepcopy(layer)``, ``torch.save(layer)``): the per-thread inference
        buffers (a ``threading.local``, which cannot be pickled) are left behind; a copy makes its own."""
        state = self.__dict__.copy()
        state.pop("_thread_local", None)
        state.pop("_pending_tree", None)
        state["fused_optimizer"] = None  # a copy is not updated by the original's optimiser
        return state

    def workspace(self) -> list:
        """Per-thread buffers for the inference paths (so concurrent callers never share one)."""
        local = self.__dict__.get("_thread_local")
        if local is None:
            local = self.__dict__["_thread_local"] = threading.local()
        if not hasattr(local, "buffers"):
            local.buffers = []
        return local.buffers

    #: use the compiled kernels of :mod:`hsm.kernels` where they apply (float32 CPU tensors);
    #: False forces the PyTorch implementation (the benchmark compares the two)
    use_kernels: bool = True
    #: the engine of :meth:`forward` ("auto" or "torch"; the constructor's ``engine``)
    engine: str = "auto"

    def _static_engine(self) -> bool:
        """Whether :meth:`forward` runs the static engine (:mod:`hsm.engine`) for this layer."""
        return static_engine.uses_static_engine(self.engine, self.weight.device)

    #: targets skipped by :meth:`forward` (``nn.CrossEntropyLoss``'s default; class-level defaults
    #: so that layers pickled before these options existed still load)
    ignore_index: int = -100
    #: ``loss`` is the "mean" or the "sum" of the rows' negative log-likelihoods
    reduction: str = "mean"

    def _compute_dtype(self) -> torch.dtype:
        """The dtype the layer computes in (its parameters'): what an autocast input is converted to."""
        return self.weight.dtype

    @_layer_entry
    def forward(self, input: Tensor, target: Tensor) -> HSMOutput:
        """Eq. 5, ``output = log p(target | input)`` per row, and ``loss``, the mean (or, with
        ``reduction="sum"``, the sum) of ``-output``, with ``F.cross_entropy``'s conventions for
        shapes, ``ignore_index`` and ``reduction`` (on a one-node tree the two give the same values
        and gradients: tests/test_loss_options.py).

        ``input`` [B, d] with ``target`` [B], or ``input`` [..., d] with ``target`` [...]:
        ``output`` has the shape of ``target``. Rows whose target is ``ignore_index`` are not
        evaluated (``output`` 0, zero gradient, left out of the mean and of a
        :class:`~hsm.TreeLearner`'s statistics). The rows are computed by :meth:`_forward_rows`
        (its checks and errors apply), or by the static engine (:mod:`hsm.engine`, the layer's
        ``engine``), which computes the same values without reading anything back from the device."""
        if self._static_engine():
            return HSMOutput(*static_engine.forward(self, input, target))
        return HSMOutput(*forward_rows(self, input, target, self._forward_rows))

    def _forward_rows(self, input: Tensor, target: Tensor) -> HSMOutput:
        """Eq. 5: ``output[b] = sum over the path of target[b] of log softmax(W_n h_b + b_n)[c_d]``.

        Shapes: ``input`` [B, d], ``target`` [B] -> ``output`` [B], ``loss`` [] (the mean of
        ``-output``). The engine (:func:`hsm.backend.select_backend`) groups the (example, path node) pairs by
        node, so each node's parameters are read once per batch and its gradient is written once;
        the result equals :meth:`forward_reference` (tests check values and gradients). In
        training mode with a :class:`~hsm.TreeLearner` attached, the node distributions of the
        batch go to its statistics (Algorithm 1, :meth:`_collect_statistics`).

        Raises TypeError when ``input``'s dtype is not the layer's or ``target`` is not an integer
        tensor, ValueError for a wrong shape or device, a label outside 0..K-1, or NaN / infinite
        values in ``input`` (naming the rows). An empty batch gives an empty ``output`` and a NaN
        ``loss`` (the mean of nothing, as ``F.cross_entropy`` and
        ``nn.AdaptiveLogSoftmaxWithLoss`` give); ``loss.backward()`` then leaves zero gradients."""
        check_input(input, self.in_features, self.weight)
        if input.shape[0] == 0:
            check_target_shape(target, 0)
            output = EmptyBatch.apply(input, self.weight, self.bias, self.sparse)
            return HSMOutput(output, -output.mean())
        collect = self.statistics is not None and self.training
        output, loss, distributions = backend.select_backend(self, input).path_log_prob(self, input, target, collect)
        # a finite input whose logits overflow: refused before the statistics see it
        if not math.isfinite(float(loss.detach())):
            check_logits_finite(torch.nonzero(~torch.isfinite(output.detach())).flatten(), input.shape[0], input.dtype)
        if distributions is not None:
            self._collect_statistics(target, distributions)
        return HSMOutput(output, loss)

    def forward_reference(self, input: Tensor, target: Tensor) -> HSMOutput:
        """Eq. 5 as written, one (example, path node) pair at a time (per-pair weight copies,
        autograd for the gradient): what :meth:`forward` is checked against, and the "naive" line
        of the benchmark. Rows only: ``input`` [B, d], ``target`` [B], every row evaluated, the
        mean loss (no leading dimensions, ``ignore_index`` or ``reduction``); the checks of
        :meth:`_forward_rows`."""
        check_input(input, self.in_features, self.weight)
        check_target(target, input.shape[0], self.num_labels)
        nodes = self.path_nodes[target]  # [B, L]: n_1 .. n_L, the nodes on the path of y
        children = self.path_children[target]  # [B, L]: c_d, the child taken at n_d
        mask = self.path_mask[target]  # [B, L]: False past the end of a shorter path
        log_probs = torch.log_softmax(self.node_logits(input, nodes), dim=-1)  # [B, L, M]: log softmax(W_n h + b_n)
        picked = log_probs.gather(-1, children.unsqueeze(-1)).squeeze(-1)  # [B, L]: its entry c_d
        output = torch.where(mask, picked, torch.zeros_like(picked)).sum(dim=1)  # [B]: the sum over the path
        return HSMOutput(output, -output.mean())

    def _collect_statistics(self, target: Tensor, distributions: NodeDistributions) -> None:
        """Hand the batch's node distributions to the attached statistics (:class:`hsm.NodeStatistics`,
        owned by the :class:`~hsm.TreeLearner` that runs Algorithm 1): the layer computes them
        anyway, and computing them again in the learner would cost a second pass over the path nodes."""
        probs, full = distributions.probs, distributions.full
        if distributions.example is not None and self.statistics.accumulate_pairs(
                distributions.labels, distributions.example, distributions.depth, probs.numpy()):
            return
        batch = target.shape[0]
        length = self.path_nodes.shape[1]
        mask = self.path_mask[target]
        if full:
            probs = probs.view(batch, length, self.arity)
        else:
            padded = probs.new_zeros(batch * length, self.arity)
            padded[mask.view(-1)] = probs
            probs = padded.view(batch, length, self.arity)
        self.statistics.accumulate(target, probs, mask)

    @_layer_entry
    @over_leading_dims
    def log_prob(self, input: Tensor, batch_chunk: int = 256) -> Tensor:
        """Log-probabilities of all K labels: ``input`` [B, d] -> [B, K] (every node evaluated:
        O(N M d) per row; eq. 5 for every label at once).

        Raises as :meth:`forward` does for a bad ``input`` (dtype, shape, device, NaN / inf rows);
        an empty batch gives a [0, K] tensor. ``batch_chunk`` (rows evaluated at once, >= 1) bounds
        the temporary memory."""
        check_input(input, self.in_features, self.weight)
        if check_integer(batch_chunk, "batch_chunk") < 1:
            raise ValueError(f"batch_chunk must be >= 1, got {batch_chunk}")
        fast = search.all_log_probs(self, input)  # the compiled kernels, where no graph is needed
        if fast is not None:
            return fast
        # the PyTorch path: every path's sum gathered from all node log-softmaxes (the reference)
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
            node_lp = torch.log_softmax(logits, dim=-1).reshape(chunk.shape[0], self.num_nodes * self.arity)
            per_step = node_lp[:, index]  # [b, K, L]
            rows.append(torch.where(mask, per_step, torch.zeros_like(per_step)).sum(-1))
        out = torch.cat(rows)
        if out.numel() and not math.isfinite(float(out.detach().amax())):  # overflowing logits give NaN / -inf rows
            check_logits_finite(torch.nonzero(~torch.isfinite(out.detach()).all(dim=1)).flatten(), input.shape[0],
                                input.dtype)
        return out

    @_layer_entry
    @over_leading_dims
    @torch.no_grad()
    def predict(self, input: Tensor) -> Tensor:
        """The most likely label of each row, exact (branch and bound): ``input`` [B, d] -> [B].

        First a greedy descent (follow the most likely child) gives each row a label and so a lower
        bound on the best log-probability; then the tree is explored level by level from the root,
        keeping a node only while its path log-probability is above the row's best label so far.
        A node's path probability bounds every label below it, so the result is the arg max of
        :meth:`log_prob` (tests check it). A confident model prunes almost everything; an
        untrained one (near-uniform nodes) visits every node.

        Raises as :meth:`forward` does for a bad ``input``: in particular ValueError naming the rows
        with NaN or infinite values, on every path (there is no meaningful most likely label for
        them). An empty batch gives an empty [0] tensor. On the static engine the search is
        :func:`hsm.engine.topk` with k = 1 (one read from the device per call)."""
        check_input(input, self.in_features, self.weight)
        if self._static_engine():
            return static_engine.topk(self, input, 1)[1][:, 0]
        return search.top1(self, input)[0]

    @_layer_entry
    @over_leading_dims
    @torch.no_grad()
    def topk(self, input: Tensor, k: int = 1, method: str = "exact", beam: int | None = None) -> TopK:
        """The k most likely labels: ``input`` [B, d] -> ``TopK(values [B, k], indices [B, k],
        nodes_visited [B])``, best first.

        ``method="exact"``: branch and bound (ICML §11.1, fastText's search;
        :func:`hsm.search.exact_topk`): a beam search of width k gives k labels and a bound; then
        the tree is explored level by level, keeping a node only while its path log-probability is
        above the current k-th best label, which is exact because a node's path probability bounds
        every label below it.
        ``method="beam"``: beam search of width ``beam`` (default k; a width below k is widened to
        k), approximate. On the static engine (``engine="torch"``, a GPU) ``"exact"`` is
        :func:`hsm.engine.topk`: a beam of width ``beam`` (default ``max(2 k, 4)``) whose result is
        proven exact row by row, the branch and bound running only for the rows it does not prove.

        Raises TypeError for a non-integer ``k`` or ``beam``, ValueError for ``k`` outside 1..K,
        ``beam < 1``, an unknown ``method``, or a bad ``input`` (as :meth:`forward`). An empty
        batch gives [0, k] values and indices.
        """
        check_input(input, self.in_features, self.weight)
        check_k(k, self.num_labels, method, beam)
        k = int(k)
        width = max(beam or k, k)
        if method == "beam":
            return TopK(*search.beam_search(self, input, k, width))
        if self._static_engine():  # a fixed-width beam, then branch and bound for the rows not proven
            return TopK(*static_engine.topk(self, input, k, beam))
        return TopK(*search.exact_topk(self, input, k, width))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, {self.tree!r}, sparse={self.sparse}"


class FlatSoftmax(nn.Module):
    """The flat softmax ``softmax(W h + b)`` over K labels, with the same interface (the baseline
    the tree is measured against: O(K d) per example).

    Bad input is refused as :class:`HierarchicalSoftmax` refuses it (TypeError for another dtype,
    ValueError for another shape or device and for NaN / infinite rows; on the CPU also for finite
    rows whose logits overflow, see :meth:`_log_softmax`); an empty batch gives empty outputs and a
    NaN loss, as torch's losses do.

    ``ignore_index``, ``reduction`` and inputs [..., d] with targets [...] as for
    :class:`HierarchicalSoftmax` (and ``F.cross_entropy``), and so are ``torch.compile`` (the
    layer runs outside compilation) and ``torch.autocast`` (float32 log-probabilities)."""

    def __init__(self, in_features: int, num_labels: int, bias: bool = True, ignore_index: int = -100,
                 reduction: str = "mean") -> None:
        super().__init__()
        self.ignore_index, self.reduction = check_loss_options(ignore_index, reduction)
        in_features, num_labels = check_integer(in_features, "in_features"), check_integer(num_labels, "num_labels")
        if in_features < 1:
            raise ValueError(f"in_features must be >= 1, got {in_features}")
        if num_labels < 2:
            raise ValueError(f"num_labels K must be >= 2, got {num_labels}")
        self.in_features = in_features
        self._num_labels = num_labels
        self.linear = nn.Linear(in_features, num_labels, bias=bias)

    ignore_index: int = -100  #: as :attr:`HierarchicalSoftmax.ignore_index`
    reduction: str = "mean"  #: as :attr:`HierarchicalSoftmax.reduction`

    @property
    def num_labels(self) -> int:
        return self._num_labels

    def _compute_dtype(self) -> torch.dtype:
        """The dtype the layer computes in (its parameters'): what an autocast input is converted to."""
        return self.linear.weight.dtype

    @_layer_entry
    def forward(self, input: Tensor, target: Tensor) -> HSMOutput:
        """``output = log softmax(W h + b)[target]`` per row and ``loss`` (mean or sum of
        ``-output``); shapes, ``ignore_index`` and ``reduction`` as :meth:`HierarchicalSoftmax.forward`."""
        return HSMOutput(*forward_rows(self, input, target, self._forward_rows))

    def _forward_rows(self, input: Tensor, target: Tensor) -> HSMOutput:
        check_input(input, self.in_features, self.linear.weight)
        check_target(target, input.shape[0], self.num_labels)
        log_probs = self._log_softmax(input)
        output = log_probs.gather(1, target[:, None]).squeeze(1)
        return HSMOutput(output, -output.mean())

    def _log_softmax(self, input: Tensor) -> Tensor:
        """``log_softmax(W h + b)`` [B, K]; on the CPU, NonFiniteInputError naming the rows whose
        logits overflow.

        Testing the logits means reading a flag back from the device: on a GPU that waits for the
        device in every training step, so there the test is left out. NaN and infinite inputs are
        still refused (:func:`check_input`); the rows of a finite input whose logits overflow
        (beyond 3e38 in float32) then give NaN or -inf log-probabilities and loss, as
        ``F.cross_entropy`` does."""
        logits = self.linear(input)
        if input.device.type == "cpu" and input.shape[0]:
            bad = ~torch.isfinite(logits.detach()).all(dim=-1)  # +-inf logits: NaN or -inf log-probabilities
            if bool(bad.any()):
                check_logits_finite(torch.nonzero(bad).flatten(), input.shape[0], input.dtype)
        return torch.log_softmax(logits, dim=-1)

    @_layer_entry
    @over_leading_dims
    def log_prob(self, input: Tensor) -> Tensor:
        check_input(input, self.in_features, self.linear.weight)
        return self._log_softmax(input)

    @_layer_entry
    @over_leading_dims
    @torch.no_grad()
    def predict(self, input: Tensor) -> Tensor:
        """The most likely label of each row: the first column of :meth:`topk` (same ties)."""
        check_input(input, self.in_features, self.linear.weight)
        return search.topk_lowest_id(self._log_softmax(input), 1)[1][:, 0]

    @_layer_entry
    @over_leading_dims
    @torch.no_grad()
    def topk(self, input: Tensor, k: int = 1, method: str = "exact", beam: int | None = None) -> TopK:
        """The k most likely labels (exact; equal log-probabilities ordered by label id, the lowest
        first, as the tree's searches order them; ``method`` and ``beam`` are checked as
        :meth:`HierarchicalSoftmax.topk` checks them, and otherwise ignored)."""
        check_input(input, self.in_features, self.linear.weight)
        check_k(k, self.num_labels, method, beam)
        values, indices = search.topk_lowest_id(self.log_prob(input), int(k))
        visited = torch.full((input.shape[0],), self.num_labels, dtype=torch.long, device=input.device)
        return TopK(values, indices, visited)
