"""The bag-of-words text classifier of the ICML extreme-classification experiments (§7.1).

ICML §7.1: "the representation of a caption is obtained by summing the
embeddings of its words", ``f_Theta(x) = sum_{w in x} U_w`` with ``U_w in R^d``, ``d in {50, 200}``;
the output layer (flat softmax, Huffman tree, learned tree) turns ``f_Theta(x)`` into ``p(y | x)``.
The released code (a fastText fork, github.com/yjernite/fastTextLearnTree) *averages* the embeddings, as fastText does;
:class:`BagOfWordsClassifier` does either (``reduce="sum"`` or ``"mean"``).

Pieces:

* :class:`WordVocabulary`: the model's own vocabulary, built from the training split (a data
  set's ``vocab`` covers train and test; a model may only know the training words), mapping the
  data set's token ids to model ids, unknown words dropped;
* :func:`hashed_bigrams`: fastText's optional word n-grams (``-wordNgrams 2``), hashed into
  ``buckets`` extra rows;
* :class:`BagOfWordsClassifier`: ``nn.EmbeddingBag`` over word ids (+ bigram ids) -> ``[B, d]``;
* :func:`make_bags`: the ``(ids, offsets)`` pair of a batch of documents, for ``forward``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["BagOfWordsClassifier", "WordVocabulary", "hashed_bigrams", "make_bags"]

#: fastText's word-n-gram hash multiplier (``Dictionary::addWordNgrams``: ``h = h * 116049371 + id``).
_NGRAM_HASH = 116_049_371


class WordVocabulary:
    """A model vocabulary over the token ids of a data set's training split.

    Parameters
    ----------
    token_ids: the token ids of the training documents (all of them, flat), ids into the data
        set's ``vocab`` (``TokenizedTexts.values``).
    num_types: size of the data set's ``vocab`` (ids lie in ``0 .. num_types - 1``).
    min_count: keep words seen at least this often in training (fastText's ``-minCount``;
        1 for supervised training, its default).

    ``to_model[t]`` is the model id of data-set token ``t``, or -1 when the word is unknown.
    Model ids are given by decreasing frequency (ties by data-set id), as fastText orders its
    dictionary.
    """

    def __init__(self, token_ids: np.ndarray, num_types: int, min_count: int = 1) -> None:
        token_ids = np.asarray(token_ids)
        if token_ids.ndim != 1:
            raise ValueError(f"token_ids must be a flat array of token ids, got shape {token_ids.shape}")
        if num_types < 1:
            raise ValueError(f"num_types must be >= 1, got {num_types}")
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        if token_ids.size and (token_ids.min() < 0 or token_ids.max() >= num_types):
            raise ValueError(f"token ids must lie in 0..{num_types - 1}")
        counts = np.bincount(token_ids, minlength=num_types)
        kept = np.flatnonzero(counts >= min_count)
        kept = kept[np.argsort(-counts[kept], kind="stable")]
        if kept.size == 0:
            raise ValueError(f"no word occurs {min_count} times in the training texts")
        self.to_model = np.full(num_types, -1, dtype=np.int64)
        self.to_model[kept] = np.arange(kept.size)
        self.counts = counts[kept]
        self.min_count = min_count

    def __len__(self) -> int:
        return int(self.counts.size)

    def encode(self, values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map ragged data-set ids (``values``, ``offsets``) to model ids, dropping unknown words.

        Returns the new ``(values, offsets)``; a document of unknown words becomes an empty bag
        (its representation is the zero vector).
        """
        values = np.asarray(values)
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or offsets.size == 0 or offsets[0] != 0 or offsets[-1] != values.size:
            raise ValueError("offsets must start at 0 and end at len(values)")
        mapped = self.to_model[values]
        known = mapped >= 0
        doc = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
        new_offsets = np.zeros_like(offsets)
        np.cumsum(np.bincount(doc[known], minlength=offsets.size - 1), out=new_offsets[1:])
        return mapped[known], new_offsets


