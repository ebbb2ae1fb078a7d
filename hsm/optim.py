"""Optimisers for row-sparse gradients: Adagrad (the papers' optimiser) and plain SGD.

A training step of :class:`hsm.HierarchicalSoftmax` touches ``B * L`` node blocks out of ``N``
(eq. 5 involves only the nodes on the batch's paths), and with ``sparse=True`` its weight and bias
gradients list just those rows, once each. ``torch.optim``'s sparse paths coalesce the gradient
and build sparse temporaries; these optimisers read and write only the touched rows, in one
compiled pass on the CPU (:func:`hsm.kernels.run_adagrad_rows`). Both accept ``torch.optim``'s
``step`` protocol (closure included) and refuse settings that would touch every row (weight decay)
or train on NaN parameters (a NaN or infinite learning rate).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from . import kernels
from ._checks import check_choice
from .backend import FusedGradient
from .engine import ENGINES, adagrad_rows_, uses_static_engine

if TYPE_CHECKING:  # the layer module imports this one
    from .layers import HierarchicalSoftmax

__all__ = ["FusedGradient", "LAYER_LR", "RowSparseAdagrad", "RowSparseSGD", "TreeModelOptimizer"]


def _strictly_increasing(indices: Tensor) -> bool:
    """Distinct rows, cheaply: the layer's gradients list each node once, in increasing order
    (autograd's accumulation drops the coalesced flag, and ``torch.unique`` costs a sort)."""
    if indices.numel() < 2:
        return True
    if indices.device.type == "cpu":
        rows = indices.numpy()
        return bool((rows[1:] > rows[:-1]).all())
    return bool((indices[1:] > indices[:-1]).all()) or torch.unique(indices).numel() == indices.numel()


def _check_hyperparameter(optimizer: str, name: str, value: Any, positive: bool = False) -> float:
    """A finite real number >= 0 (> 0 with ``positive``) as a float. TypeError for a non-number
    (bool included), ValueError naming the setting otherwise: torch's optimisers accept NaN (SGD)
    or infinity and then train on NaN parameters without a word."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"invalid {optimizer} settings: {name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"invalid {optimizer} settings: {name}={value} (must be finite and {bound})")
    return value


def _check_no_weight_decay(optimizer: str, weight_decay: Any) -> None:
    """Weight decay would touch every row at every step, which is what these optimisers avoid:
    accepted only as 0 (so code written for torch's optimisers that passes 0 runs unchanged)."""
    if _check_hyperparameter(optimizer, "weight_decay", weight_decay) != 0:
        raise ValueError(f"invalid {optimizer} settings: weight_decay={weight_decay} is not supported (it would "
                         f"update every row at every step); use torch.optim.{optimizer} for weight decay")


def _check_tree_layer(layer: Any) -> None:
    """TypeError unless ``layer`` is a tree layer, known by what fusing uses (this module does not
    import the layers, which import it)."""
    if not (isinstance(layer, torch.nn.Module) and hasattr(layer, "tree") and hasattr(layer, "fused_optimizer")):
        raise TypeError(f"layer must be an hsm.HierarchicalSoftmax, got {type(layer).__name__}")


def _evaluate_closure(closure: Any) -> Any:
    """``torch.optim``'s closure protocol: the loss ``closure()`` returns, computed with gradients on
    (None without a closure)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class _RowSparseOptimizer(torch.optim.Optimizer):
    """The loop both row-sparse optimisers share: every parameter with a gradient gets
    :meth:`_update` (``torch.optim``'s ``step`` protocol, closure included)."""

    _name = ""  #: the torch optimiser's name, for messages
    _settings: tuple[tuple[str, bool], ...] = ()  #: (setting, must be > 0 rather than >= 0)

    def add_param_group(self, param_group: dict) -> None:
        """torch's, plus the settings check on the group's own values (a group may override the
        defaults: ``[{"params": ..., "lr": ...}]``)."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for name, positive in self._settings:
            group[name] = _check_hyperparameter(self._name, name, group[name], positive=positive)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = _evaluate_closure(closure)
        for group in self.param_groups:
            for param in group["params"]:
                if isinstance(param.grad, FusedGradient):  # updated in the backward: count the step
                    self._count_fused_step(param)
                elif param.grad is not None:
                    self._update(param, param.grad, group)
        return loss

    def _update(self, param: Tensor, grad: Tensor, group: dict) -> None:
        raise NotImplementedError

    def _count_fused_step(self, param: Tensor) -> None:
        """A parameter updated inside a fused backward: only the step count is left to do."""


class RowSparseAdagrad(_RowSparseOptimizer):
    """``torch.optim.Adagrad`` (the papers' optimiser) with a fast path for row-sparse gradients.

    Same update and defaults as ``torch.optim.Adagrad`` (weight decay excepted): per element,
    ``state += g**2`` and ``param -= lr_t g / (sqrt(state) + eps)`` with
    ``lr_t = lr / (1 + (t - 1) lr_decay)``. For a sparse COO gradient (what
    ``HierarchicalSoftmax(sparse=True)`` produces) only the touched rows are read and written, in
    one fused pass (a numba kernel on CPU; torch ``index_select`` / ``index_copy_`` /
    ``index_add_`` elsewhere), where ``torch.optim.Adagrad``'s sparse path builds several sparse
    temporaries and takes several times as long. Dense gradients get the same update, in one
    compiled pass for contiguous float32 / float64 CPU tensors (torch's in-place ops elsewhere).
    tests/test_optim.py checks it against ``torch.optim.Adagrad`` step by step.

    Raises ValueError (naming the setting) unless ``lr`` is finite and > 0 and ``lr_decay``,
    ``initial_accumulator_value`` and ``eps`` are finite and >= 0, in the defaults and in every
    parameter group; TypeError for a non-number. ``weight_decay`` is accepted only as 0.

    ``engine`` (as :class:`hsm.HierarchicalSoftmax`'s): ``"auto"`` (default) applies a sparse
    gradient on the CPU in the compiled pass (coalescing it first if a row is listed twice) and
    elsewhere in fixed-shape torch ops that never wait for the device (:func:`hsm.engine.adagrad_rows_`:
    rows listed several times, as the static engine's gradients list them, are summed by a sort, not
    by ``unique`` / ``coalesce``); ``"torch"`` uses those ops on the CPU too. The learning rate of a
    step is a host number: with ``lr_decay > 0``, a step captured in a CUDA graph keeps the rate of
    the step it was captured at.
    """

    _name = "Adagrad"
    _settings = (("lr", True), ("lr_decay", False), ("initial_accumulator_value", False), ("eps", False))

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, engine: str = "auto") -> None:
        self.engine = check_choice(engine, "engine", ENGINES)
        lr = _check_hyperparameter("Adagrad", "lr", lr, positive=True)
        lr_decay = _check_hyperparameter("Adagrad", "lr_decay", lr_decay)
        initial_accumulator_value = _check_hyperparameter("Adagrad", "initial_accumulator_value",
                                                          initial_accumulator_value)
        eps = _check_hyperparameter("Adagrad", "eps", eps)
        _check_no_weight_decay("Adagrad", weight_decay)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      initial_accumulator_value=initial_accumulator_value))
        for group in self.param_groups:
            for param in group["params"]:
                self.state[param]["step"] = 0
                # the constructor's value, not the group's: torch.optim.Adagrad does the same
                self.state[param]["sum"] = torch.full_like(param, initial_accumulator_value,
                                                           memory_format=torch.preserve_format)

    def fuse(self, layer: "HierarchicalSoftmax") -> None:
        """Apply this optimiser's update of ``layer``'s weight and bias inside the layer's
        compiled backward (float32 CPU), node by node, while each node's gradient row is in
        cache: the same update bit for bit, without writing the batch's gradient rows and
        reading them back (two of the seven passes over the touched node blocks that a step with
        a separate ``step()`` makes; tests/test_optim.py compares parameters and state with the
        unfused optimiser and with ``torch.optim.Adagrad``).

        The layer's parameters then get a :class:`FusedGradient` placeholder as ``.grad`` from
        such a backward, which ``step()`` skips; their step count advances in the backward. Fuse
        only where nothing reads or changes the gradients between ``backward()`` and ``step()``
        (an L2 term added to them, clipping, averaging across processes): the placeholder raises
        a RuntimeError saying so when something does (``clip_grad_norm_``), rather than the
        layer being left out silently. Do not run two backward passes per step. Other paths
        (the layer's PyTorch path, float64, other devices) produce gradients as usual.
        ``layer.fused_optimizer = None`` undoes it. On a GPU with Triton installed, a layer on the
        static engine (:mod:`hsm.engine`) applies the update in the Triton kernels of
        :mod:`hsm.fused` instead (each node of the batch read once, updated once with the sum of its
        rows' gradients), with the same placeholder.

        Raises TypeError unless ``layer`` is an :class:`HierarchicalSoftmax`; ValueError unless
        its weight (and bias) are parameters of this optimiser, in one parameter group, and when
        the layer is already fused with another optimiser (which would silently stop updating it)."""
        _check_tree_layer(layer)
        groups = [self._group_of(p) for p in (layer.weight, layer.bias) if p is not None]
        if any(g is None for g in groups):
            raise ValueError("the layer's weight and bias must be parameters of this optimiser to fuse its update")
        if any(g is not groups[0] for g in groups):
            raise ValueError("the layer's weight and bias must be in one parameter group to fuse their update")
        current = getattr(layer, "fused_optimizer", None)
        if current is not None and current is not self:
            raise ValueError("the layer is already fused with another RowSparseAdagrad, which would stop updating "
                             "it: set layer.fused_optimizer = None first to move it to this one")
        layer.fused_optimizer = self

    def _group_of(self, param: Tensor) -> dict | None:
        return next((g for g in self.param_groups if any(p is param for p in g["params"])), None)

    def fused_update_settings(self, weight: Tensor, bias: Tensor | None):
        """What the compiled backward of a fused layer (:meth:`fuse`) needs to apply this step's
        update in place: ``(bias, state_weight, state_bias, clr, eps)`` as numpy views, with ``clr``
        the learning rate of the coming step; None where the compiled update does not apply (then the
        backward returns the gradients and :meth:`step` updates as usual). The step itself is
        counted by :meth:`step`, as for every other parameter, never inside the backward."""
        params = [p for p in (weight, bias) if p is not None]
        group = self._group_of(weight)
        if (group is None or any(self._group_of(p) is not group for p in params)
                or any(p.device.type != "cpu" or p.dtype != torch.float32 or not p.is_contiguous() for p in params)
                or any(not self.state[p]["sum"].is_contiguous() for p in params)
                or len({self.state[p]["step"] for p in params}) != 1):
            return None
        clr = np.float32(self._coming_rate(group, weight))
        no_bias = np.empty((0, 1), dtype=np.float32)
        return (bias.detach().numpy() if bias is not None else no_bias, self.state[weight]["sum"].numpy(),
                self.state[bias]["sum"].numpy() if bias is not None else no_bias, clr, np.float32(group["eps"]))

    def fused_state(self, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None, float, float]:
        """What the fused Triton backward (:mod:`hsm.fused`) needs to apply this step's update in
        place: the Adagrad sums of ``weight`` (and ``bias``), the coming step's learning rate and
        ``eps``. The step itself is counted by :meth:`step`, never inside the backward."""
        group = self._group_of(weight)
        return (self.state[weight]["sum"], None if bias is None else self.state[bias]["sum"],
                self._coming_rate(group, weight), group["eps"])

    @staticmethod
    def _rate(group: dict, step: int) -> float:
        """The learning rate of step ``step`` (1, 2, ...): ``lr / (1 + (step - 1) lr_decay)``."""
        return group["lr"] / (1 + (step - 1) * group["lr_decay"])

    def _coming_rate(self, group: dict, param: Tensor) -> float:
        """The rate of the step a fused backward applies now, which :meth:`step` then counts."""
        return self._rate(group, self.state[param]["step"] + 1)

    def _count_fused_step(self, param: Tensor) -> None:
        self.state[param]["step"] += 1

    def _update(self, param: Tensor, grad: Tensor, group: dict) -> None:
        state = self.state[param]
        state["step"] += 1
        clr = self._rate(group, state["step"])
        total = state["sum"]
        static = uses_static_engine(getattr(self, "engine", "auto"), param.device)
        if grad.is_sparse and static:
            adagrad_rows_(param, total, grad._indices()[0], grad._values(), clr, group["eps"])
        elif grad.is_sparse:
            self._sparse_step(param, total, grad, clr, group["eps"])
        elif (not static and param.device.type == "cpu" and param.dtype in (torch.float32, torch.float64)
              and grad.dtype == param.dtype
              and param.is_contiguous() and total.is_contiguous() and grad.is_contiguous()):
            # one compiled pass (torch's update reads and writes parameter-sized tensors four times:
            # 0.19 ms for the LM's 160k-element R against about 0.04 ms, development measurement)
            dtype = np.float32 if param.dtype == torch.float32 else np.float64
            kernels.run_adagrad_dense(param.view(-1).numpy(), total.view(-1).numpy(), grad.view(-1).numpy(),
                                      dtype(clr), dtype(group["eps"]))
        else:
            total.addcmul_(grad, grad, value=1)
            param.addcdiv_(grad, total.sqrt().add_(group["eps"]), value=-clr)

    @staticmethod
    def _sparse_step(param: Tensor, total: Tensor, grad: Tensor, clr: float, eps: float) -> None:
        indices = grad._indices()[0]
        values = grad._values()
        if not grad.is_coalesced() and not _strictly_increasing(indices):
            grad = grad.coalesce()  # duplicate rows must be summed before squaring
            indices, values = grad._indices()[0], grad._values()
        flat_param = param.view(param.shape[0], -1)
        flat_total = total.view(total.shape[0], -1)
        values = values.reshape(values.shape[0], flat_param.shape[1])  # (not -1: there may be no rows)
        if (param.device.type == "cpu" and param.dtype in (torch.float32, torch.float64)
                and param.is_contiguous() and total.is_contiguous()):
            dtype = np.float32 if param.dtype == torch.float32 else np.float64
            kernels.run_adagrad_rows(flat_param.numpy(), flat_total.numpy(), indices.contiguous().numpy(),
                                     values.contiguous().numpy(), dtype(clr), dtype(eps))
            return
        rows = flat_total.index_select(0, indices).addcmul_(values, values)
        flat_total.index_copy_(0, indices, rows)
        flat_param.index_add_(0, indices, values / rows.sqrt_().add_(eps), alpha=-clr)


class RowSparseSGD(_RowSparseOptimizer):
    """Plain SGD, ``param -= lr * grad`` (the fastText-style models' optimiser), with a fast path
    for row-sparse gradients.

    ``torch.optim.SGD`` applies a sparse gradient with ``param.add_(grad)``, which first coalesces
    it (a sort of its rows: autograd's accumulation drops the coalesced flag the layer sets) and
    takes 2.7 ms per step at V = 250k, M = 63 here, longer than the forward and backward together.
    The update is linear in the gradient, so rows listed twice may simply both be added: one
    ``index_add_`` of the touched rows (0.7 ms). No momentum or weight decay: with sparse
    gradients they would have to touch every row. tests/test_optim.py checks it against
    ``torch.optim.SGD``. Raises ValueError unless ``lr`` is finite and > 0 (``torch.optim.SGD``
    accepts NaN), in the defaults and in every parameter group; TypeError for a non-number.
    ``weight_decay`` is accepted only as 0.
    """

    _name = "SGD"
    _settings = (("lr", True),)

    def __init__(self, params, lr: float = 1e-2, weight_decay: float = 0.0) -> None:
        lr = _check_hyperparameter("SGD", "lr", lr, positive=True)
        _check_no_weight_decay("SGD", weight_decay)
        super().__init__(params, dict(lr=lr))

    def _update(self, param: Tensor, grad: Tensor, group: dict) -> None:
        if grad.is_sparse:
            values = grad._values()
            flat = param.view(param.shape[0], -1)
            flat.index_add_(0, grad._indices()[0], values.reshape(values.shape[0], flat.shape[1]), alpha=-group["lr"])
        else:
            param.add_(grad, alpha=-group["lr"])


#: :class:`TreeModelOptimizer`'s learning rate for the tree layer's Adagrad: the best of a sweep (0.01 to 0.3)
#: under a Transformer language model on PTB with AdamW (rate 1e-3) on the body (the book's practitioner's chapter)
LAYER_LR = 0.02


class TreeModelOptimizer(torch.optim.Optimizer):
    """One optimiser for a model whose output layer is a :class:`hsm.HierarchicalSoftmax`, whatever
    optimises the rest of it (the body): the body's optimiser (``AdamW``, ``SGD``, ...) over the body,
    a :class:`RowSparseAdagrad` over the layer, fused into its backward (:meth:`RowSparseAdagrad.fuse`),
    stepped, zeroed, scheduled and saved as one::

        layer = hsm.HierarchicalSoftmax(d, tree, sparse=True)
        body = torch.optim.AdamW(model.parameters(), lr=1e-3)   # the body only, not the layer
        optimizer = hsm.TreeModelOptimizer(body, layer)      # the layer: Adagrad at LAYER_LR
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=steps)
        ...
        loss.backward(); optimizer.clip_grad_norm_(1.0); optimizer.step(); optimizer.zero_grad()
        scheduler.step(); learner.step()

    Why two: ``Adam`` and ``AdamW`` refuse the layer's sparse gradients, and a dense optimiser over
    the layer reads and writes all of its ``N M d`` weights at every step where a tree step touches
    the ``B L`` nodes of the batch's paths.

    Parameters
    ----------
    body: the optimiser of every parameter but the layer's.
    layer: the tree softmax; build it with ``sparse=True`` (dense gradients work, but update every node).
    lr: the layer's Adagrad learning rate (:data:`LAYER_LR`).
    schedule_layer: whether a ``torch.optim.lr_scheduler`` built on this optimiser also scales the
        layer's rate (its parameter group then follows the body's in :attr:`param_groups`). Off by
        default: Adagrad already shrinks each row's step as its squared gradients add up.
    fuse: apply the layer's update inside its backward (:meth:`RowSparseAdagrad.fuse`): nothing may then
        read or change the layer's gradients between ``backward()`` and :meth:`step`, which is why
        :meth:`clip_grad_norm_` clips the body's gradients only.
    engine: :class:`RowSparseAdagrad`'s.

    :attr:`param_groups` lists the body's groups (then the layer's with ``schedule_layer``), so a
    learning-rate scheduler drives them as it drives any optimiser; :meth:`state_dict` holds both
    optimisers' states. Raises TypeError unless ``body`` is a ``torch.optim.Optimizer`` and ``layer``
    a :class:`hsm.HierarchicalSoftmax`; ValueError when a parameter of the layer is also in ``body``
    (it would be updated twice).
    """

    def __init__(self, body: torch.optim.Optimizer, layer: "HierarchicalSoftmax", lr: float = LAYER_LR,
                 schedule_layer: bool = False, fuse: bool = True, engine: str = "auto") -> None:
        # torch.optim.Optimizer.__init__ is not called: the groups and state are the two optimisers' own
        if not isinstance(body, torch.optim.Optimizer) or isinstance(body, TreeModelOptimizer):
            raise TypeError(f"body must be the torch.optim.Optimizer of the model's other parameters, got "
                            f"{type(body).__name__}")
        _check_tree_layer(layer)
        in_body = {id(p) for group in body.param_groups for p in group["params"]}
        shared = [name for name, p in layer.named_parameters() if id(p) in in_body]
        if shared:
            raise ValueError(f"the layer's {', '.join(shared)} is also in the body's optimiser and would be updated "
                             "twice: build the body's optimiser over the other parameters only")
        self.body = body
        self.layer = layer
        self.layer_optimizer = RowSparseAdagrad(layer.parameters(), lr=lr, engine=engine)
        self.schedule_layer = bool(schedule_layer)
        if fuse:
            self.layer_optimizer.fuse(layer)
        self.defaults = body.defaults

    @property
    def param_groups(self) -> list[dict]:  # type: ignore[override]
        """The body's parameter groups, then the layer's with ``schedule_layer``: what a scheduler scales."""
        return self.body.param_groups + (self.layer_optimizer.param_groups if self.schedule_layer else [])

    @property
    def state(self) -> dict:  # type: ignore[override]
        """Both optimisers' per-parameter state (read-only view)."""
        return {**self.body.state, **self.layer_optimizer.state}

    def add_param_group(self, param_group: dict) -> None:
        """Add a group to the body's optimiser."""
        self.body.add_param_group(param_group)

    def body_parameters(self) -> list[Tensor]:
        """The parameters the body's optimiser updates."""
        return [p for group in self.body.param_groups for p in group["params"]]

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the body's gradients; returns their norm. The layer is
        left out: a fused layer was updated in its backward, and Adagrad divides each row's step by the
        root of its squared gradients, which makes it insensitive to their scale."""
        return torch.nn.utils.clip_grad_norm_(self.body_parameters(), max_norm, norm_type)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        """One step of both optimisers (``closure`` is evaluated once, before them)."""
        loss = _evaluate_closure(closure)
        self.body.step()
        self.layer_optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.body.zero_grad(set_to_none=set_to_none)
        self.layer_optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"body": self.body.state_dict(), "layer": self.layer_optimizer.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load what :meth:`state_dict` saved; ValueError for anything else (e.g. a single optimiser's state)."""
        if not isinstance(state_dict, dict) or set(state_dict) != {"body", "layer"}:
            raise ValueError("not a TreeModelOptimizer state: expected the dict of 'body' and 'layer' states that "
                             "TreeModelOptimizer.state_dict() returns")
        self.body.load_state_dict(state_dict["body"])
        self.layer_optimizer.load_state_dict(state_dict["layer"])

    def __repr__(self) -> str:
        return (f"TreeModelOptimizer(body={type(self.body).__name__}, layer=RowSparseAdagrad(lr="
                f"{self.layer_optimizer.param_groups[0]['lr']}), schedule_layer={self.schedule_layer})")
