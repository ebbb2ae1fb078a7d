"""A fast compiled CPU trainer for the bag-of-words classifier of ICML §7.1 (book: the classification chapter).

:class:`FastBowClassifier` trains the model of :mod:`hsm.text_models` (``f(x)`` = sum or mean of
the word embeddings) with a flat softmax, an M-ary Huffman tree or a learned tree (Algorithm 1
with AssignLabels = Algorithm 2) as its output layer, the way fastText and the authors' fork
(github yjernite/fastTextLearnTree, ``src/model.cc``, ``src/fasttext.cc``, ``src/lomtree.cc``)
train it, and is used like fastText::

    from hsm.classifiers.fast_classifier import FastBowClassifier
    clf = FastBowClassifier(dim=50, output="learned", arity=5, lr=0.1, epochs=5)
    clf.fit(docs, labels)                   # docs: list of int arrays of word ids, or (values, offsets)
    labels, log_probs = clf.predict(docs, k=1)
    clf.test(docs, gold)                    # {'examples': n, 'precision_at_1': ..., 'recall_at_1': ...}

or on fastText's ``__label__`` files, read as fastText reads them (:mod:`hsm.classifiers.fasttext_format`;
``python -m hsm supervised / test / predict`` runs these, :mod:`hsm.classifiers.fasttext_cli`)::

    clf.fit_file("train.txt", word_ngrams=2)
    clf.test_file("test.txt", k=5)         # fastText's N, P@5, R@5
    clf.predict_file("test.txt", k=2)      # [[('__label__baking', 0.61), ('__label__bread', 0.12)], ...]
    clf.save("model.bin"); clf = FastBowClassifier.load("model.bin")

How it trains (what a PyTorch training loop over the bag-of-words model does with a
batch of one, in one compiled pass per example, no Python per example):

* **Per-example SGD** (fastText's ``Model::update``): ``h`` = sum / mean of the document's
  embedding rows; for every node of the label's path (eq. 5; the flat softmax is one node with K
  children), the node softmax ``p``, ``alpha_m = lr_t (1[m = c] - p_m)``, the input gradient
  ``g += alpha_m W_{n,m}`` (old weights), the update ``W_{n,m} += alpha_m h``, ``b_{n,m} += alpha_m``;
  then every word row of the document gets ``g`` (divided by the length for the mean). That is
  exactly one step of plain SGD on ``-log p(y | x)`` at rate ``lr_t`` (the path's nodes are
  distinct rows, so updating one before computing the next changes nothing): the tests check the
  parameters and per-example losses against PyTorch (BagOfWordsClassifier + HierarchicalSoftmax /
  FlatSoftmax + ``torch.optim.SGD``).
* **Rate**: ``lr_t = lr (1 - t / T)`` (fastText's linear decay; ``t`` examples done of ``T``), or
  for the learned tree ``lr min(1, 2 (1 - t / T))`` (constant for the first half, then linear: the
  released fork's ``lr *= 2; lr = min(lr, args.lr)`` for ``-loss lom``, and ``train_bow``'s).
* **Hogwild** (fastText's threads, Recht et al. 2011): ``threads`` threads each run the kernel on a
  contiguous slice of the (shuffled) examples, reading and writing the shared parameters with no
  locks; with ``threads=1`` training is deterministic. A thread's k-th example is given progress
  ``t = start + k * threads + thread_index``: the threads advance together, as in fastText, so the
  rate schedule is the same as one thread's. The threads are :mod:`hsm.kernels`' pool (nogil kernels).
* **Algorithm 1**: during tree learning the kernel also accumulates the node statistics
  SumProbas / Counts (from the node softmax computed *before* the update, NodeCompute) per
  (label, depth), the layout of :class:`hsm.NodeStatistics`; between two chunks of examples (once
  per rebuild, never per example) Python runs :func:`hsm.assign.assign_labels_well_formed`
  (Algorithm 2; :func:`hsm.assign.assign_labels_depth_constrained`, Algorithm 3 of the ICML
  supplement, with ``depth="fixed"``) on them and installs the new tree.

Options the paper leaves open (the classification chapter's section on statistics and schedule):

* ``statistics="ours"``: :class:`hsm.NodeStatistics` (keyed by (label, depth), sums dropped when
  the label's node changes, decayed by ``decay`` at every rebuild, a pseudo-count ``prior`` read
  with ``prior_mode``); ``statistics="released"``: :class:`ReleasedStatistics`, the fork's policy
  (keyed by (node, label), never reset, kept when a label moves away and found again when it
  comes back, never decayed with the default ``decay=1``; a new pair starts with one
  pseudo-example of ``0.5 / M`` on every child plus ``0.5`` on child ``position mod M``).
* ``schedule="first_half"``: ``rebuilds`` AssignLabels calls evenly spread over the first half of
  training (every ``half // rebuilds`` examples), then the tree is frozen (ICML §11.1,
  ``train_bow``); ``schedule="every_tokens"``: the fork's schedule (``FastText::trainThread``): a
  check every ``rebuild_tokens`` training tokens (fastText's ``lrUpdateRate``, 100,000), a rebuild
  at a check once the tokens seen reach ``next``, then ``next += period`` (``period = tokens of
  training / 2 / rebuilds``) while ``next + 1 < tokens of training / 2``: at most one rebuild per
  check, so on a small data set rebuilds go on to near the end of training. Two differences from
  the fork, so that results do not depend on the thread count: the tokens are counted over all
  threads (the fork's thread 0 checks its own count, and rebuilds while the other threads wait),
  and the rate's progress ``t / T`` is counted in examples (the fork's in tokens).

Prediction (:meth:`FastBowClassifier.predict`) is exact: a compiled depth-first branch and bound
over the tree (fastText's ``dfsM`` with its bound), the full softmax for flat.

Layout: this module holds the classifier's API, its input checks, the inference kernels and
:class:`ReleasedStatistics`; the training driver (the SGD kernel, the Hogwild chunks, the rebuild
plans, AssignLabels between chunks) is :class:`hsm.classifiers.fast_trainer.HogwildTrainer`.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numba
import numpy as np
import torch

from hsm.atomic import atomic_write
from hsm._checks import check_choice, check_logits_finite, check_count, check_fraction, check_positive
from hsm.classifiers.fasttext_format import SettingError
from hsm.classifiers.fast_trainer import FitHistory, HogwildTrainer, output_arrays
from hsm import kernels
from hsm.kernels import FASTMATH
from hsm.layers import FlatSoftmax, HierarchicalSoftmax
from hsm.objective import RankingScore, check_ranking_score
from hsm.statistics import NodeStatistics, ReleasedStatistics
from hsm.text_models import BagOfWordsClassifier
from hsm.tree import Tree, check_integer

if TYPE_CHECKING:
    from hsm.label_addition import LabelAddition

__all__ = ["FastBowClassifier", "FitHistory", "ModelFileError", "Prediction", "SettingError",
           "as_ragged", "fixed_depth_start"]


class ModelFileError(ValueError):
    """A model file :meth:`FastBowClassifier.load` cannot read: not written by
    :meth:`FastBowClassifier.save`, written by another version of the format, or damaged."""

# ---------------------------------------------------------------------------------------------- kernels
@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _representations(values, offsets, embedding, mean, out):  # pragma: no cover - compiled
    """``out[b]`` = sum (or mean) of document b's embedding rows (:class:`BagOfWordsClassifier`)."""
    dim = embedding.shape[1]
    for b in range(offsets.shape[0] - 1):
        first, last = offsets[b], offsets[b + 1]
        for j in range(dim):
            out[b, j] = 0.0
        for t in range(first, last):
            for j in range(dim):
                out[b, j] += embedding[values[t], j]
        if mean and last > first:
            for j in range(dim):
                out[b, j] /= np.float32(last - first)


