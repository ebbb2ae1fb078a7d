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

__all__ = ["LogBilinearLM"]


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
    the layout of :meth:`hsm.data.LMCorpus.windows`) -> ``r_x`` [B, d].

    The papers write the flat softmax as ``softmax(r_x^T U + b)``, i.e. output embeddings tied to
    the input ones (inventory §2.1 [AMBIG]). A tree softmax has node vectors, not word vectors, so
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
        """``r_x`` for each row of ``contexts`` (word ids, oldest first)."""
        if not isinstance(contexts, Tensor):
            raise TypeError(f"contexts must be a torch.Tensor of word ids, got {type(contexts).__name__}")
        if contexts.dim() != 2 or contexts.shape[1] != self.context:
            raise ValueError(f"contexts must have shape [B, {self.context}] (T = {self.context} previous words), "
                             f"got {list(contexts.shape)}")
        if contexts.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"contexts must hold integer word ids, got dtype {contexts.dtype}")
        if contexts.numel() and (int(contexts.min()) < 0 or int(contexts.max()) >= self.vocab_size):
            raise ValueError(f"word ids must lie in 0..{self.vocab_size - 1}, got "
                             f"{int(contexts.min())}..{int(contexts.max())}")
        embedded = F.embedding(contexts, self.embedding.weight, sparse=self.sparse)  # [B, T, d]
        # position t of the window (oldest first) holds w_{t-(T-t)}: it gets R_{T-t}, i.e. R flipped
        return torch.einsum("btd,ted->be", embedded, self.context_weight.flip(0))

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, dim={self.dim}, context={self.context}, sparse={self.sparse}"
