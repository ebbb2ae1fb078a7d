"""Representation models f_Theta(x) that feed an output layer (flat or tree softmax).

This file is shared: each experiment topic adds its own model class here.

* :class:`LogBilinearLM`: the log-bilinear language model of the papers' §6 (arXiv §6, ICML §7.2).
  (A ``BagOfWords`` text classifier for the ICML §7.1 experiments is to be added by the
  classification topic.)

Every model maps its input to a representation ``h`` of shape ``[B, dim]``; the output layer
(:class:`hsm.HierarchicalSoftmax` or :class:`hsm.FlatSoftmax`) turns ``h`` into ``log p(y | h)``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import kernels
from .backend import without_autocast

__all__ = ["LogBilinearLM"]

#: the compiled path (:func:`hsm.kernels.run_lbl_forward`) is used for float32 CPU parameters
#: unless this is False (tests compare both paths)
USE_KERNELS = True


def _compiled_applies(weight: Tensor, context_weight: Tensor, use_kernels: bool = True) -> bool:
    return (USE_KERNELS and use_kernels and weight.device.type == "cpu" and context_weight.device.type == "cpu"
            and weight.dtype == torch.float32 and context_weight.dtype == torch.float32
            and weight.is_contiguous() and context_weight.is_contiguous())


class _LogBilinear(torch.autograd.Function):
    """``r_x = sum_k U[w_{t-k}] R_k^T`` and its gradients, as plain matrix products on views.

    float32 CPU parameters: the same products in the compiled kernels of :mod:`hsm.kernels`
    (:func:`~hsm.kernels.lbl_forward`, :func:`~hsm.kernels.lbl_backward`), on the threads the
    output layer's kernels use and with BLAS at one thread, and the context rows' gradient summed
    per word (:func:`~hsm.kernels.sum_rows_by_id`: a coalesced sparse gradient). The point is not
    the products themselves (MKL is as fast) but that a training step then never wakes torch's
    OpenMP threads, whose spinning after each parallel region took the cores the layer's kernels
    need (see :meth:`LogBilinearLM.forward`). Elsewhere (other dtypes, devices), torch's ops:

    Forward: the context rows are gathered once, position-major ([T, B, d], so each position's
    block is contiguous), and ``r_x`` is accumulated with one ``addmm`` per position against
    ``R_k^T``, a transposed *view* (BLAS reads it as is; a transposed copy of R costs a third
    of the forward here). Backward: ``dL/dR_k = g^T U[w_{t-k}]`` (one product per k, written
    straight into the gradient) and the context rows' gradient ``g R_k`` per position, returned
    for the ``B * T`` rows as a sparse COO gradient (``sparse``, duplicates not yet summed:
    the optimiser sums them, as for ``F.embedding``'s) or added into a dense one."""

    @staticmethod
    @without_autocast
    def forward(ctx, contexts: Tensor, weight: Tensor, context_weight: Tensor, sparse: bool,
                use_kernels: bool = True) -> Tensor:
        batch, context = contexts.shape
        # ids position-major, newest first: row k * B + b is w_{t-1-k} of example b, which gets R_{k+1}
        ids = contexts.flip(1).t().reshape(-1).long()
        ctx.compiled = _compiled_applies(weight, context_weight, use_kernels)
        if ctx.compiled:
            out, gathered = kernels.run_lbl_forward(weight.detach().numpy(), ids.numpy(),
                                                    context_weight.detach().numpy(), batch)
            out, gathered = torch.from_numpy(out), torch.from_numpy(gathered)
        else:
            gathered = weight.index_select(0, ids).view(context, batch, weight.shape[1])
            out = torch.mm(gathered[0], context_weight[0].t())
            for k in range(1, context):
                out.addmm_(gathered[k], context_weight[k].t())
        ctx.save_for_backward(ids, gathered, context_weight)
        ctx.sparse = sparse
        ctx.vocab_size = weight.shape[0]
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    @without_autocast
    def backward(ctx, grad_out: Tensor):
        ids, gathered, context_weight = ctx.saved_tensors
        context, batch, dim = gathered.shape
        need_weight, need_context = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_weight = grad_context = None
        if ctx.compiled:
            grad_np = grad_out.detach().to(gathered.dtype).contiguous().numpy()
            grad_context_np, rows_np = kernels.run_lbl_backward(grad_np, gathered.numpy(),
                                                                context_weight.detach().numpy(), need_context,
                                                                need_weight)
            if need_context:
                grad_context = torch.from_numpy(grad_context_np)
            if need_weight and ctx.sparse:
                # repeated words summed here (deterministically), rows in increasing order: the
                # optimiser takes it as it is (RowSparseAdagrad checks the order instead of sorting)
                unique, summed = kernels.sum_rows_by_id(ids.numpy(), rows_np.reshape(context * batch, dim))
                return None, torch.sparse_coo_tensor(torch.from_numpy(unique)[None], torch.from_numpy(summed),
                                                     (ctx.vocab_size, dim), check_invariants=False,
                                                     is_coalesced=True), grad_context, None, None
            rows = torch.from_numpy(rows_np)
        else:
            if need_context:
                grad_context = torch.empty_like(context_weight)
                grad_t = grad_out.t()
                for k in range(context):
                    torch.mm(grad_t, gathered[k], out=grad_context[k])
            if need_weight:
                rows = grad_out.new_empty(context, batch, dim)
                for k in range(context):
                    torch.mm(grad_out, context_weight[k], out=rows[k])
        if need_weight:
            rows = rows.view(context * batch, dim)
            if ctx.sparse:
                grad_weight = torch.sparse_coo_tensor(ids[None], rows, (ctx.vocab_size, dim),
                                                      check_invariants=False)
            else:
                grad_weight = rows.new_zeros(ctx.vocab_size, dim).index_add_(0, ids, rows)
        return None, grad_weight, grad_context, None, None


class LogBilinearLM(nn.Module):
    """The log-bilinear context representation of §6 (Mnih & Hinton 2009's LBL):

    ``r_x = sum_{k=1}^{T} R_k U_{w_{t-k}}``

    with input word embeddings ``U`` ([V, d]) and one ``d x d`` matrix ``R_k`` per context
    position. There is no non-linearity: ``p(w_t | x)`` is a (flat or tree) softmax of ``r_x``.

    Parameters
    ----------
    vocab_size: V, the number of word ids in the context.
    dim: d, the embedding and representation size (papers: 200).
    context: T, the number of previous words (arXiv: 3 on PTB, 4 on Gutenberg; ICML: 4).
    sparse: give ``U`` sparse gradients (a step then touches only the ``B * T`` rows of the
        batch; ``torch.optim.Adagrad`` and ``SGD`` accept them). The ``R_k`` are always dense.

    Shape: ``contexts`` [B, T] of word ids, oldest first (``contexts[:, -1]`` is ``w_{t-1}``,
    the layout of a language-model corpus's context windows) -> ``r_x`` [B, d].

    The papers write the flat softmax as ``softmax(r_x^T U + b)``, i.e. output embeddings tied to
    the input ones (ICML eq. 1-2; the papers do not say whether U is shared). A tree softmax has node vectors, not word vectors, so
    it cannot be tied; to compare the output layers on equal terms we use an untied output layer
    for the flat softmax too (:class:`hsm.FlatSoftmax`).
    """

    def __init__(self, vocab_size: int, dim: int = 200, context: int = 3, sparse: bool = False) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("dim", dim), ("context", context)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.vocab_size = vocab_size
        self.dim = dim
        self.context = context
        self.sparse = sparse
        #: float32 CPU parameters run the compiled kernels unless this is False (then torch's
        #: products; e.g. next to an output layer that runs on torch's OpenMP threads itself)
        self.use_kernels = True
        self.embedding = nn.Embedding(vocab_size, dim, sparse=sparse)  # U
        # R[k - 1] = R_k, the matrix applied to the word k positions back
        self.context_weight = nn.Parameter(torch.empty(context, dim, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``U ~ N(0, 1/d)`` (unit-norm rows on average) and ``R_k = I / T + N(0, 0.01/d)``:
        at initialisation ``r_x`` is about the mean of the context embeddings, a sensible
        starting point for a model with no non-linearity (the papers do not say how they
        initialise)."""
        with torch.no_grad():
            self.embedding.weight.normal_(0.0, 1.0 / math.sqrt(self.dim))
            eye = torch.eye(self.dim).expand(self.context, self.dim, self.dim)
            self.context_weight.copy_(eye / self.context + 0.1 * torch.randn_like(eye) / math.sqrt(self.dim))

    def forward(self, contexts: Tensor) -> Tensor:
        """``r_x`` for each row of ``contexts`` (word ids, oldest first).

        Raises TypeError unless ``contexts`` is an int64 / int32 tensor, ValueError for another
        shape than [B, T] or a word id outside ``0..V-1``.

        Computed as ``T`` matrix products ``U[w_{t-k}] R_k^T`` accumulated into one [B, d] result,
        with a hand-written backward (:class:`_LogBilinear`): ``torch.einsum`` (kept as
        :meth:`forward_reference`) copies ``R`` flipped and transposed and runs batched products,
        2.6 times the CPU time of the three plain products a step needs at V = 250k, d = 200,
        B = 128, T = 4 (4.4 ms against 1.7 ms on one thread, development measurement). Same
        values and gradients up to float rounding (tests/test_models.py)."""
        if not isinstance(contexts, Tensor):
            raise TypeError(f"contexts must be a torch.Tensor of word ids, got {type(contexts).__name__}")
        if contexts.dim() != 2 or contexts.shape[1] != self.context:
            raise ValueError(f"contexts must have shape [B, {self.context}] (T = {self.context} previous words), "
                             f"got {list(contexts.shape)}")
        if contexts.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"contexts must hold integer word ids, got dtype {contexts.dtype}")
        use_kernels = getattr(self, "use_kernels", True)
        if contexts.numel() and _compiled_applies(self.embedding.weight, self.context_weight, use_kernels):
            # the compiled kernels index without bounds checks: check first (free on the CPU)
            self._check_ids(contexts)
        try:
            # elsewhere index_select checks the bounds: an IndexError on the CPU, a device-side
            # assert on a GPU, and no read back from the device (the step stays capturable)
            return _LogBilinear.apply(contexts, self.embedding.weight, self.context_weight, self.sparse, use_kernels)
        except IndexError:
            self._check_ids(contexts)
            raise

    def _check_ids(self, contexts: Tensor) -> None:
        low, high = (int(v) for v in torch.aminmax(contexts))
        if low < 0 or high >= self.vocab_size:
            raise ValueError(f"word ids must lie in 0..{self.vocab_size - 1}, got {low}..{high}")

    def forward_reference(self, contexts: Tensor) -> Tensor:
        """The plain autograd computation of :meth:`forward` (``F.embedding`` and one ``einsum``),
        which the fast path is tested against; no input checks."""
        embedded = F.embedding(contexts, self.embedding.weight, sparse=self.sparse)  # [B, T, d]
        # position t of the window (oldest first) holds w_{t-(T-t)}: it gets R_{T-t}, i.e. R flipped
        return torch.einsum("btd,ted->be", embedded, self.context_weight.flip(0))

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, dim={self.dim}, context={self.context}, sparse={self.sparse}"