def as_ragged(docs: Any, name: str = "docs") -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)`` int64 arrays of a list of documents (each a sequence of int word ids),
    of a ``(values, offsets)`` tuple (``offsets`` from 0 to ``len(values)``, non-decreasing), or of
    an object with ``values`` and ``offsets`` attributes (a ragged array).

    Only a *tuple* of two is read as ``(values, offsets)``; a list is always a list of documents.
    Raises TypeError for non-integer ids and ValueError for an empty list, negative ids or bad
    offsets, naming the document."""
    if hasattr(docs, "values") and hasattr(docs, "offsets") and not isinstance(docs, dict):
        docs = (docs.values, docs.offsets)
    if isinstance(docs, tuple) and len(docs) == 2:
        values, offsets = (np.asarray(part) for part in docs)
        if values.ndim != 1 or offsets.ndim != 1:
            raise ValueError(f"{name}: (values, offsets) must be two 1-D arrays, got shapes {values.shape} and "
                             f"{offsets.shape}")
        for part, what in ((values, "values"), (offsets, "offsets")):
            if part.size and part.dtype.kind not in "iu":
                raise TypeError(f"{name}: {what} must hold integers, got dtype {part.dtype}")
        values = values.astype(np.int64, copy=False)
        offsets = offsets.astype(np.int64, copy=False)
        if offsets.size < 2:
            raise ValueError(f"{name} is empty (offsets must hold at least [0, len(values)])")
        if offsets[0] != 0 or offsets[-1] != values.size or (np.diff(offsets) < 0).any():
            raise ValueError(f"{name}: offsets must start at 0, be non-decreasing and end at len(values) = "
                             f"{values.size}")
    else:
        if isinstance(docs, (str, bytes)) or not isinstance(docs, Sequence):
            raise TypeError(f"{name} must be a list of int arrays (word ids) or a (values, offsets) tuple, got "
                            f"{type(docs).__name__}")
        if len(docs) == 0:
            raise ValueError(f"{name} is empty: no documents")
        parts = []
        for index, doc in enumerate(docs):
            array = np.asarray(doc)
            if array.ndim != 1:
                raise ValueError(f"{name}[{index}] must be a 1-D sequence of word ids, got shape {array.shape}")
            if array.size and array.dtype.kind not in "iu":
                raise TypeError(f"{name}[{index}] must hold integer word ids, got dtype {array.dtype}")
            parts.append(array.astype(np.int64, copy=False))
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([p.size for p in parts], out=offsets[1:])
        values = np.concatenate(parts) if offsets[-1] else np.zeros(0, dtype=np.int64)
    if values.size and values.min() < 0:
        doc = int(np.searchsorted(offsets, int(np.argmax(values < 0)), side="right")) - 1
        raise ValueError(f"{name}[{doc}] holds a negative word id ({int(values.min())})")
    return np.ascontiguousarray(values), np.ascontiguousarray(offsets)


def as_labels(labels: Any, count: int, name: str = "labels") -> tuple[np.ndarray, np.ndarray]:
    """Ragged ``(values, offsets)`` of one label per example (a 1-D int array), of a sequence of
    label sets (multi-label: each a non-empty int sequence) or of an object with ``values`` and
    ``offsets`` attributes (a multi-label ragged array)."""
    if hasattr(labels, "values") and hasattr(labels, "offsets") and not isinstance(labels, dict):
        values, offsets = as_ragged(labels, name)
        if (np.diff(offsets) == 0).any():
            raise ValueError(f"{name}[{int(np.argmax(np.diff(offsets) == 0))}] is an empty label set")
        if offsets.size - 1 != count:
            raise ValueError(f"{offsets.size - 1} {name} for {count} documents")
        return unique_label_sets(values, offsets)
    if isinstance(labels, (str, bytes)):
        raise TypeError(f"{name} must be an int array or a list of int arrays, got a string")
    array = None
    try:
        array = np.asarray(labels)
    except ValueError:  # ragged: a list of label sets
        pass
    if array is not None and array.dtype != object and array.ndim == 1:
        if array.size and array.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integer label ids, got dtype {array.dtype}")
        values = array.astype(np.int64, copy=False)
        offsets = np.arange(values.size + 1, dtype=np.int64)
    else:
        if not isinstance(labels, Sequence):
            raise TypeError(f"{name} must be an int array or a list of int arrays, got {type(labels).__name__}")
        parts = []
        for index, item in enumerate(labels):
            part = np.atleast_1d(np.asarray(item))
            if part.ndim != 1 or part.size == 0:
                raise ValueError(f"{name}[{index}] must be a label id or a non-empty 1-D set of label ids")
            if part.dtype.kind not in "iu":
                raise TypeError(f"{name}[{index}] must hold integer label ids, got dtype {part.dtype}")
            parts.append(part.astype(np.int64, copy=False))
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([p.size for p in parts], out=offsets[1:])
        values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if offsets.size - 1 != count:
        raise ValueError(f"{offsets.size - 1} {name} for {count} documents")
    if values.size and values.min() < 0:
        raise ValueError(f"unknown label {int(values.min())} in {name}: label ids are >= 0")
    return unique_label_sets(np.ascontiguousarray(values), offsets)


def unique_label_sets(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ragged label sets ``(values, offsets)`` with each set's repeated labels kept once, in the
    order of their first appearance (the arrays themselves when nothing repeats).

    A gold set is a set: ``[3, 3, 5]`` is ``{3, 5}``. A repeated label would otherwise be drawn
    twice as often in training (one label per example per epoch, uniformly among its labels) and
    would count twice among the gold labels, lowering recall for the same predictions."""
    lengths = np.diff(offsets)
    if values.size == 0 or lengths.max() <= 1:
        return values, offsets
    doc = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    keys = doc * (int(values.max()) + 1) + values  # (document, label) as one int64 key
    first = np.unique(keys, return_index=True)[1]
    if first.size == values.size:
        return values, offsets
    keep = np.sort(first)
    new_offsets = np.zeros_like(offsets)
    np.cumsum(np.bincount(doc[keep], minlength=lengths.size), out=new_offsets[1:])
    return np.ascontiguousarray(values[keep]), new_offsets


#: an inferred size (largest id + 1) is refused when it exceeds this many times the distinct ids
#: seen, plus :data:`SPARSE_IDS_SLACK`: one stray id (a label 10**6 among labels 0..9) would
#: otherwise build, and train, a model of a million rows that no example uses
SPARSE_IDS_FACTOR = 10
SPARSE_IDS_SLACK = 1000