def hashed_bigrams(values: np.ndarray, offsets: np.ndarray, first_id: int, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Append each document's hashed word bigrams to its word ids (fastText ``-wordNgrams 2``).

    A bigram ``(a, b)`` of consecutive model ids gets id ``first_id + (a * 116049371 + b) mod
    buckets`` (fastText's hash of word ids). Returns the new ragged ``(values, offsets)``: each
    document's words, then its bigrams.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    values = np.asarray(values, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    num_docs = offsets.size - 1
    lengths = np.diff(offsets)
    doc = np.repeat(np.arange(num_docs), lengths)
    # a bigram starts at every position that is not the last of its document
    starts = np.flatnonzero(np.arange(values.size) + 1 < offsets[1:][doc]) if values.size else np.zeros(0, np.int64)
    bigram_ids = first_id + (values[starts] * _NGRAM_HASH + values[starts + 1]) % buckets
    bigram_doc = doc[starts]
    all_doc = np.concatenate([doc, bigram_doc])
    all_ids = np.concatenate([values, bigram_ids])
    is_bigram = np.concatenate([np.zeros(values.size, bool), np.ones(bigram_ids.size, bool)])
    order = np.lexsort((is_bigram, all_doc))  # by document, words before bigrams, stable
    new_offsets = np.zeros(num_docs + 1, dtype=np.int64)
    np.cumsum(np.bincount(all_doc, minlength=num_docs), out=new_offsets[1:])
    return all_ids[order], new_offsets


def make_bags(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray | Sequence[int]) -> tuple[Tensor, Tensor]:
    """The ``(ids, offsets)`` tensors of documents ``rows`` of a ragged array, for
    :meth:`BagOfWordsClassifier.forward` (``nn.EmbeddingBag``'s input format)."""
    rows = np.asarray(rows, dtype=np.int64)
    starts, ends = offsets[rows], offsets[rows + 1]
    lengths = ends - starts
    bag_offsets = np.zeros(rows.size, dtype=np.int64)
    if rows.size > 1:
        np.cumsum(lengths[:-1], out=bag_offsets[1:])
    gather = np.repeat(starts - bag_offsets, lengths) + np.arange(int(lengths.sum()))
    return torch.from_numpy(np.ascontiguousarray(values[gather], dtype=np.int64)), torch.from_numpy(bag_offsets)


class BagOfWordsClassifier(nn.Module):
    """``f_Theta(x)``: the sum (ICML §7.1) or mean (fastText, the released code) of the word
    embeddings of ``x``, optionally with hashed bigrams.

    Parameters
    ----------
    vocab_size: number of word ids (a :class:`WordVocabulary`'s length).
    dim: d, the representation size (ICML: 50 and 200).
    ngrams: 1 (bag of words, the paper) or 2 (adds ``buckets`` hashed-bigram rows; bigram ids
        come from :func:`hashed_bigrams` with ``first_id=vocab_size``).
    reduce: ``"mean"`` (fastText) or ``"sum"`` (the ICML text).
    buckets: hashed-bigram rows when ``ngrams=2`` (fastText's default is 2,000,000).
    sparse: sparse embedding gradients (a step touches only the rows of the batch's words;
        ``torch.optim.SGD`` and ``Adagrad`` accept them).

    The embeddings start uniform in ``[-1/d, 1/d]``, fastText's initialisation of its input
    matrix. Shape: ``ids`` [T] (all documents' ids, concatenated), ``offsets`` [B] (where each
    document starts) -> ``[B, d]``; an empty document gives the zero vector.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        ngrams: int = 1,
        reduce: Literal["mean", "sum"] = "mean",
        buckets: int = 2_000_000,
        sparse: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        if not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if ngrams not in (1, 2):
            raise ValueError(f"ngrams must be 1 (words) or 2 (words + hashed bigrams), got {ngrams!r}")
        if reduce not in ("mean", "sum"):
            raise ValueError(f"reduce must be 'mean' (fastText) or 'sum' (ICML §7.1), got {reduce!r}")
        if ngrams == 2 and buckets < 1:
            raise ValueError(f"buckets must be >= 1 with ngrams=2, got {buckets}")
        self.vocab_size = int(vocab_size)
        self.dim = int(dim)
        self.ngrams = ngrams
        self.reduce = reduce
        self.buckets = int(buckets) if ngrams == 2 else 0
        self.embedding = nn.EmbeddingBag(self.vocab_size + self.buckets, self.dim, mode=reduce, sparse=sparse)
        self.reset_parameters()

    @property
    def num_ids(self) -> int:
        """Rows of the embedding table: words, then bigram buckets."""
        return self.vocab_size + self.buckets

    def reset_parameters(self) -> None:
        """fastText's input-matrix initialisation, uniform in ``[-1/d, 1/d]``."""
        with torch.no_grad():
            self.embedding.weight.uniform_(-1.0 / self.dim, 1.0 / self.dim)

    def forward(self, ids: Tensor, offsets: Tensor) -> Tensor:
        if not isinstance(ids, Tensor) or not isinstance(offsets, Tensor):
            raise TypeError("ids and offsets must be torch tensors (see hsm.text_models.make_bags)")
        if ids.dim() != 1 or offsets.dim() != 1:
            raise ValueError(f"ids and offsets must be 1-D, got shapes {list(ids.shape)} and {list(offsets.shape)}")
        if ids.dtype not in (torch.int64, torch.int32) or offsets.dtype not in (torch.int64, torch.int32):
            raise TypeError("ids and offsets must be integer tensors")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_ids):
            raise ValueError(f"word ids must lie in 0..{self.num_ids - 1} (vocab_size={self.vocab_size}, "
                             f"buckets={self.buckets})")
        if offsets.numel() and (int(offsets[0]) != 0 or bool((offsets[1:] < offsets[:-1]).any())
                                or int(offsets[-1]) > ids.numel()):
            raise ValueError("offsets must start at 0, be non-decreasing and not exceed len(ids)")
        return self.embedding(ids, offsets)

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, dim={self.dim}, ngrams={self.ngrams}, reduce={self.reduce!r}"
