"""(Bi)LSTM text classifier with a flat or a hierarchical softmax output (Schuurmans & Frasincar, 2020).

The model of Schuurmans & Frasincar §3-4: word embeddings -> (Bi)LSTM -> last hidden state ``h`` -> output layer.
The output layer is either the flat softmax over the C classes or the two-level hierarchical
softmax over the natural taxonomy, ``P(class) = P(category | root) P(class | category)`` (their
Eq. 1-3), i.e. :class:`hsm.HierarchicalSoftmax` on ``Tree.from_taxonomy`` (a taxonomy tree is not
balanced: the layer masks the empty child slots of small categories, so every node's softmax runs
over its real children only). Training minimises their cross-entropy Eq. 4-7, the sum over the
path of ``-log P(m_q | q)``; the gradients Eq. 8-9 are what autograd computes.

Pieces:

* :class:`TextVocabulary` / :func:`encode_texts`: the model's vocabulary from the training split
  (0 = padding, 1 = unknown) and padded, truncated id tensors;
* :class:`LSTMTextClassifier`: the network up to ``h`` (the paper's "last hidden state": for a
  BiLSTM the final forward state concatenated with the final backward state);
* :func:`classification_metrics`: macro-F1 (the mean of per-class F1, not the harmonic mean of
  macro-P and macro-R), macro-precision, macro-recall and micro-accuracy, as in their Tables 1-4.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from ._optional import require

__all__ = ["LSTMTextClassifier", "TextVocabulary", "classification_metrics", "encode_texts"]

PAD, UNK = 0, 1


@dataclass
class TextVocabulary:
    """Word types of the training split kept by the model: ``id_of_source[j]`` maps id ``j`` of the
    data set's encoding (a tokenised corpus) to a model id."""

    words: list[str]  #: model id -> word (ids 0 and 1 are <pad>, <unk>)
    id_of_source: np.ndarray  #: data-set token id -> model id (UNK for dropped types)

    @classmethod
    def from_texts(cls, texts, min_count: int = 1, max_size: int | None = None) -> "TextVocabulary":
        """Types of ``texts`` seen at least ``min_count`` times, the ``max_size`` most frequent."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        source_vocab = texts.vocab
        counts = np.bincount(np.asarray(texts.values, dtype=np.int64), minlength=len(source_vocab))
        order = np.argsort(-counts, kind="stable")
        order = order[counts[order] >= min_count]
        if max_size is not None:
            order = order[: max(max_size - 2, 0)]
        id_of_source = np.full(len(source_vocab), UNK, dtype=np.int64)
        id_of_source[order] = np.arange(2, order.size + 2)
        return cls(["<pad>", "<unk>"] + [source_vocab[i] for i in order], id_of_source)

    def __len__(self) -> int:
        return len(self.words)


def encode_texts(texts, vocab: TextVocabulary, max_tokens: int) -> Tensor:
    """``[N, T]`` model ids, each document truncated to its first ``max_tokens`` tokens and padded
    with 0 (``T`` = the longest kept length). An empty document becomes one ``<unk>``."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    lengths = np.minimum(texts.lengths(), max_tokens)
    width = max(int(lengths.max()) if lengths.size else 1, 1)
    out = np.zeros((len(texts), width), dtype=np.int64)
    for i in range(len(texts)):
        ids = texts.ids(i)[:max_tokens]
        if ids.size == 0:
            out[i, 0] = UNK
        else:
            out[i, : ids.size] = vocab.id_of_source[ids]
    return torch.from_numpy(out)


class LSTMTextClassifier(nn.Module):
    """Embeddings -> dropout -> (Bi)LSTM -> last hidden state -> dropout: ``h`` of size
    ``hidden_size * (2 if bidirectional else 1)``, to be fed to a :class:`hsm.FlatSoftmax` or
    :class:`hsm.HierarchicalSoftmax`.

    Input: ``[B, T]`` ids, 0-padded on the right (lengths are read off the padding).
    ``pretrained`` ([vocab, embed_dim]) initialises the embeddings (the paper: GloVe 300-d).
    """

    def __init__(self, vocab_size: int, embed_dim: int = 300, hidden_size: int = 150, bidirectional: bool = True,
                 dropout: float = 0.5, pretrained: Tensor | None = None) -> None:
        super().__init__()
        if vocab_size < 2 or embed_dim < 1 or hidden_size < 1:
            raise ValueError("vocab_size >= 2, embed_dim >= 1 and hidden_size >= 1 are required")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD)
        if pretrained is not None:
            if tuple(pretrained.shape) != (vocab_size, embed_dim):
                raise ValueError(f"pretrained must be [{vocab_size}, {embed_dim}], got {list(pretrained.shape)}")
            with torch.no_grad():
                self.embedding.weight.copy_(pretrained)
        self.lstm = nn.LSTM(embed_dim, hidden_size, batch_first=True, bidirectional=bidirectional)
        self.dropout = nn.Dropout(dropout)
        self.output_size = hidden_size * (2 if bidirectional else 1)

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.int64:
            raise ValueError(f"tokens must be an int64 [B, T] tensor, got {tokens.dtype} {list(tokens.shape)}")
        lengths = (tokens != PAD).sum(1).clamp_min(1)
        embedded = self.dropout(self.embedding(tokens))
        packed = pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)  # h_n: [directions, B, H], the state after each direction's last token
        hidden = h_n.transpose(0, 1).reshape(tokens.shape[0], -1)
        return self.dropout(hidden)


def classification_metrics(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray,
                           num_labels: int | None = None) -> dict[str, float]:
    """Macro-F1, macro-precision, macro-recall (in %) over the classes present in ``y_true`` or
    ``y_pred`` (scikit-learn's default; a class never predicted has precision 0), and accuracy (%).

    Macro-F1 is the mean of the per-class F1 scores (Schuurmans & Frasincar's main metric), which differs from
    the harmonic mean of macro-P and macro-R.
    """
    metrics = require("sklearn.metrics", "classification_scores")
    accuracy_score, precision_recall_fscore_support = metrics.accuracy_score, metrics.precision_recall_fscore_support

    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if y_true.shape != y_pred.shape or y_true.ndim != 1 or y_true.size == 0:
        raise ValueError("y_true and y_pred must be non-empty 1-d arrays of the same length")
    if num_labels is not None and (max(y_true.max(), y_pred.max()) >= num_labels or min(y_true.min(), y_pred.min()) < 0):
        raise ValueError(f"labels must lie in 0..{num_labels - 1}")
    precision, recall, f1, _ = precision_recall_fscore_support(y_true, y_pred, average="macro", zero_division=0)
    return {"f1": 100 * float(f1), "precision": 100 * float(precision), "recall": 100 * float(recall),
            "accuracy": 100 * float(accuracy_score(y_true, y_pred))}