def physical_memory() -> int | None:
    """Bytes of physical memory (None where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return None


#: the share of the physical memory beyond which a model's weights are refused before allocating
MEMORY_SHARE = 0.8


def beyond_memory(need: int) -> int | None:
    """This machine's physical memory in bytes when ``need`` bytes exceed :data:`MEMORY_SHARE` of
    it, else None (also where the platform does not say): what a size check refuses before
    allocating, so that a model too large fails in one line rather than in the allocator."""
    have = physical_memory()
    return have if have is not None and need > MEMORY_SHARE * have else None


def _available_memory() -> int | None:
    """Bytes a new allocation can get without swapping or the out-of-memory killer: Linux's
    ``MemAvailable`` (free memory plus the caches the kernel can drop), else the physical
    memory (None where the platform says neither). Physical memory alone lets a model that
    fits on paper start while other processes hold most of it, and be killed minutes later."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return physical_memory()


def check_inferred_size(ids: np.ndarray, size: int, what: str, option: str) -> None:
    """ValueError when ``size`` (the largest of ``ids`` plus one) is far beyond the distinct ids."""
    distinct = int(np.unique(ids).size)
    if size > SPARSE_IDS_FACTOR * distinct + SPARSE_IDS_SLACK:
        raise ValueError(f"the largest {what} id {size - 1} would size the model for {size:,} {what}s, but only "
                         f"{distinct:,} distinct {what} ids appear: renumber them 0..{distinct - 1} "
                         f"(np.unique(ids, return_inverse=True)), or pass {option}={size} if you mean it")


def fixed_depth_start(counts: np.ndarray, arity: int) -> Tree:
    """Algorithm 3's starting tree for labels with training ``counts``: the complete ``arity``-ary
    tree of the smallest depth D with ``arity**D >= K``, filled with the labels in order of count
    (:meth:`hsm.Tree.balanced`), so that the most frequent labels share subtrees, as they do near a
    Huffman root."""
    return Tree.balanced(np.argsort(-np.asarray(counts), kind="stable"), arity)


#: float32 values of ``f(x)`` that :meth:`FastBowClassifier.predict` holds at a time (64 MiB)
PREDICT_BLOCK = 1 << 24

#: float64 values drawn at a time for the embeddings' initialisation (:meth:`FastBowClassifier.init_model`):
#: drawing all V x d at once would hold twice the float32 table again in float64
INIT_BLOCK = 1 << 20


