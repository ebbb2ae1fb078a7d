"""The tree layer's training step fused in two Triton kernels (CUDA): every node of the batch read
once, its update applied where its gradient is made.

:mod:`hsm.engine` computes eq. 5 in a handful of torch ops, but each op passes over the batch's
``B * L`` node blocks (the gather, the logits, the backward's outer product, the optimiser's
reads and writes): at ``B = 128``, ``L = 3``, ``M = 65``, ``d = 200`` that is 20 MB per pass, where
the distinct nodes of a batch weigh a fraction of it. Here the (example, depth) pairs are sorted
by node, and one program per node segment of that order (grid: ``B * L`` programs, those not at
the start of a segment exit at once, so the launch does not depend on the data):

* forward (:func:`path_forward`): loads the node's ``[M, d]`` block once, in chunks of
  ``BLOCK_D`` columns, accumulates the logits ``W_n h_b`` of its pairs, then adds ``b_n`` and the
  empty slots' -inf, takes the log-softmax, writes it, and adds ``log softmax[c_d]`` to
  ``output[b]`` (eq. 5's sum over the path, by atomic adds: a row's L nodes are in L programs);
* backward with Adagrad (:func:`path_backward_adagrad_`): forms each pair's
  ``g_b (onehot(c_d) - softmax)``, then per chunk of columns the node's gradient
  ``G = sum over its pairs of (g_b (onehot - softmax)) h_b^T`` (the sum Adagrad squares: a node
  shared by many rows is updated once, as :class:`hsm.RowSparseAdagrad` updates a coalesced
  row), adds ``G^T``'s contribution to each row's input gradient (atomic adds), and applies
  ``state += G**2``, ``W_n -= lr G / (sqrt(state) + eps)`` in place; the bias likewise.

Padding steps (the engine's virtual node N) and ignored rows form the segment of node N, which
does nothing. The layer uses these kernels when a :class:`hsm.RowSparseAdagrad` is fused into it
(:meth:`hsm.RowSparseAdagrad.fuse`) and its tensors are on a CUDA device (:func:`applies`);
``TRITON_INTERPRET=1`` runs them on CPU tensors, which is how the tests check them against
:meth:`hsm.HierarchicalSoftmax.forward_reference` and the unfused optimiser. Triton is optional:
without it the layer runs :mod:`hsm.engine`'s torch ops.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import torch
from torch import Tensor

__all__ = ["FusedPathLogLikelihood", "applies", "available", "path_backward_adagrad_", "path_forward"]

#: columns of a node block a program holds at once
BLOCK_D = 64


def available() -> bool:
    """Whether Triton is installed."""
    return importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def applies(input: Tensor) -> bool:
    """Whether the fused kernels run for ``input``: float32, Triton installed, and a CUDA device
    (or any device under ``TRITON_INTERPRET=1``, Triton's interpreter)."""
    return input.dtype == torch.float32 and available() and (input.device.type == "cuda" or _interpreting())


@functools.cache
def _kernels(interpret: bool) -> tuple[Any, Any]:
    """The two kernels, compiled on first use (``interpret``: built for Triton's interpreter, which
    it decides when a kernel is defined)."""
    import triton
    import triton.language as tl

    @triton.jit
    def forward_kernel(input_ptr, weight_ptr, bias_ptr, penalty_ptr, rows_ptr, keys_ptr, order_ptr, starts_ptr,
                       ends_ptr, logits_ptr, log_probs_ptr, output_ptr, length, row_stride, slot_column, dim,
                       arity, virtual, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        p = tl.program_id(0)
        node = tl.load(keys_ptr + p)
        start = tl.load(starts_ptr + p)
        end = tl.load(ends_ptr + p)
        if (start == p) & (node != virtual):
            m = tl.arange(0, BLOCK_M)
            in_m = m < arity
            block = weight_ptr + node * arity * dim
            for d0 in range(0, dim, BLOCK_D):  # the node's block, once, a chunk of columns at a time
                cols = d0 + tl.arange(0, BLOCK_D)
                in_d = cols < dim
                w = tl.load(block + m[:, None] * dim + cols[None, :], mask=in_m[:, None] & in_d[None, :], other=0.0)
                for j in range(start, end):
                    example = tl.load(order_ptr + j) // length
                    h = tl.load(input_ptr + example * dim + cols, mask=in_d, other=0.0)
                    part = tl.sum(w * h[None, :], axis=1)
                    acc = tl.load(logits_ptr + j * arity + m, mask=in_m, other=0.0)
                    tl.store(logits_ptr + j * arity + m, acc + part, mask=in_m)
            tl.debug_barrier()
            offset = tl.load(penalty_ptr + node * arity + m, mask=in_m, other=0.0)
            if HAS_BIAS:
                offset += tl.load(bias_ptr + node * arity + m, mask=in_m, other=0.0)
            for j in range(start, end):
                pair = tl.load(order_ptr + j)
                example = pair // length
                child = tl.load(rows_ptr + example * row_stride + slot_column + pair % length) % arity
                x = tl.load(logits_ptr + j * arity + m, mask=in_m, other=0.0) + offset
                x = tl.where(in_m, x, float("-inf"))
                top = tl.max(x, axis=0)
                log_probs = x - (top + tl.log(tl.sum(tl.exp(x - top), axis=0)))
                tl.store(log_probs_ptr + pair * arity + m, log_probs, mask=in_m)
                tl.atomic_add(output_ptr + example, tl.sum(tl.where(m == child, log_probs, 0.0), axis=0))

    @triton.jit
    def backward_kernel(input_ptr, weight_ptr, bias_ptr, state_ptr, bias_state_ptr, rows_ptr, keys_ptr, order_ptr,
                        starts_ptr, ends_ptr, log_probs_ptr, grad_output_ptr, grad_logits_ptr, grad_input_ptr,
                        length, row_stride, slot_column, dim, arity, virtual, lr, eps, HAS_BIAS: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        p = tl.program_id(0)
        node = tl.load(keys_ptr + p)
        start = tl.load(starts_ptr + p)
        end = tl.load(ends_ptr + p)
        if (start == p) & (node != virtual):
            m = tl.arange(0, BLOCK_M)
            in_m = m < arity
            grad_bias = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for j in range(start, end):  # each pair's g_b (onehot(c) - softmax)
                pair = tl.load(order_ptr + j)
                example = pair // length
                child = tl.load(rows_ptr + example * row_stride + slot_column + pair % length) % arity
                probs = tl.exp(tl.load(log_probs_ptr + pair * arity + m, mask=in_m, other=float("-inf")))
                g = tl.load(grad_output_ptr + example)
                grad = g * (tl.where(m == child, 1.0, 0.0) - probs)
                grad = tl.where(in_m, grad, 0.0)
                tl.store(grad_logits_ptr + j * arity + m, grad, mask=in_m)
                grad_bias += grad
            tl.debug_barrier()
            block = weight_ptr + node * arity * dim
            state = state_ptr + node * arity * dim
            for d0 in range(0, dim, BLOCK_D):
                cols = d0 + tl.arange(0, BLOCK_D)
                in_d = cols < dim
                inside = in_m[:, None] & in_d[None, :]
                where = m[:, None] * dim + cols[None, :]
                w = tl.load(block + where, mask=inside, other=0.0)
                total = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
                for j in range(start, end):
                    example = tl.load(order_ptr + j) // length
                    grad = tl.load(grad_logits_ptr + j * arity + m, mask=in_m, other=0.0)
                    h = tl.load(input_ptr + example * dim + cols, mask=in_d, other=0.0)
                    total += grad[:, None] * h[None, :]
                    tl.atomic_add(grad_input_ptr + example * dim + cols, tl.sum(grad[:, None] * w, axis=0), mask=in_d)
                s = tl.load(state + where, mask=inside, other=0.0) + total * total
                tl.store(state + where, s, mask=inside)
                tl.store(block + where, w - lr * total / (tl.sqrt(s) + eps), mask=inside)
            if HAS_BIAS:
                s = tl.load(bias_state_ptr + node * arity + m, mask=in_m, other=0.0) + grad_bias * grad_bias
                tl.store(bias_state_ptr + node * arity + m, s, mask=in_m)
                b = tl.load(bias_ptr + node * arity + m, mask=in_m, other=0.0)
                tl.store(bias_ptr + node * arity + m, b - lr * grad_bias / (tl.sqrt(s) + eps), mask=in_m)

    return forward_kernel, backward_kernel


class _Plan:
    """The batch's pairs sorted by node (fixed shapes: a sort and two searches over ``B * L`` keys)."""

    def __init__(self, rows: Tensor, length: int) -> None:
        self.rows, self.length = rows, length
        keys = rows[:, length:2 * length].reshape(-1)  # the penalised node: N for padding
        self.keys, self.order = torch.sort(keys)
        self.starts = torch.searchsorted(self.keys, self.keys)
        self.ends = torch.searchsorted(self.keys, self.keys, right=True)


def _meta(arity: int) -> dict:
    import triton

    return dict(BLOCK_M=triton.next_power_of_2(arity), BLOCK_D=BLOCK_D)


def path_forward(input: Tensor, weight: Tensor, bias: Tensor | None, penalty: Tensor, rows: Tensor, length: int,
                 arity: int) -> tuple[Tensor, Tensor, _Plan]:
    """Eq. 5 for the rows of ``input`` [B, d]: ``(output [B], log_probs [B, L, M], plan)``.

    ``weight`` [N, M * d], ``bias`` [N, M] or None, ``penalty`` [N + 1, M] and ``rows`` [B, 3 L + 1]
    (each target's row of the engine's ``engine_paths``) as :mod:`hsm.engine` defines them;
    ``log_probs`` is written on the real steps only."""
    forward_kernel, _ = _kernels(_interpreting())
    plan = _Plan(rows, length)
    batch, dim = input.shape
    pairs = batch * length
    logits = input.new_zeros(pairs, arity)
    log_probs = input.new_zeros(batch, length, arity)
    output = input.new_zeros(batch)
    forward_kernel[(pairs,)](input, weight, bias if bias is not None else penalty, penalty, rows, plan.keys,
                             plan.order, plan.starts, plan.ends, logits, log_probs, output, length, rows.stride(0),
                             2 * length, dim, arity, penalty.shape[0] - 1, HAS_BIAS=bias is not None, **_meta(arity))
    return output, log_probs, plan


def path_backward_adagrad_(input: Tensor, weight: Tensor, bias: Tensor | None, state: Tensor,
                           bias_state: Tensor | None, plan: _Plan, log_probs: Tensor, grad_output: Tensor, lr: float,
                           eps: float) -> Tensor:
    """The gradient of ``output`` (:func:`path_forward`) times ``grad_output`` [B]: returns the
    input's [B, d], and applies Adagrad with the node gradients to ``weight`` / ``state`` (and
    ``bias`` / ``bias_state``) in place, each node once with the sum of its pairs' gradients."""
    _, backward_kernel = _kernels(_interpreting())
    batch, dim = input.shape
    arity = log_probs.shape[2]
    pairs = batch * plan.length
    grad_input = torch.zeros_like(input)
    grad_logits = input.new_empty(pairs, arity)
    has_bias = bias is not None
    backward_kernel[(pairs,)](input, weight, bias if has_bias else state, state, bias_state if has_bias else state,
                              plan.rows, plan.keys, plan.order, plan.starts, plan.ends, log_probs,
                              grad_output.contiguous(), grad_logits, grad_input, plan.length, plan.rows.stride(0),
                              2 * plan.length, dim, arity, weight.shape[0], float(lr), float(eps), HAS_BIAS=has_bias,
                              **_meta(arity))
    return grad_input


class FusedPathLogLikelihood(torch.autograd.Function):
    """Eq. 5 by :func:`path_forward`; the backward applies the fused optimiser's Adagrad update in
    place (:func:`path_backward_adagrad_`) and returns the input's gradient only: the weight and
    bias get a :class:`hsm.backend.FusedGradient` placeholder, which ``step()`` skips.

    Arguments: ``input`` [B, d], ``weight`` [N, M * d], ``bias`` [N, M] or None, ``penalty`` and
    ``rows`` (:mod:`hsm.engine`'s), ``length`` L, ``arity`` M, ``optimizer`` the fused
    :class:`hsm.RowSparseAdagrad`. Returns ``output`` [B] and ``log_probs`` [B, L, M] (not
    differentiable)."""

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Tensor | None, penalty: Tensor,  # type: ignore[override]
                rows: Tensor, length: int, arity: int, optimizer: Any) -> tuple[Tensor, Tensor]:
        """``(output [B], log_probs)`` of eq. 5 from the fused forward kernel; the node plan of the
        batch is kept for the backward."""
        output, log_probs, plan = path_forward(input.contiguous(), weight.detach(),
                                               None if bias is None else bias.detach(), penalty, rows, length, arity)
        ctx.plan, ctx.optimizer, ctx.params = plan, optimizer, (weight, bias)
        ctx.save_for_backward(input, log_probs)
        ctx.mark_non_differentiable(log_probs)
        return output, log_probs

    @staticmethod
    def backward(ctx, grad_output: Tensor, _grad_log_probs: Tensor | None):  # type: ignore[override]
        """The input's gradient; the weights and biases are updated in place by Adagrad inside the
        kernel and get a :class:`~hsm.backend.FusedGradient` placeholder."""
        from .backend import FusedGradient

        input, log_probs = ctx.saved_tensors
        weight, bias = ctx.params
        state, bias_state, lr, eps = ctx.optimizer.fused_state(weight, bias)
        grad_input = path_backward_adagrad_(input.contiguous(), weight.detach(),
                                            None if bias is None else bias.detach(), state, bias_state, ctx.plan,
                                            log_probs, grad_output, lr, eps)
        for param in (weight, bias):
            if param is not None and param.grad is None:
                param.grad = FusedGradient(param)
        return grad_input, None, None, None, None, None, None, None
