"""Language-modelling corpora as token-id tensors, and the context windows of the log-bilinear model.

The log-bilinear LM of the paper (arXiv §6, ICML §7.2) predicts word ``w_t`` from the ``T`` previous words
``w_{t-T}, ..., w_{t-1}``: ``T = 3`` on PTB and ``4`` on Gutenberg in the arXiv version, ``4`` in the ICML
version (the two versions disagree on PTB's T). :func:`context_windows` turns a token stream into those
(context, target) pairs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from hsm_lab.data.errors import EmptyCorpusError

EOS = "<eos>"
UNK = "<unk>"

Split = Literal["train", "valid", "test"]


def context_windows(tokens: torch.Tensor, T: int, pad_id: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All (T previous words, next word) pairs of a 1-D token stream.

    ``pad_id=None`` drops the first ``T`` tokens as targets (they lack a full history): ``N = len(tokens) - T``.
    ``pad_id=k`` prepends ``T`` copies of id ``k`` so that every token is a target (``N = len(tokens)``);
    :meth:`LMCorpus.windows` pads with ``<eos>``, which reads as "the stream starts after a sentence end" and
    makes the per-token perplexity cover every token of the split, as usual on PTB.

    Returns ``contexts`` of shape ``[N, T]`` (row ``i`` holds the ``T`` words before target ``i``, oldest first)
    and ``targets`` of shape ``[N]``, both int64. ``contexts`` is a strided *view* of one padded copy of the
    stream (no ``N x T`` copy is made: 40M Gutenberg tokens x 4 would be 1.3 GB); call ``.contiguous()`` on a
    slice before writing to it.
    """
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"tokens must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must hold integer ids, got dtype {tokens.dtype}")
    if not isinstance(T, int) or isinstance(T, bool) or T < 1:
        raise ValueError(f"context size T must be a positive int, got {T!r}")
    stream = tokens.to(torch.int64)
    if pad_id is not None:
        stream = torch.cat([torch.full((T,), int(pad_id), dtype=torch.int64), stream])
    if stream.numel() <= T:
        raise ValueError(f"a stream of {tokens.numel()} tokens has no window of {T} previous words")
    # unfold(0, T+1, 1) gives every run of T+1 consecutive ids: the first T are the context, the last the target.
    runs = stream.unfold(0, T + 1, 1)
    return runs[:, :T], runs[:, T]


@dataclass
class LMCorpus:
    """A language-modelling corpus: a vocabulary and three token-id streams.

    ``vocab[i]`` is the word of id ``i`` (ids are sorted by decreasing training count, ties alphabetically, so
    ``counts`` is non-increasing apart from the special tokens' placement; ``<eos>`` and ``<unk>`` are ordinary
    entries). ``train``/``valid``/``test`` are 1-D int64 tensors. ``counts[i]`` is the training count of id ``i``.
    ``context`` is the default window size ``T`` used by :meth:`windows`; ``stats`` holds corpus statistics
    (token counts, out-of-vocabulary rates, coverage) for reports.
    """

    name: str
    vocab: list[str]
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    counts: np.ndarray
    context: int | None = None
    stats: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for split in ("train", "valid", "test"):
            tensor = getattr(self, split)
            if tensor.dim() != 1 or tensor.dtype != torch.int64:
                raise TypeError(f"{self.name}.{split} must be a 1-D int64 tensor, "
                                f"got {tensor.dtype} {tuple(tensor.shape)}")
        if self.train.numel() == 0:
            raise EmptyCorpusError(f"{self.name}: the training split is empty")
        if len(self.counts) != len(self.vocab):
            raise ValueError(f"{self.name}: {len(self.counts)} counts for {len(self.vocab)} words")

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def index(self, word: str) -> int:
        """Id of ``word`` (``<unk>``'s id for an unknown word)."""
        if not hasattr(self, "_index") or len(self._index) != len(self.vocab):
            self._index = {w: i for i, w in enumerate(self.vocab)}
        return self._index.get(word, self._index.get(UNK, -1))

    @property
    def eos_id(self) -> int:
        return self.index(EOS)

    @property
    def unk_id(self) -> int:
        return self.index(UNK)

    def split(self, name: Split) -> torch.Tensor:
        if name not in ("train", "valid", "test"):
            raise ValueError(f"split must be 'train', 'valid' or 'test', got {name!r}")
        return getattr(self, name)

    def windows(self, split: Split, T: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``context_windows`` of a split, padded with ``<eos>`` so that every token is a target."""
        T = T if T is not None else self.context
        if T is None:
            raise ValueError(f"{self.name}: pass T (no default context size was given when loading)")
        return context_windows(self.split(split), T, pad_id=self.eos_id)

    def decode(self, ids: torch.Tensor | list[int]) -> list[str]:
        return [self.vocab[int(i)] for i in ids]

    def summary(self) -> dict[str, int]:
        """Counts for ``python -m hsm data info``."""
        return {
            "train_tokens": int(self.train.numel()),
            "valid_tokens": int(self.valid.numel()),
            "test_tokens": int(self.test.numel()),
            "vocab": self.vocab_size,
        }


def frequency_order(counts: dict[str, int]) -> list[str]:
    """Words sorted by decreasing count, ties alphabetically (a deterministic id order)."""
    return sorted(counts, key=lambda word: (-counts[word], word))