def model_bytes(num_words: int, num_labels: int, dim: int, arity: int, output: str, threads: int = 1,
                fixed_depth: bool = False) -> int:
    """An upper estimate of the memory that building and training a model of these sizes takes
    beyond what the data take: the float32 embeddings (V x d), the initialisation's float64
    block (:data:`INIT_BLOCK`, at least one row), the output weights and biases (K x d for flat;
    N x M x d for a tree: N <= K / (M - 1) + 2 nodes for a Huffman tree, which Algorithm 2 keeps,
    the complete tree's (M^D - 1) / (M - 1) for ``fixed_depth``), the tree's tables and
    Algorithm 1's statistics (K x depth x M, with a copy at each rebuild), and every thread's
    buffers (the kernel's ``h`` and gradient, d each). Plain SGD keeps no optimiser state and the
    kernels update the tensors in place (no gradient copies). A test checks the estimate against
    the peak memory of real runs, which it exceeds by its headroom less 1-2 MB."""
    block = min(num_words, max(1, INIT_BLOCK // dim)) * dim
    depth = 1
    if output == "flat":
        slots, nodes = num_labels, 1
    else:
        while arity**depth < num_labels:
            depth += 1
        nodes = (arity**depth - 1) // (arity - 1) if fixed_depth else num_labels // max(arity - 1, 1) + 2
        slots = nodes * arity
        depth += 2  # a Huffman tree of skewed counts is deeper than the complete tree
    total = 4 * dim * num_words + 8 * block + 4 * dim * slots + 4 * slots
    total += 8 * num_words + 8 * (num_labels + 2 * arity) * depth * 6 + 8 * nodes * arity * 3  # ids, paths, tables
    if output == "learned":
        total += 2 * 4 * (num_labels + arity) * depth * (arity + 2)  # SumProbas, Counts, and their copy
    total += max(int(threads), 1) * (2 * 4 * dim + 4 * max(arity, num_labels if output == "flat" else arity))
    # headroom for what is not counted above: the allocator's rounding, the encoded documents'
    # per-epoch orders and losses, small temporaries (measured: about 1-2 MB on small runs)
    return int(total * 1.05) + (16 << 20)


def _training_sizes(values: np.ndarray, label_values: np.ndarray, num_words: int | None,
                    num_labels: int | None) -> tuple[int, int]:
    """(num_words, num_labels) of a fresh fit: the given sizes, checked against the largest ids
    of the training data, or those ids plus one. An inferred size far beyond the distinct ids
    seen (:data:`SPARSE_IDS_FACTOR`) is refused before anything is allocated; a size given
    explicitly is taken as meant."""
    seen_words = int(values.max()) + 1 if values.size else 1
    if num_words is None:
        check_inferred_size(values, seen_words, "word", "num_words")
        num_words = seen_words
    elif check_integer(num_words, "num_words") < seen_words:
        raise ValueError(f"word id {seen_words - 1} is outside 0..num_words-1 = 0..{num_words - 1}")
    seen_labels = int(label_values.max()) + 1
    if num_labels is None:
        check_inferred_size(label_values, seen_labels, "label", "num_labels")
        num_labels = seen_labels
    elif check_integer(num_labels, "num_labels") < seen_labels:
        raise ValueError(f"unknown label {seen_labels - 1}: num_labels={num_labels} gives labels "
                         f"0..{num_labels - 1}")
    if num_labels < 2:
        raise ValueError(f"a classifier needs K >= 2 labels, got K = {num_labels}")
    return num_words, num_labels


# ---------------------------------------------------------------------------------------------- the classifier
class Prediction(NamedTuple):
    """``labels`` [n, k] (most likely first) and their ``log_probs`` [n, k] (natural log)."""

    labels: np.ndarray
    log_probs: np.ndarray


class FastBowClassifier:
    """The bag-of-words classifier of ICML §7.1, trained by compiled per-example Hogwild SGD.

    Parameters
    ----------
    dim: d, the embedding size (ICML: 50 and 200).
    output: ``"flat"`` (softmax over all K labels), ``"huffman"`` (the M-ary Huffman tree of the
        training label counts, plus one; arity 2 is fastText's ``-loss hs``), or ``"learned"``
        (Algorithm 1, started from that Huffman tree as the released code does).
    arity: M, children per node of the tree outputs.
    lr: the initial learning rate (per example); ICML §7.1's grid is 0.01 ... 0.5.
    epochs: passes over the training data.
    threads: Hogwild threads (default ``torch.get_num_threads()``); 1 is deterministic.
    reduce: ``"mean"`` of the embeddings (fastText, the released code) or ``"sum"`` (ICML text).
    lr_schedule: ``"linear"`` (``lr (1 - progress)``, fastText), ``"constant_then_linear"``
        (``lr min(1, 2 (1 - progress))``, the paper's and the fork's learned-tree schedule: the
        rate stays at ``lr`` while the tree is learned, in the first half) or ``"auto"`` (the
        latter for ``output="learned"``, else the former; the book's experiments rely on it).
        ``python -m hsm supervised`` uses ``"linear"`` for every loss unless ``-lrSchedule`` says
        otherwise: at fastText's large tutorial rates (``-lr 1.0``) half of training at the full
        rate loses precision.
    rebuilds: AssignLabels calls (ICML §11.1: 50; the fork's ``-lomUpdates``).
    schedule: when they happen: ``"first_half"`` or ``"every_tokens"`` (module docstring).
    rebuild_tokens: tokens between two checks for ``"every_tokens"`` (fastText's ``lrUpdateRate``).
    statistics: ``"ours"`` (:class:`hsm.NodeStatistics`) or ``"released"`` (:class:`ReleasedStatistics`).
    decay, prior, prior_mode: the statistics' decay per rebuild (1: never, what ``train_bow``
        and the fork use; applies to both policies), the ``"ours"`` pseudo-count and prior
        (:mod:`hsm.statistics`; ``prior`` also scales :class:`ReleasedStatistics`'
        pseudo-example; ``prior_mode`` is ``"ours"`` only).
    score: AssignLabels' ranking score, ``"eq12"`` (ICML eq. 12, the released code's) or ``"eq10"``
        (eq. 10).
    reset_moved_nodes: re-initialise the parameters of nodes Algorithm 2 places somewhere new
        (the released code keeps them; so does ``train_bow`` by default).
    depth: ``"free"``: the learned tree starts from the Huffman tree and Algorithm 2 may deepen it;
        ``"fixed"`` (``output="learned"`` only): it starts from the complete M-ary tree of the
        smallest depth D with ``M**D >= K``, filled with the labels in order of frequency
        (:meth:`hsm.Tree.balanced`), and rebuilds use Algorithm 3 of the ICML supplement, which keeps
        every label at depth D: a bound on the nodes a test-time descent evaluates.
    bias: a bias per child slot (our layers have one; fastText's output matrix has none, nor has
        ``python -m hsm supervised``'s: at a small ``lr`` on balanced labels the bias, moved by
        ``alpha`` per example against the weights' ``alpha h`` with ``|h| ~ 1/d``, follows the
        last examples' labels and hides what the words have learned).
    shuffle: visit the examples in a new random order every epoch (``train_bow``); False keeps
        the given order (fastText reads its file in order: shuffle the file once yourself).
    seed: seeds the embeddings' initialisation, the orders and the labels drawn for
        multi-label examples.

    Attributes after :meth:`fit`: ``model`` (a :class:`hsm.text_models.BagOfWordsClassifier`),
    ``layer`` (:class:`hsm.HierarchicalSoftmax` or :class:`hsm.FlatSoftmax`; the kernels train
    their tensors in place, so they are usable with the PyTorch path, e.g. ``layer.predict``),
    ``tree`` (the tree in place, None for
    flat), ``start_tree``, ``statistics`` and ``history`` (:class:`FitHistory`).

    Word ids: ``0 .. num_words - 1``; ``num_words`` is the largest training id plus one unless
    given to :meth:`fit`. Hashed bigrams: append them with :func:`hsm.text_models.hashed_bigrams`
    and pass ``num_words = vocabulary + buckets``. A document without words has ``f(x) = 0``.

    Raises TypeError for a setting of the wrong type (``arity=2.0``, ``lr="0.1"``) and ValueError
    for one out of range (``lr <= 0``, ``arity < 2``, an unknown ``output``, ``decay`` outside
    [0, 1], ...), naming it.
    """

    def __init__(
        self,
        dim: int = 50,
        output: Literal["flat", "huffman", "learned"] = "learned",
        arity: int = 5,
        lr: float = 0.1,
        epochs: int = 5,
        threads: int | None = None,
        reduce: Literal["mean", "sum"] = "mean",
        lr_schedule: Literal["auto", "linear", "constant_then_linear"] = "auto",
        rebuilds: int = 50,
        schedule: Literal["first_half", "every_tokens"] = "first_half",
        rebuild_tokens: int = 100_000,
        statistics: Literal["ours", "released"] = "ours",
        decay: float = 1.0,
        prior: float = 1.0,
        prior_mode: Literal["current_child", "uniform"] = "current_child",
        score: RankingScore | None = None,
        reset_moved_nodes: bool = False,
        bias: bool = True,
        shuffle: bool = True,
        seed: int = 0,
        depth: Literal["free", "fixed"] = "free",
    ) -> None:
        self.dim = check_count(dim, "dim", 1)
        self.output = check_choice(output, "output", ("flat", "huffman", "learned"))
        self.arity = check_count(arity, "arity", 2, shown="arity M")
        self.lr = check_positive(lr, "lr")
        self.epochs = check_count(epochs, "epochs", 1)
        if threads is not None and check_integer(threads, "threads") < 1:
            raise ValueError(f"threads must be >= 1 or None, got {threads}")
        self.threads = threads
        self.reduce = check_choice(reduce, "reduce", ("mean", "sum"), described="'mean' (fastText) or 'sum' (ICML §7.1)")
        self.lr_schedule = check_choice(lr_schedule, "lr_schedule", ("auto", "linear", "constant_then_linear"))
        self.rebuilds = check_count(rebuilds, "rebuilds", 0)
        self.schedule = check_choice(schedule, "schedule", ("first_half", "every_tokens"))
        self.rebuild_tokens = check_count(rebuild_tokens, "rebuild_tokens", 1)
        self.statistics_policy = check_choice(statistics, "statistics", ("ours", "released"))
        self.decay = check_fraction(decay, "decay")
        self.prior = check_positive(prior, "prior")
        self.prior_mode = check_choice(prior_mode, "prior_mode", ("current_child", "uniform"))
        self.score: RankingScore = check_ranking_score(score, default="eq12")
        self.reset_moved_nodes = bool(reset_moved_nodes)
        self.bias = bool(bias)
        self.shuffle = bool(shuffle)
        self.seed = check_count(seed, "seed", 0)  # numpy's generators take seeds >= 0
        self.depth = check_choice(depth, "depth", ("free", "fixed"))
        if self.depth == "fixed" and self.output != "learned":
            raise ValueError(f"depth='fixed' (Algorithm 3) applies to a learned tree, got output={self.output!r}: "
                             f"use output='learned' or depth='free'")
        self.model: BagOfWordsClassifier | None = None
        self.layer: HierarchicalSoftmax | FlatSoftmax | None = None
        self.start_tree: Tree | None = None
        self.statistics: NodeStatistics | ReleasedStatistics | None = None
        self.history = FitHistory()

    # ------------------------------------------------------------------ set-up
    @property
    def tree(self) -> Tree | None:
        """The tree in place (None for the flat softmax or before :meth:`init_model`)."""
        return getattr(self.layer, "tree", None) if isinstance(self.layer, HierarchicalSoftmax) else None

    @property
    def num_words(self) -> int:
        self._check_fitted()
        return self.model.num_ids

    @property
    def num_labels(self) -> int:
        self._check_fitted()
        return self.layer.num_labels

    def init_model(self, num_words: int, label_counts: Any) -> "FastBowClassifier":
        """Build the model and output layer afresh (what :meth:`fit` does unless ``warm_start``):
        embeddings uniform in ``[-1/d, 1/d]`` (fastText's, seeded by ``seed``), output parameters
        zero (fastText's output matrix; every run starts from the uniform distribution), the
        Huffman tree of ``label_counts + 1``."""
        num_words = check_integer(num_words, "num_words")
        if num_words < 1:
            raise ValueError(f"num_words must be >= 1, got {num_words}")
        counts = np.asarray(label_counts, dtype=np.float64)
        if counts.ndim != 1 or counts.size < 2:
            shown = counts.size if counts.ndim == 1 else counts.shape
            raise ValueError(f"a classifier needs K >= 2 labels, got {shown}")
        if (counts < 0).any() or not np.isfinite(counts).all():
            raise ValueError("label_counts must be finite and non-negative")
        if self.output != "flat" and self.arity > counts.size:
            raise ValueError(f"arity M = {self.arity} exceeds the K = {counts.size} labels: a node has at most K "
                             f"children; use arity <= {counts.size}")
        # refused before allocating: an out-of-memory kill has no message (and may hit another process)
        threads = self.threads or torch.get_num_threads()
        need = model_bytes(num_words, counts.size, self.dim, self.arity, self.output, threads,
                           fixed_depth=self.depth == "fixed")
        have = _available_memory()
        if have is not None and need > have:
            raise SettingError("dim", f"a model of {num_words:,} words and {counts.size:,} labels at {{name}} "
                                      f"{self.dim} needs about {need / 2**30:.1f} GiB to train, more than the "
                                      f"{have / 2**30:.1f} GiB of memory available: lower {{name}}, or check "
                                      "the number of words and labels")
        with torch.random.fork_rng(devices=[]):  # the layers' own initialisations, overwritten below, draw from
            # torch's global generator: leave the caller's stream as it was
            model, layer = self._new_modules(num_words, counts)
        rng = np.random.default_rng(self.seed)
        bound = 1.0 / self.dim
        # drawn a block of rows at a time: the generator's stream, and so the table, is the one a
        # single (num_words, dim) draw gives, without its float64 copy of the whole table
        rows = max(1, INIT_BLOCK // self.dim)
        with torch.no_grad():
            weight = model.embedding.weight
            for first in range(0, num_words, rows):
                last = min(num_words, first + rows)
                weight[first:last].copy_(torch.from_numpy(rng.uniform(-bound, bound, (last - first, self.dim))))
            for parameter in layer.parameters():
                parameter.zero_()
        self.model, self.layer = model, layer
        self.statistics = None
        self.history = FitHistory()
        return self

    def _new_modules(self, num_words: int,
                     counts: np.ndarray) -> tuple[BagOfWordsClassifier, HierarchicalSoftmax | FlatSoftmax]:
        """The model and the output layer (with :attr:`start_tree`), parameters not yet set."""
        model = BagOfWordsClassifier(num_words, self.dim, reduce=self.reduce, sparse=True)
        if self.output == "flat":
            self.start_tree = None
            return model, FlatSoftmax(self.dim, counts.size, bias=self.bias)
        if self.depth == "fixed":
            self.start_tree = fixed_depth_start(counts, self.arity)
        else:
            self.start_tree = Tree.huffman(counts + 1.0, self.arity)
        return model, HierarchicalSoftmax(self.dim, self.start_tree, bias=self.bias, sparse=True)

    def _check_fitted(self) -> None:
        if self.model is None or self.layer is None:
            raise RuntimeError("the classifier has no model yet: call fit (or init_model) first")

    # ------------------------------------------------------------------ training
    def fit(self, docs: Any, labels: Any, num_words: int | None = None, num_labels: int | None = None,
            warm_start: bool = False, record_losses: bool = False) -> "FastBowClassifier":
        """Train on ``docs`` (a list of int arrays of word ids, or a ``(values, offsets)`` tuple)
        and ``labels`` (one int per document, or a list of label sets: multi-label documents are
        trained on one of their labels drawn uniformly per epoch, as fastText does).

        ``num_words`` / ``num_labels``: sizes when the training data do not show the largest
        id. ``warm_start``: continue from the current model, layer and tree (set up by a previous
        fit or :meth:`init_model`) instead of building them afresh. ``record_losses``: keep every
        example's loss and the visiting orders in :attr:`history`.

        Raises ValueError for an empty ``docs``, fewer than 2 labels, a label or word id outside
        the model's range, or mismatched lengths; TypeError for non-integer ids;
        FloatingPointError naming the epoch and example when a loss is not finite (lower ``lr``);
        :class:`SettingError` when the model would not fit in the memory available (lower ``dim``).

        Ctrl-C (KeyboardInterrupt) is seen between two short runs of the compiled kernel (a
        fraction of a second apart, :data:`hsm.classifiers.fast_trainer.STEP_WORK`): training stops there and
        the model is left partly trained (nothing is written to disk by ``fit``).
        """
        values, offsets = as_ragged(docs)
        num_docs = offsets.size - 1
        label_values, label_offsets = as_labels(labels, num_docs)
        if warm_start:
            self._check_fitted()
            self._check_ids(values, offsets, "docs")
            if label_values.size and label_values.max() >= self.num_labels:
                raise ValueError(f"unknown label {int(label_values.max())}: the model has labels "
                                 f"0..{self.num_labels - 1}")
        else:
            num_words, num_labels = _training_sizes(values, label_values, num_words, num_labels)
            self.init_model(num_words, np.bincount(label_values, minlength=num_labels))
        learned = self.output == "learned"
        if learned and self.statistics is None:
            tree = self.layer.tree
            self.statistics = (NodeStatistics(tree, prior=self.prior, decay=self.decay, prior_mode=self.prior_mode)
                               if self.statistics_policy == "ours"
                               else ReleasedStatistics(tree, prior=self.prior, decay=self.decay))
        self.history = HogwildTrainer(self).train(values, offsets, label_values, label_offsets, record_losses)
        return self

    # ------------------------------------------------------------------ inference
    def _check_ids(self, values: np.ndarray, offsets: np.ndarray, name: str) -> None:
        if values.size and values.max() >= self.num_words:
            doc = int(np.searchsorted(offsets, int(np.argmax(values >= self.num_words)), side="right")) - 1
            raise ValueError(f"{name}[{doc}] holds word id {int(values.max())}, outside the model's "
                             f"0..{self.num_words - 1}")

    def representations(self, docs: Any, name: str = "docs") -> torch.Tensor:
        """``f(x)`` [n, d] of every document (sum or mean of its embeddings); ``name``: what errors
        call ``docs``."""
        self._check_fitted()
        values, offsets = as_ragged(docs, name=name)
        self._check_ids(values, offsets, name)
        out = np.empty((offsets.size - 1, self.dim), dtype=np.float32)
        _representations(values, offsets, self.model.embedding.weight.data.numpy(), self.reduce == "mean", out)
        return torch.from_numpy(out)

    def add_labels(self, docs_per_label: Sequence[Any], names: Sequence[str] | None = None,
                   placement: str = "objective", seed: int = 0, local_steps: int = 0,
                   local_lr: float = 0.1, reference_docs: Any = None,
                   rehearsal: tuple[Any, Any] | None = None) -> "LabelAddition":
        """Add labels this model was not trained on, without retraining: ``docs_per_label[i]``
        holds a few documents (word-id arrays, as :meth:`fit` takes) of new label ``K + i``; their
        representations place it in the tree by Algorithm 2's pair score
        (:func:`hsm.label_addition.add_labels`, under the model's depth rule). ``names``: the new
        labels' names, required when the model was trained on a file (its dictionary names every
        label). Trained labels keep their paths and parameters (unless ``local_steps``). Algorithm
        1's statistics are reset for the grown tree (they are training state). ``reference_docs``:
        a sample of documents the model already serves (its training data, say), which the new
        labels' slots are calibrated against (``reference`` of :func:`~hsm.label_addition.add_labels`).
        ``rehearsal`` = (documents, their trained labels): examples mixed into the ``local_steps``
        (``rehearsal`` of :func:`~hsm.label_addition.add_labels`), so that training the new labels'
        paths does not take the trained labels' documents. Tree outputs only (``output="huffman"`` or
        ``"learned"``)."""
        from hsm.label_addition import add_labels, check_placement

        self._check_fitted()
        check_placement(placement, seed)
        if not isinstance(self.layer, HierarchicalSoftmax):
            raise ValueError("add_labels places labels in a tree: this model's output is flat (train it with "
                             "output='huffman' or 'learned')")
        if isinstance(docs_per_label, (str, bytes)) or not isinstance(docs_per_label, Sequence) or not docs_per_label:
            raise ValueError("docs_per_label must be a non-empty list with the documents of each new label")
        if self.dictionary is not None and (names is None or len(names) != len(docs_per_label)):
            raise ValueError(f"this model was trained on a file: give names for the {len(docs_per_label)} new labels")
        if self.dictionary is not None:
            prefix = self.dictionary.label_prefix
            names = [name if not isinstance(name, str) or name.startswith(prefix) else prefix + name
                     for name in names]
            self.dictionary.check_new_labels(names)  # names a fastText file can hold, new and distinct
        examples = []
        for index, docs in enumerate(docs_per_label):
            values, offsets = as_ragged(docs, name=f"docs_per_label[{index}]")
            if offsets.size < 2:
                raise ValueError(f"docs_per_label[{index}] holds no document: a new label needs at least one")
            examples.append(self.representations((values, offsets)))
        reference = self.representations(reference_docs, "reference_docs") if reference_docs is not None else None
        if rehearsal is not None:
            if not (isinstance(rehearsal, (tuple, list)) and len(rehearsal) == 2):
                raise TypeError("rehearsal must be a pair (documents, their trained labels)")
            rehearsal = (self.representations(rehearsal[0], "rehearsal documents"),
                         torch.as_tensor(np.asarray(rehearsal[1], dtype=np.int64)))
        result = add_labels(self.layer, examples, statistics=None, score=self.score, placement=placement, seed=seed,
                            local_steps=local_steps, local_lr=local_lr, reference=reference, rehearsal=rehearsal)
        self.statistics = None
        if self.dictionary is not None:
            self.dictionary.add_labels(names, [e.shape[0] for e in examples])
        return result

    def add_labels_file(self, path: str | Path, placement: str = "objective", seed: int = 0, local_steps: int = 0,
                        local_lr: float = 0.1, reference_path: str | Path | None = None,
                        reference_lines: int = 2000) -> tuple["LabelAddition", dict[str, int]]:
        """:meth:`add_labels` from a fastText file: every label of ``path`` the model does not know
        is added, from the lines that carry it (a line with two new labels is an example of
        both); lines with known labels only are skipped. ``reference_path``: a file the model
        already serves (its training file, say), of which the first ``reference_lines`` lines
        calibrate the new slots. Returns what :meth:`add_labels` did and counts: ``labels`` added,
        ``lines`` used, ``skipped`` lines, and of the lines used, those with ``no_known_word`` (the
        model reads them as an empty document: they say nothing of their label). ValueError naming
        the file when it holds no new label."""
        from hsm.label_addition import check_placement

        reference_lines = check_count(reference_lines, "reference_lines", 1)
        check_placement(placement, seed)  # before the file is read and encoded
        encoded, lines = self._file_rows(path)
        rows_of = self.dictionary.unknown_labels(lines)
        if not rows_of:
            raise ValueError(f"{path}: no line has a label the model does not know ({self.num_labels} labels "
                             "known); nothing to add")
        docs = [encoded.subset(np.asarray(rows, dtype=np.int64)).docs for rows in rows_of.values()]
        reference = None
        if reference_path is not None:
            seen = self._file_rows(reference_path)[0]
            if seen.offsets.size < 2:
                raise ValueError(f"reference file {reference_path} holds no line: give lines the model already serves "
                                 f"(its training file, say)")
            reference = seen.subset(np.arange(min(reference_lines, seen.offsets.size - 1))).docs
        used = np.asarray(sorted({row for rows in rows_of.values() for row in rows}), dtype=np.int64)
        # a line of words the model never saw is the empty document to it (at most </s>): no evidence
        empty_line = self.dictionary.encode([""]).values
        informative = np.concatenate([[0], np.cumsum(~np.isin(encoded.values, empty_line))])
        known_words = (informative[encoded.offsets[1:]] - informative[encoded.offsets[:-1]])[used]
        result = self.add_labels(docs, names=list(rows_of), placement=placement, seed=seed, local_steps=local_steps,
                                 local_lr=local_lr, reference_docs=reference)
        return result, {"labels": len(rows_of), "lines": int(used.size), "skipped": len(lines) - int(used.size),
                        "no_known_word": int((known_words <= 0).sum())}

    @torch.no_grad()
    def predict(self, docs: Any, k: int = 1) -> Prediction:
        """The ``k`` most likely labels of every document and their log-probabilities, exact:
        the layer's compiled best-first branch and bound for trees (:func:`hsm.kernels.topk_search`,
        exact like fastText's ``dfsM``; equal values ordered by label id), rows split over torch's
        threads; ``torch.topk`` of the full softmax for flat. Equal log-probabilities are ordered by
        label id, the lowest first, on every path and for every k.

        Documents go through in blocks of :data:`PREDICT_BLOCK` floats of ``f(x)`` (whole
        multiples of 4,096 rows up to d = 4,096), so that memory does not grow with the number
        of documents times d; each row's result does not depend on the blocks."""
        self._check_fitted()
        k = check_integer(k, "k")
        if not 1 <= k <= self.num_labels:
            raise ValueError(f"k must lie in 1..K = 1..{self.num_labels}, got {k}")
        values, offsets = as_ragged(docs)
        self._check_ids(values, offsets, "docs")
        n = offsets.size - 1
        rows = max(1, PREDICT_BLOCK // self.dim)
        rows = rows - rows % 4096 if rows >= 4096 else rows
        if n <= rows:
            return self._predict_block(self.representations((values, offsets)), k)
        parts = []
        for first in range(0, n, rows):
            last = min(n, first + rows)
            block = (values[offsets[first] : offsets[last]], offsets[first : last + 1] - offsets[first])
            parts.append(self._predict_block(self.representations(block), k))
        return Prediction(np.concatenate([p.labels for p in parts]), np.concatenate([p.log_probs for p in parts]))

    def _predict_block(self, h: torch.Tensor, k: int) -> Prediction:
        """:meth:`predict` of the representations ``h`` [n, d]."""
        layer = self.layer
        if isinstance(layer, FlatSoftmax):
            labels, log_probs = [], []
            for chunk in h.split(4096):
                top = layer.topk(chunk, k)
                labels.append(top.indices.numpy())
                log_probs.append(top.values.numpy())
            return Prediction(np.concatenate(labels).astype(np.int64), np.concatenate(log_probs).astype(np.float64))
        tables = layer.tables
        weight, bias, penalty = output_arrays(layer, self.dim)[:3]
        values, labels, _ = kernels.run_topk_search(h.numpy(), weight, bias, penalty, tables.child_node,
                                                    tables.child_label, k, tables.paths[0].shape[1])
        check_logits_finite(np.flatnonzero(np.isnan(values).any(axis=1)), values.shape[0], torch.float32)
        return Prediction(labels, values.astype(np.float64))

    @torch.no_grad()
    def log_prob(self, docs: Any, labels: Any = None) -> np.ndarray:
        """``log p(label | doc)`` [n] for one label per document (eq. 5), or, with ``labels=None``,
        the log-probabilities of all K labels [n, K]."""
        self._check_fitted()
        h = self.representations(docs)
        if labels is None:
            return torch.cat([self.layer.log_prob(chunk) for chunk in h.split(1024)]).double().numpy()
        target = np.asarray(labels)
        if target.ndim != 1 or (target.size and target.dtype.kind not in "iu"):
            raise TypeError("labels must be a 1-D int array, one label per document")
        if target.size != h.shape[0]:
            raise ValueError(f"{target.size} labels for {h.shape[0]} documents")
        if target.size and (target.min() < 0 or target.max() >= self.num_labels):
            bad = int(target.min()) if target.min() < 0 else int(target.max())
            raise ValueError(f"unknown label {bad}: the model has labels 0..{self.num_labels - 1}")
        return self.layer(h, torch.from_numpy(target.astype(np.int64))).output.double().numpy()

    def test(self, docs: Any, labels: Any, k: int = 1) -> dict[str, float]:
        """fastText's ``test``: ``precision_at_k`` (correct labels among the top k, over n k) and
        ``recall_at_k`` (correct labels among the top k, over all gold labels), as fractions, and
        ``examples``. ``labels``: one label per document or label sets (multi-label)."""
        self._check_fitted()
        values, offsets = as_ragged(docs)
        label_values, label_offsets = as_labels(labels, offsets.size - 1)
        if label_values.size and label_values.max() >= self.num_labels:
            raise ValueError(f"unknown label {int(label_values.max())}: the model has labels 0..{self.num_labels - 1}")
        predicted = self.predict((values, offsets), k).labels
        n = offsets.size - 1
        # a hit is a predicted (document, label) pair among the gold pairs: compared as int64 keys
        gold_keys = np.repeat(np.arange(n), np.diff(label_offsets)) * self.num_labels + label_values
        predicted_keys = np.arange(n)[:, None] * self.num_labels + predicted
        hits = int(np.isin(predicted_keys, gold_keys).sum())
        return {"examples": n, f"precision_at_{k}": hits / (n * k), f"recall_at_{k}": hits / label_values.size}

    # ------------------------------------------------------------------ fastText's text files
    #: the dictionary of the training file (:mod:`hsm.classifiers.fasttext_format`) after :meth:`fit_file`, or None
    dictionary: Any = None

    def fit_file(self, path: str | Path, word_ngrams: int = 1, min_count: int = 1, bucket: int = 2_000_000,
                 label: str = "__label__", record_losses: bool = False) -> "FastBowClassifier":
        """Train on a fastText file (``__label__a __label__b words ...`` per line; ``"-"``: standard
        input), read as fastText reads it (:mod:`hsm.classifiers.fasttext_format`: whitespace tokens, ``</s>``
        ending every line, words seen at least ``min_count`` times, hashed word n-grams up to
        ``word_ngrams`` in ``bucket`` buckets, label prefix ``label``); lines without a label are
        skipped. What ``python -m hsm supervised`` runs. Then :meth:`test_file`,
        :meth:`predict_file` and :meth:`save` use the same dictionary.

        Raises FileNotFoundError for a missing file, ValueError for a file with fewer than 2
        labels or a setting out of range (named)."""
        from hsm.classifiers.fasttext_format import FastTextDictionary, read_lines

        word_ngrams = check_count(word_ngrams, "word_ngrams", 1)
        min_count = check_count(min_count, "min_count", 1)
        bucket = check_count(bucket, "bucket", 1)
        if not isinstance(label, str) or not label:
            raise ValueError(f"label must be a non-empty prefix such as '__label__', got {label!r}")
        lines = read_lines(path)
        dictionary = FastTextDictionary.build(lines, word_ngrams=word_ngrams, bucket=bucket, min_count=min_count,
                                              label_prefix=label)
        data = dictionary.encode(lines)
        data = data.subset(data.labelled)
        self.fit(data.docs, data.labels, num_words=dictionary.num_ids, num_labels=dictionary.num_labels,
                 record_losses=record_losses)
        self.dictionary = dictionary
        self._dictionary_model = self.model  # the model whose word and label ids are the dictionary's
        return self

    def _file_rows(self, path: str | Path) -> tuple[Any, list[str]]:
        """(encoded lines, raw lines) of a file read with the training file's dictionary."""
        from hsm.classifiers.fasttext_format import read_lines

        self._check_fitted()
        if self.dictionary is None:
            raise RuntimeError("the classifier was not trained on a file: use fit_file (or load a model saved "
                               "after fit_file) to read fastText files")
        if getattr(self, "_dictionary_model", None) is not self.model:  # init_model built another model
            raise RuntimeError("the model was refitted on arrays after fit_file: its word and label ids are no "
                               "longer the file dictionary's; call fit_file again to read files")
        lines = read_lines(path)
        return self.dictionary.encode(lines), lines

    def test_file(self, path: str | Path, k: int = 1, threshold: float = 0.0) -> dict[str, float]:
        """fastText's ``test`` on a file: over the lines with at least one label the model knows
        (``examples``, fastText's N), the top ``k`` labels whose probability is at least
        ``threshold``; ``precision_at_k`` = correct / predicted, ``recall_at_k`` = correct / gold
        labels. A ``k`` above K predicts all K labels, as fastText does. A line's labels are a
        set: one written twice counts once (fastText counts it twice). What ``python -m hsm test``
        prints (with :meth:`test` and ``threshold=0`` the same numbers on the same rows)."""
        k = check_count(k, "k", 1)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise ValueError(f"threshold must be a probability in [0, 1], got {threshold!r}")
        data, _ = self._file_rows(path)
        data = data.subset(data.labelled)
        n = data.offsets.size - 1
        if n == 0:
            raise ValueError(f"{path}: no line has a label the model knows (labels like "
                             f"{self.dictionary.labels[0]!r})")
        prediction = self.predict(data.docs, min(k, self.num_labels))
        kept = prediction.log_probs >= math.log(threshold) if threshold > 0 else np.ones(prediction.labels.shape, bool)
        # a line's gold labels are a set, as in test(): a repeated label counts once
        label_values, label_offsets = unique_label_sets(data.label_values, data.label_offsets)
        gold_keys = np.repeat(np.arange(n), np.diff(label_offsets)) * self.num_labels + label_values
        predicted_keys = np.arange(n)[:, None] * self.num_labels + prediction.labels
        hits = int((np.isin(predicted_keys, gold_keys) & kept).sum())
        predicted = int(kept.sum())
        return {"examples": n, f"precision_at_{k}": hits / predicted if predicted else math.nan,
                f"recall_at_{k}": hits / label_values.size}

    def predict_file(self, path: str | Path, k: int = 1, threshold: float = 0.0) -> list[list[tuple[str, float]]]:
        """fastText's ``predict`` on a file: for every line (labelled or not), its top ``k`` labels
        (as written in the training file, prefix included) with their probabilities, most likely
        first, those below ``threshold`` left out. What ``python -m hsm predict`` prints."""
        k = check_count(k, "k", 1)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise ValueError(f"threshold must be a probability in [0, 1], got {threshold!r}")
        data, lines = self._file_rows(path)
        if not lines:
            return []
        prediction = self.predict(data.docs, min(k, self.num_labels))
        names = self.dictionary.labels
        probabilities = np.exp(prediction.log_probs)
        return [[(names[label], float(p)) for label, p in zip(row, probs) if p >= threshold]
                for row, probs in zip(prediction.labels.tolist(), probabilities)]

    # ------------------------------------------------------------------ the model file
    def _settings(self) -> dict[str, Any]:
        """The constructor's arguments that rebuild this classifier."""
        return {"dim": self.dim, "output": self.output, "arity": self.arity, "lr": self.lr, "epochs": self.epochs,
                "threads": self.threads, "reduce": self.reduce, "lr_schedule": self.lr_schedule,
                "rebuilds": self.rebuilds, "schedule": self.schedule, "rebuild_tokens": self.rebuild_tokens,
                "statistics": self.statistics_policy, "decay": self.decay, "prior": self.prior,
                "prior_mode": self.prior_mode, "score": self.score, "reset_moved_nodes": self.reset_moved_nodes,
                "bias": self.bias, "shuffle": self.shuffle, "seed": self.seed, "depth": self.depth}

    #: the model file's layout; :meth:`load` reads this one only (a file of another is refused, naming
    #: the hsm version that wrote it, rather than misread)
    FORMAT_VERSION = 1

    def save(self, path: str | Path) -> Path:
        """Write the model (settings, embeddings, output layer with its tree, the file dictionary
        if any) to ``path`` with ``torch.save`` (``python -m hsm supervised -output m`` writes
        ``m.bin``); :meth:`load` reads it back, and predicts and tests exactly as this one. Algorithm
        1's statistics are training state and are not saved.

        Atomic (:func:`hsm.atomic.atomic_write`): the bytes go to a temporary file in the same
        folder, which replaces ``path`` only once complete, so a full disk, a second run writing
        the same file or a Ctrl-C leaves the previous file as it was (an OSError, with
        :class:`hsm.atomic.DiskFullError` for a full disk)."""
        from hsm import __version__

        self._check_fitted()
        path = Path(path)
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder: give the model a file name (e.g. {path / 'model.bin'})")
        start = self.start_tree.to_dict() if self.start_tree is not None else None
        state = {"format": "hsm.FastBowClassifier", "version": self.FORMAT_VERSION, "hsm_version": __version__,
                 "settings": self._settings(), "num_words": self.num_words, "num_labels": self.num_labels,
                 "start_tree": start, "model": self.model.state_dict(), "layer": self.layer.state_dict(),
                 "tree": self.layer.tree.to_dict() if isinstance(self.layer, HierarchicalSoftmax) else None,
                 "dictionary": self.dictionary.state_dict() if self.dictionary is not None else None}
        atomic_write(path, lambda handle: torch.save(state, handle))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "FastBowClassifier":
        """A classifier :meth:`save` wrote. Raises FileNotFoundError for a missing file and
        :class:`ModelFileError` (a ValueError) for a file that is not such a model (e.g. a fastText
        ``.bin``), one of another format version, or one whose settings or arrays do not fit
        together (damaged): every setting goes through the constructor's checks and every
        array must have its model's shape."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such model file")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as error:  # pickle / zip errors: not a file torch.save wrote
            raise ModelFileError(f"{path} is not a model written by hsm (FastBowClassifier.save or python -m hsm "
                                 f"supervised): {type(error).__name__}") from None
        if not isinstance(state, dict) or state.get("format") != "hsm.FastBowClassifier":
            raise ModelFileError(f"{path} is not a model written by FastBowClassifier.save")
        written_by = state.get("hsm_version")
        by = f" (written by hsm {written_by})" if isinstance(written_by, str) else ""
        if state.get("version") != cls.FORMAT_VERSION:
            raise ModelFileError(f"{path}: model format version {state.get('version')!r}{by} is not readable by this "
                                 f"hsm (it reads version {cls.FORMAT_VERSION}): retrain the model, or use the hsm "
                                 "version that wrote it")
        try:
            return cls._from_state(state)
        except SettingError:  # a sound file too large for the memory available: said as such
            raise
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as error:
            detail = " ".join(str(error).split()) or type(error).__name__  # load_state_dict's are several lines
            if isinstance(error, KeyError):
                detail = f"no {error} entry"
            detail = detail if len(detail) <= 200 else detail[:197] + "..."
            raise ModelFileError(f"{path}: damaged model file{by.replace(' (', ', ').rstrip(')')} ({detail}): retrain "
                                 "the model, or use the hsm version that wrote it") from None

    @classmethod
    def _from_state(cls, state: dict[str, Any]) -> "FastBowClassifier":
        """The classifier of a :meth:`save` state, every part checked (KeyError, TypeError,
        ValueError or RuntimeError for the first that does not fit)."""
        from hsm.classifiers.fasttext_format import FastTextDictionary

        if not isinstance(state["settings"], dict):
            raise TypeError(f"settings is a {type(state['settings']).__name__}, not a dict")
        classifier = cls(**state["settings"])
        num_words = check_integer(state["num_words"], "num_words")
        num_labels = check_integer(state["num_labels"], "num_labels")
        embedding = state["model"]["embedding.weight"]
        if tuple(embedding.shape) != (num_words, classifier.dim):
            raise ValueError(f"the embeddings are {tuple(embedding.shape)}, the settings say ({num_words}, "
                             f"{classifier.dim})")
        # the layers' shapes depend on K and M only (the saved tree replaces the start tree)
        classifier.init_model(num_words, np.ones(num_labels))
        if state["start_tree"] is not None:
            classifier.start_tree = Tree.from_dict(state["start_tree"])
        classifier.model.load_state_dict(state["model"])
        tree = state.get("tree")
        if tree is not None and isinstance(classifier.layer, HierarchicalSoftmax):
            # a model that labels were added to has its own shape of tree: build the layer on it
            tree = Tree.from_dict(tree)
            if tree.arity != classifier.arity or tree.num_labels != num_labels:
                raise ValueError(f"the saved tree has M={tree.arity} and K={tree.num_labels}, the settings say "
                                 f"M={classifier.arity} and K={num_labels}")
            if tree.num_nodes != classifier.layer.num_nodes:
                classifier.layer = HierarchicalSoftmax(classifier.dim, tree, bias=classifier.bias, sparse=True)
        classifier.layer.load_state_dict(state["layer"])
        if state["dictionary"] is not None:
            dictionary = FastTextDictionary.from_state_dict(state["dictionary"])
            if dictionary.num_ids != num_words or dictionary.num_labels != num_labels:
                raise ValueError(f"the dictionary has {dictionary.num_ids} ids and {dictionary.num_labels} labels, the "
                                 f"model {num_words} and {num_labels}")
            classifier.dictionary = dictionary
            classifier._dictionary_model = classifier.model
        for name, tensor in [*classifier.model.state_dict().items(), *classifier.layer.state_dict().items()]:
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                flat = tensor.reshape(-1)  # a block at a time: isfinite makes copies of its input's size
                for first in range(0, flat.numel(), INIT_BLOCK):
                    if not bool(torch.isfinite(flat[first : first + INIT_BLOCK]).all()):
                        raise ValueError(f"{name} holds NaN or infinite values")
        return classifier
