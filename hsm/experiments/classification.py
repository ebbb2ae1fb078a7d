"""ICML Tables 1 and 3: extreme classification with a bag-of-words model and tree softmaxes.

The paper (ICML §7.1, supplement §11.1; inventory §5.3-5.4, §6.2) predicts YFCC100M tags (312K
labels, 91M captions) from the caption's bag of words, with the fastText recipe: embeddings of
dimension ``d in {50, 200}``, SGD with a linearly decreasing learning rate over 5 epochs, the rate
picked from {0.01, 0.02, 0.05, 0.1, 0.25, 0.5}; output layers

* ``flat``: the flat softmax (not in the paper's table; the accuracy ceiling of the rest);
* ``huffman2``: the binary Huffman tree (fastText's ``-loss hs``, the paper's "FastText" row);
* ``huffman5``, ``huffman20``: M-ary Huffman trees;
* ``learned5``, ``learned20``: the tree learned by Algorithm 1 with AssignLabels = Algorithm 2
  (well-formed trees), started from the M-ary Huffman tree as the released code does (inventory
  §9 a); the learning rate stays constant during the first half of training, in which
  AssignLabels runs 50 times in total; then the tree is frozen and the rate decays linearly to 0.

Prediction is the exact top-1 of the branch-and-bound search (:meth:`hsm.HierarchicalSoftmax.topk`).
We report precision at 1 (P@1: the share of test examples whose top label is one of their
labels), recall at 1 (R@1: correct top labels over all gold labels of the test set, the
micro-average that fastText's ``test`` prints, which the paper's Table 3 is presumably computed
with: the seeds never define it, inventory §5.4), train and test wall-clock time, and the mean
number of internal nodes the search evaluates against the tree's expected depth.

YFCC100M cannot be had here, so the commands run on two stand-ins (say so wherever they are shown):
``cooking`` (cooking.stackexchange, 736 tags, fastText's tutorial split) and ``gutenberg-books``
(100-token passage -> book, 678 classes, authors as a taxonomy). Anyone holding the YFCC100M
files in fastText format runs the real table with ``-o data=/path/to/train.txt -o
test=/path/to/test.txt`` (read by :func:`hsm.data.load_fasttext_file`, labels seen fewer than 100
times dropped as ICML §7.1 does).

Multi-label examples (cooking, YFCC) are trained on **one label sampled uniformly per example and
per epoch**, as fastText does for its softmax and hs losses. Peers run on the same splits, in the
same process, timed the same way: fastText itself (``fasttext-wheel``, losses softmax and hs) and
Vowpal Wabbit ``--log_multi`` (the logarithmic-time online multiclass tree of Choromanska &
Langford 2015, the binary ancestor of the method); each is skipped, with a note in the result
file, when its package is missing.
"""
from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm import FlatSoftmax, HierarchicalSoftmax, RowSparseSGD, Tree, TreeLearner
from hsm.layers import NonFiniteInputError
from hsm.config import seed_everything
from hsm.experiments import (check_device, check_scale, experiment, option_bool, option_choice, option_float,
                             option_floats, option_int, option_ints)
from hsm.results import (atomic_write, check_replace, load_results, make_record, output_path, provenance,
                         read_json_or_none, write_results)
from hsm.text_models import BagOfWordsClassifier, WordVocabulary, hashed_bigrams, make_bags

__all__ = [
    "OUTPUTS",
    "PAPER_LR_GRID",
    "EncodedSplit",
    "author_grouping",
    "encode_data",
    "evaluate_bow",
    "icml_table1",
    "icml_table3",
    "load_classification_data",
    "run_table",
    "train_bow",
]

#: ICML §7.1 learning-rate grid.
PAPER_LR_GRID = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5)
#: Output layers: name -> (kind, arity); "flat" has no tree.
OUTPUTS: dict[str, tuple[str, int | None]] = {
    "flat": ("flat", None),
    "huffman2": ("huffman", 2),
    "huffman5": ("huffman", 5),
    "huffman20": ("huffman", 20),
    "learned5": ("learned", 5),
    "learned20": ("learned", 20),
}
PEERS = ("fasttext-softmax", "fasttext-hs", "vw-log_multi")
#: VW's own learning rate (-l) grid: VW's updates are normalised and adaptive, so the SGD grid does not apply.
VW_LR_GRID = (0.25, 0.5, 1.0)
#: AssignLabels calls during the first half of training (ICML §11.1).
REASSIGNS = 50
STAND_INS = ("cooking", "gutenberg-books")
_MODEL_NAMES = {"flat": "Flat softmax", "huffman": "Huffman tree", "learned": "Learned tree"}


# ---------------------------------------------------------------------------------------------- data
@dataclass
class EncodedSplit:
    """One split in model ids: ragged documents (``values``/``offsets``) and ragged labels."""

    values: np.ndarray
    offsets: np.ndarray
    label_values: np.ndarray
    label_offsets: np.ndarray
    num_labels: int
    tokens: list[list[int]] | None = field(default=None, repr=False)  #: data-set token ids per doc (peers)

    def __len__(self) -> int:
        return self.offsets.size - 1

    def label_lengths(self) -> np.ndarray:
        return np.diff(self.label_offsets)

    def sample_labels(self, rng: np.random.Generator) -> np.ndarray:
        """One label per example, uniformly among its labels (fastText's softmax/hs training)."""
        lengths = self.label_lengths()
        pick = self.label_offsets[:-1] + np.floor(rng.random(lengths.size) * lengths).astype(np.int64)
        return self.label_values[pick].astype(np.int64)

    def gold_sets(self) -> list[np.ndarray]:
        return [self.label_values[a:b] for a, b in zip(self.label_offsets[:-1], self.label_offsets[1:])]


def _ragged_labels(labels: Any) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(labels, "offsets"):  # hsm.data.Ragged (multi-label)
        return np.asarray(labels.values, dtype=np.int64), np.asarray(labels.offsets, dtype=np.int64)
    labels = np.asarray(labels, dtype=np.int64)
    return labels, np.arange(labels.size + 1, dtype=np.int64)


def encode_data(data: Any, ngrams: int = 1, buckets: int = 2_000_000, min_count: int = 1
                ) -> tuple[WordVocabulary, EncodedSplit, EncodedSplit]:
    """Build the model vocabulary on ``data``'s training split and encode both splits.

    ``data`` is a :class:`hsm.data.TextClassificationData` (its ``test_*`` is whatever split is
    evaluated: the real test split, or the validation part of ``validation_split``)."""
    train_texts, test_texts = data.train_texts, data.test_texts
    vocab = WordVocabulary(train_texts.values, len(train_texts.vocab), min_count=min_count)
    splits = []
    for texts, labels in ((train_texts, data.train_labels), (test_texts, data.test_labels)):
        values, offsets = vocab.encode(texts.values, texts.offsets)
        if ngrams == 2:
            values, offsets = hashed_bigrams(values, offsets, len(vocab), buckets)
        label_values, label_offsets = _ragged_labels(labels)
        splits.append(EncodedSplit(values, offsets, label_values, label_offsets, data.num_labels))
    return vocab, splits[0], splits[1]


def _subset_rows(data: Any, limit: int | None, split: str, seed: int) -> Any:
    """``data`` with at most ``limit`` rows of ``split`` (a seeded random subset, order kept)."""
    texts = getattr(data, f"{split}_texts")
    if limit is None or limit >= len(texts):
        return data
    rows = np.sort(np.random.default_rng(seed).permutation(len(texts))[:limit])
    labels = getattr(data, f"{split}_labels")
    new_labels = labels.subset(rows) if hasattr(labels, "subset") else np.asarray(labels)[rows]
    return replace(data, **{f"{split}_texts": texts.subset(rows), f"{split}_labels": new_labels})


def load_classification_data(data: str, test: str | None = None, max_books: int | None = None,
                             min_label_count: int = 100) -> Any:
    """A stand-in by name (``cooking``, ``gutenberg-books``) or a fastText-format file (YFCC100M).

    For a file, ``test`` names the test file (else the last 10 % of the lines are the test set),
    and labels seen fewer than ``min_label_count`` times are dropped (ICML §7.1: 100)."""
    from hsm.data import load_fasttext_file, load_text_classification

    if data in STAND_INS:
        options = {"max_books": max_books} if data == "gutenberg-books" and max_books else {}
        return load_text_classification(data, **options)
    path = Path(data)
    if not path.is_file():
        raise ValueError(f"data must be one of {STAND_INS} or an existing fastText file, got {data!r}")
    if test is None:
        with _open_count(path) as count:
            lines = count
        return load_fasttext_file(path, test_last=max(1, lines // 10), min_label_count=min_label_count)
    return load_fasttext_file(path, test, min_label_count=min_label_count)


class _open_count:
    """Count the lines of a (possibly compressed) file: ``with _open_count(p) as n``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> int:
        from hsm.data.fetch import open_compressed

        with open_compressed(self.path) as handle:
            return sum(1 for _ in handle)

    def __exit__(self, *exc: Any) -> None:
        return None


# ---------------------------------------------------------------------------------------------- model
def _label_counts(split: EncodedSplit) -> np.ndarray:
    return np.bincount(split.label_values, minlength=split.num_labels).astype(np.float64)


def build_output_layer(output: str, dim: int, counts: np.ndarray) -> tuple[torch.nn.Module, Tree | None]:
    """The output layer ``output`` (a key of :data:`OUTPUTS`) over ``len(counts)`` labels, zero
    initialised as fastText initialises its output matrix (so every run starts from the uniform
    distribution); Huffman trees are built on the training label counts."""
    if output not in OUTPUTS:
        raise ValueError(f"unknown output layer {output!r}; choose from {list(OUTPUTS)}")
    kind, arity = OUTPUTS[output]
    if kind == "flat":
        layer: torch.nn.Module = FlatSoftmax(dim, counts.size)
        tree = None
        with torch.no_grad():
            layer.linear.weight.zero_()
            layer.linear.bias.zero_()
    else:
        # +1: a tag never seen in training still gets a (rare) leaf instead of a zero-weight tie
        tree = Tree.huffman(counts + 1.0, arity)
        layer = HierarchicalSoftmax(dim, tree, sparse=True)
        with torch.no_grad():
            layer.weight.zero_()
            layer.bias.zero_()
    return layer, tree


@dataclass
class TrainedBow:
    model: BagOfWordsClassifier
    layer: torch.nn.Module
    learner: TreeLearner | None
    start_tree: Tree | None
    train_seconds: float
    final_loss: float
    reassign_moved: list[float]


def train_bow(
    train: EncodedSplit,
    output: str,
    dim: int,
    lr: float,
    epochs: int = 5,
    batch_size: int = 32,
    reduce: str = "mean",
    ngrams: int = 1,
    vocab_size: int | None = None,
    buckets: int = 2_000_000,
    reassigns: int = REASSIGNS,
    tree_prior: str = "sticky",
    tree_decay: float = 1.0,
    reset_moved_nodes: bool = False,
    seed: int = 0,
    device: str = "cpu",
    trainer: str = "torch",
    statistics: str = "ours",
    schedule: str = "first_half",
    threads: int | None = None,
) -> TrainedBow:
    """Train a bag-of-words classifier with output layer ``output`` (ICML §7.1 / §11.1).

    ``trainer="fast"``: :class:`hsm.fast_classifier.FastBowClassifier`, compiled per-example
    Hogwild SGD on ``threads`` threads as fastText and the authors' fork train (``batch_size`` is
    then 1 by construction and ignored), with the statistics policy ``statistics`` ("ours" or
    "released") and the rebuild ``schedule`` ("first_half" or the fork's "every_tokens"); unigram
    bags on the CPU only (ValueError otherwise). ``trainer="torch"``: the PyTorch path below.

    SGD on the **summed** per-example NLL of each mini-batch, so ``lr`` is the per-example step
    of fastText's Hogwild SGD, decreased linearly to 0 over ``epochs`` passes. For a learned tree
    (Algorithm 1): rate constant for the first half, AssignLabels (Algorithm 2) ``reassigns``
    times, evenly spread over that half, then :meth:`TreeLearner.freeze` and a linear decay,
    ``lr_t = lr * min(1, 2 (1 - progress))`` as the released code's schedule.

    Tree-learning details the paper leaves open, set as the released code does (inventory §9 a):
    ``tree_prior="sticky"`` (:class:`hsm.NodeStatistics` with ``prior_mode="current_child"``: each
    (node, label) pair starts with one pseudo-example putting 0.5/M on every child and 0.5 more on the
    label's current child, so a label unseen since the last rebuild stays where it is; ``"uniform"``:
    the thesis' 1/M prior, with which such a label is placed by the children's marginals alone),
    ``tree_decay=1.0`` (statistics never decayed), ``reset_moved_nodes=False`` (a node placed
    elsewhere keeps its parameters).
    """
    if tree_prior not in ("sticky", "uniform"):
        raise ValueError(f"tree_prior must be 'sticky' or 'uniform', got {tree_prior!r}")
    if trainer not in ("torch", "fast"):
        raise ValueError(f"trainer must be 'torch' or 'fast', got {trainer!r}")
    if trainer == "fast":
        return _train_bow_fast(train, output, dim, lr, epochs, reduce, ngrams, vocab_size, reassigns, tree_prior,
                               tree_decay, reset_moved_nodes, seed, device, statistics, schedule, threads)
    if lr <= 0 or not math.isfinite(lr):
        raise ValueError(f"lr must be a positive number, got {lr}")
    if epochs < 1 or batch_size < 1:
        raise ValueError("epochs and batch_size must be >= 1")
    if len(train) == 0:
        raise ValueError("no training examples")
    rng = seed_everything(seed)
    kind, _ = OUTPUTS[output] if output in OUTPUTS else (None, None)
    if kind is None:
        raise ValueError(f"unknown output layer {output!r}; choose from {list(OUTPUTS)}")
    vocab_size = int(vocab_size if vocab_size is not None else max(int(train.values.max(initial=0)) + 1, 1))
    if ngrams == 2:
        vocab_size = vocab_size  # bigram ids live above vocab_size; the model adds the bucket rows
    model = BagOfWordsClassifier(vocab_size, dim, ngrams=ngrams, reduce=reduce, buckets=buckets).to(device)
    layer, start_tree = build_output_layer(output, dim, _label_counts(train))
    layer = layer.to(device)
    n = len(train)
    steps_per_epoch = math.ceil(n / batch_size)
    total_steps = epochs * steps_per_epoch
    learner = None
    half = total_steps // 2
    if kind == "learned":
        every = max(1, half // reassigns)
        learner = TreeLearner(layer, reassign_every=every, score="eq12", algorithm="well_formed", decay=tree_decay,
                              reset_moved_nodes=reset_moved_nodes,
                              prior_mode="current_child" if tree_prior == "sticky" else "uniform")
    params = list(model.parameters()) + list(layer.parameters())
    optimizer = RowSparseSGD(params, lr=lr)  # torch.optim.SGD's update, without its sort of sparse rows
    step = 0
    loss_sum, loss_count = 0.0, 0
    start = time.perf_counter()
    for _epoch in range(epochs):
        targets = train.sample_labels(rng)
        order = rng.permutation(n)
        loss_sum, loss_count = 0.0, 0
        for first in range(0, n, batch_size):
            rows = order[first:first + batch_size]
            progress = step / total_steps
            if learner is not None:
                rate = lr * min(1.0, 2.0 * (1.0 - progress))
            else:
                rate = lr * (1.0 - progress)
            for group in optimizer.param_groups:
                group["lr"] = rate
            ids, offsets = make_bags(train.values, train.offsets, rows)
            y = torch.from_numpy(targets[rows])
            ids, offsets, y = ids.to(device), offsets.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            try:
                loss = -layer(model(ids, offsets), y).output.sum()
            except NonFiniteInputError as exc:  # the representation diverged: the same report as a NaN loss
                raise FloatingPointError(f"non-finite representation at step {step} (lr={lr}): the rate is too "
                                         f"high ({exc})") from exc
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"loss is {value} at step {step} (lr={lr}): the rate is too high")
            loss.backward()
            optimizer.step()
            step += 1
            if learner is not None and not learner.frozen:
                learner.step()
                if len(learner.history) >= reassigns or step >= half:
                    learner.freeze()
            loss_sum += value
            loss_count += rows.size
    seconds = time.perf_counter() - start
    moved = [record.moved_labels for record in learner.history] if learner is not None else []
    return TrainedBow(model, layer, learner, start_tree, seconds, loss_sum / max(loss_count, 1), moved)


def _train_bow_fast(train: EncodedSplit, output: str, dim: int, lr: float, epochs: int, reduce: str, ngrams: int,
                    vocab_size: int | None, reassigns: int, tree_prior: str, tree_decay: float,
                    reset_moved_nodes: bool, seed: int, device: str, statistics: str, schedule: str,
                    threads: int | None) -> TrainedBow:
    """:func:`train_bow` with :class:`hsm.fast_classifier.FastBowClassifier` (issue 13)."""
    from types import SimpleNamespace

    from hsm.fast_classifier import FastBowClassifier

    if ngrams != 1:
        raise ValueError(f"trainer='fast' trains unigram bags only, got ngrams={ngrams}")
    if torch.device(device).type != "cpu":
        raise ValueError(f"trainer='fast' runs on the CPU, got device={device!r}")
    if len(train) == 0:
        raise ValueError("no training examples")
    if output not in OUTPUTS:
        raise ValueError(f"unknown output layer {output!r}; choose from {list(OUTPUTS)}")
    kind, arity = OUTPUTS[output]
    words = int(vocab_size if vocab_size is not None else max(int(train.values.max(initial=0)) + 1, 1))
    clf = FastBowClassifier(dim=dim, output=kind, arity=arity or 2, lr=lr, epochs=epochs, reduce=reduce,
                            rebuilds=reassigns, schedule=schedule, statistics=statistics, decay=tree_decay,
                            prior_mode="current_child" if tree_prior == "sticky" else "uniform",
                            reset_moved_nodes=reset_moved_nodes, threads=threads, seed=seed)
    clf.fit(train, SimpleNamespace(values=train.label_values, offsets=train.label_offsets), num_words=words,
            num_labels=train.num_labels)
    learner = SimpleNamespace(history=clf.history.rebuilds) if kind == "learned" else None
    return TrainedBow(clf.model, clf.layer, learner, clf.start_tree, clf.history.train_seconds,
                      clf.history.epoch_loss[-1], [r.moved_labels for r in clf.history.rebuilds])


@torch.no_grad()
def evaluate_bow(trained: TrainedBow, test: EncodedSplit, batch_size: int = 512, device: str = "cpu"
                 ) -> dict[str, float]:
    """P@1, R@1 (micro and per example), test seconds, nodes visited, expected depth.

    Timed: building the bags, the representation and the exact top-1 search. Not timed: a
    second, greedy (beam 1) pass that counts the nodes of the greedy descent, so that the
    branch-and-bound part of the search (what fastText's depth-first search does) can be told
    apart from the greedy descent that gives it its first bound.
    """
    model, layer = trained.model, trained.layer
    model.eval()
    layer.eval()
    n = len(test)
    if n == 0:
        raise ValueError("no test examples")
    predictions = np.empty(n, dtype=np.int64)
    visited = np.empty(n, dtype=np.int64)
    start = time.perf_counter()
    for first in range(0, n, batch_size):
        rows = np.arange(first, min(first + batch_size, n))
        ids, offsets = make_bags(test.values, test.offsets, rows)
        h = model(ids.to(device), offsets.to(device))
        top = layer.topk(h, 1)
        predictions[rows] = top.indices[:, 0].cpu().numpy()
        visited[rows] = top.nodes_visited.cpu().numpy()
    seconds = time.perf_counter() - start
    out = _precision_recall(predictions, test)
    out.update(test_seconds=seconds, nodes_visited=float(visited.mean()))
    tree = getattr(layer, "tree", None)
    if tree is not None:
        greedy = np.empty(n, dtype=np.int64)
        for first in range(0, n, batch_size):
            rows = np.arange(first, min(first + batch_size, n))
            ids, offsets = make_bags(test.values, test.offsets, rows)
            greedy[rows] = layer.topk(model(ids.to(device), offsets.to(device)), 1, method="beam").nodes_visited.cpu().numpy()
        out["nodes_visited_greedy"] = float(greedy.mean())
        out["nodes_visited_search"] = float((visited - greedy).mean())
        # mean path length of the test examples' gold labels (every label of every example)
        out["expected_depth"] = float(tree.depths[test.label_values].mean())
    return out


def _precision_recall(predictions: np.ndarray, test: EncodedSplit) -> dict[str, float]:
    gold = test.gold_sets()
    hits = np.fromiter((p in g for p, g in zip(predictions, gold)), dtype=bool, count=len(gold))
    lengths = test.label_lengths()
    return {
        "p_at_1": 100.0 * float(hits.mean()),
        # fastText's `test` recall: correct top-1 labels / all gold labels (micro)
        "r_at_1": 100.0 * float(hits.sum() / lengths.sum()),
        # the per-example average of |top1 ∩ Y| / |Y| (macro over examples), for reference
        "r_at_1_per_example": 100.0 * float((hits / lengths).mean()),
    }


# ---------------------------------------------------------------------------------------------- peers
def _fasttext_lines(split: EncodedSplit, tokens: Sequence[np.ndarray], rng: np.random.Generator | None) -> list[str]:
    """fastText lines ``__label__<id> w<id> ...``; word ids as words so fastText reads exactly our
    tokens (no re-tokenisation). All labels of an example are written (fastText samples one).

    fastText reads its file in order, every epoch, and never shuffles; a file sorted by label (the
    Gutenberg passages come book after book) makes its SGD learn one class at a time and forget the
    others (on 18,000 Gutenberg passages we measured 1.8 % P@1 against 12.0 % shuffled). So the lines are shuffled once with
    ``rng``, as fastText's own data scripts do with ``shuf``."""
    lines = []
    gold = split.gold_sets()
    for labels, words in zip(gold, tokens):
        text = " ".join(f"w{t}" for t in words.tolist())
        lines.append(" ".join(f"__label__{label}" for label in labels.tolist()) + " " + text)
    if rng is not None:
        lines = [lines[i] for i in rng.permutation(len(lines))]
    return lines


def _doc_tokens(texts: Any) -> list[np.ndarray]:
    return [texts.values[a:b] for a, b in zip(texts.offsets[:-1], texts.offsets[1:])]


def run_fasttext(train_lines: list[str], test_texts: list[str], test: EncodedSplit, loss: str, dim: int,
                 lr: float, epochs: int, ngrams: int, seed: int, workdir: Path, threads: int = 1
                 ) -> dict[str, float]:
    """Train and test fastText (``fasttext-wheel``) on ``threads`` threads; times measured like ours."""
    import fasttext

    path = workdir / "train.txt"
    if not path.exists():  # atomic: a half-written file here would be reused by the next learning rate
        atomic_write(path, "\n".join(train_lines) + "\n")
    start = time.perf_counter()
    model = fasttext.train_supervised(input=str(path), dim=dim, lr=lr, epoch=epochs, loss=loss, thread=threads,
                                      minCount=1, wordNgrams=ngrams, bucket=2_000_000 if ngrams > 1 else 0,
                                      seed=seed, verbose=0)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    labels, _ = model.predict(test_texts, k=1)  # under numpy 2 predict needs a list
    test_seconds = time.perf_counter() - start
    predictions = np.array([int(row[0][len("__label__"):]) if row else -1 for row in labels], dtype=np.int64)
    out = _precision_recall(predictions, test)
    out.update(train_seconds=train_seconds, test_seconds=test_seconds)
    return out


def run_vw(train: EncodedSplit, train_tokens: Sequence[np.ndarray], test: EncodedSplit,
           test_tokens: Sequence[np.ndarray], lr: float, epochs: int, seed: int) -> dict[str, float]:
    """Vowpal Wabbit ``--log_multi K`` (labels 1..K), ``epochs`` online passes, one label sampled
    per example and pass as for the other models; features are the word ids."""
    import vowpalwabbit

    rng = np.random.default_rng(seed)
    feats_train = [" ".join(f"w{t}" for t in words.tolist()) for words in train_tokens]
    feats_test = ["| " + " ".join(f"w{t}" for t in words.tolist()) for words in test_tokens]
    workspace = vowpalwabbit.Workspace(f"--log_multi {train.num_labels} -b 24 -l {lr} --random_seed {seed} --quiet")
    start = time.perf_counter()
    for _ in range(epochs):
        targets = train.sample_labels(rng)
        for row in rng.permutation(len(train)):
            workspace.learn(f"{targets[row] + 1} | {feats_train[row]}")
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    predictions = np.array([workspace.predict(line) for line in feats_test], dtype=np.int64) - 1
    test_seconds = time.perf_counter() - start
    workspace.finish()
    out = _precision_recall(predictions, test)
    out.update(train_seconds=train_seconds, test_seconds=test_seconds)
    return out


def peer_available(peer: str) -> str | None:
    """None if ``peer`` can run here, else why not."""
    module = "fasttext" if peer.startswith("fasttext") else "vowpalwabbit"
    try:
        __import__(module)
    except ImportError as exc:
        package = "fasttext-wheel" if module == "fasttext" else "vowpalwabbit"
        return f"{module} is not installed ({exc}); pip install {package} (extra 'baselines')"
    return None


# ---------------------------------------------------------------------------------------------- trees
def author_grouping(tree: Tree, category_of_label: Sequence[str]) -> dict[str, float]:
    """How well a label tree groups labels of the same category (books of one author).

    * ``ari_depth{1,2}`` / ``purity_depth{1,2}``: cut the tree below depth 1 (the root's
      children) or 2; each subtree (or leaf hanging above the cut) is a cluster of labels; the
      adjusted Rand index of those clusters against the categories, and the purity (share of labels
      whose cluster's majority category is theirs).
    * ``lca_same`` / ``lca_diff``: mean depth of the lowest common ancestor (root = 0) of pairs of
      labels with the same category / with different categories; a tree that groups authors has
      ``lca_same`` well above ``lca_diff``.
    """
    from sklearn.metrics import adjusted_rand_score

    k = tree.num_labels
    if len(category_of_label) != k:
        raise ValueError(f"{len(category_of_label)} categories for {k} labels")
    _, category = np.unique(np.asarray(category_of_label, dtype=object).astype(str), return_inverse=True)
    nodes = np.where(tree.path_mask[:k], tree.path_nodes[:k], -1)
    out: dict[str, float] = {}
    for cut in (1, 2):
        if nodes.shape[1] > cut:
            # cluster id: the node at depth `cut` on the path, or a singleton for a shallower leaf
            cluster = np.where(nodes[:, cut] >= 0, nodes[:, cut], -1 - np.arange(k))
        else:
            cluster = -1 - np.arange(k)
        out[f"ari_depth{cut}"] = float(adjusted_rand_score(category, cluster))
        _, cluster_id = np.unique(cluster, return_inverse=True)
        table = np.zeros((cluster_id.max() + 1, category.max() + 1))
        np.add.at(table, (cluster_id, category), 1)
        out[f"purity_depth{cut}"] = float(table.max(axis=1).sum() / k)
        out[f"clusters_depth{cut}"] = int(cluster_id.max() + 1)
    equal = nodes[:, None, :] == nodes[None, :, :]
    equal &= nodes[:, None, :] >= 0
    common = np.cumprod(equal, axis=2).sum(axis=2) - 1  # depth of the deepest shared node
    upper = np.triu_indices(k, 1)
    same = category[upper[0]] == category[upper[1]]
    lca = common[upper]
    out["lca_same"] = float(lca[same].mean()) if same.any() else float("nan")
    out["lca_diff"] = float(lca[~same].mean())
    out["max_depth"] = int(tree.max_depth)
    return out


# ---------------------------------------------------------------------------------------------- table
@dataclass
class TableConfig:
    data: str = "cooking"
    test: str | None = None
    dims: tuple[int, ...] = (50, 200)
    outputs: tuple[str, ...] = tuple(OUTPUTS)
    peers: tuple[str, ...] = PEERS
    lr_grid: tuple[float, ...] = PAPER_LR_GRID
    vw_lr_grid: tuple[float, ...] = VW_LR_GRID
    epochs: int = 5
    batch_size: int = 32
    reduce: str = "mean"
    ngrams: int = 1
    validation_fraction: float = 0.1
    train_limit: int | None = None
    test_limit: int | None = None
    max_books: int | None = None
    min_label_count: int = 100
    seed: int = 0
    save_trees: bool = True
    reassigns: int = REASSIGNS
    tree_prior: str = "sticky"
    tree_decay: float = 1.0
    reset_moved_nodes: bool = False
    #: "torch" (mini-batches of batch_size) or "fast" (compiled per-example Hogwild SGD, issue 13)
    trainer: str = "torch"
    statistics: str = "ours"  #: trainer="fast": "ours" or "released" (the authors' fork's policy)
    schedule: str = "first_half"  #: trainer="fast": "first_half" or "every_tokens" (the fork's)
    threads: int | None = None  #: trainer="fast": Hogwild threads (None: torch.get_num_threads())


def _paper_key(table: str, dim: int, model: str, arity: int | None) -> str | None:
    from hsm import paper

    slug = {"Huffman tree": "huffman_tree", "Learned tree": "learned_tree", "fastText": "fasttext"}.get(model)
    if slug is None or dim not in (50, 200):
        return None
    key = f"icml2017.{table}.d{dim}.{slug}" + (f".arity{arity}" if arity else "")
    return key if f"{key}.p_at_1" in paper.NUMBERS else None


def run_table(config: TableConfig, table: str, device: str = "cpu", out: Path | None = None,
              log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every output layer and peer at every ``d``: LR picked on a validation split carved from
    train, then trained on all of train and tested; one record per row of the table.

    Completed rows are kept in ``.<out name>.partial.json`` beside ``out`` so that a stopped run
    resumes where it was (the file is removed when the table is written)."""
    torch.set_num_threads(1)  # one core: the same budget as fastText's -thread 1
    data = load_classification_data(config.data, config.test, config.max_books, config.min_label_count)
    data = _subset_rows(data, config.train_limit, "train", config.seed)
    data = _subset_rows(data, config.test_limit, "test", config.seed + 1)
    stand_in = config.data in STAND_INS
    valid_data = data.validation_split(config.validation_fraction, seed=config.seed)
    encoded = {}
    for name, source in (("valid", valid_data), ("test", data)):
        vocab, train_split, eval_split = encode_data(source, ngrams=config.ngrams)
        encoded[name] = (vocab, train_split, eval_split, source)
    partial_path = None if out is None else out.with_name(f".{out.name}.partial.json")
    done: dict[str, dict[str, Any]] = {}
    # an unreadable partial file (truncated by a full disk) is warned about by name and ignored
    saved = read_json_or_none(partial_path, "partial-table file") if partial_path is not None else None
    if isinstance(saved, dict) and saved.get("config") == _config_json(config) and isinstance(saved.get("rows"), dict):
        done = saved["rows"]
        log(f"resuming: {len(done)} rows already done")

    def save_partial() -> None:
        if partial_path is None:
            return
        atomic_write(partial_path, json.dumps({"config": _config_json(config), "rows": done}))

    common = {"data": config.data, "stand_in": stand_in, "train_examples": len(data.train_texts),
              "test_examples": len(data.test_texts), "num_labels": data.num_labels, "multilabel": data.multilabel,
              "epochs": config.epochs, "reduce": config.reduce, "ngrams": config.ngrams}
    records: list[dict[str, Any]] = []
    tree_dir = None if out is None else out.parent / "trees"
    # trees are named after the result file (table1-cooking.json -> trees/cooking-d50-learned5.json)
    tree_prefix = None if out is None else out.stem.split("-", 1)[-1]
    category = None
    if data.taxonomy is not None:
        cat = data.category_of()
        category = [cat[name] for name in data.label_names]

    for dim in config.dims:
        for output in config.outputs:
            key = f"d{dim}/{output}"
            if key not in done:
                done[key] = _run_ours(config, encoded, output, dim, device, tree_dir, category, log, tree_prefix)
                save_partial()
            records.append(_record(table, dim, done[key], common))
        for peer in config.peers:
            # VW has no embedding dimension: one run, shown in every d block
            key = "vw-log_multi" if peer == "vw-log_multi" else f"d{dim}/{peer}"
            if key not in done:
                why = peer_available(peer)
                done[key] = {"output": peer, "skipped": why} if why else _run_peer(config, encoded, peer, dim, log)
                save_partial()
            records.append(_record(table, dim, done[key], common))
    records.extend(_gains(table, records, common))
    if partial_path is not None and partial_path.exists():
        partial_path.unlink()
    return records


def _config_json(config: TableConfig) -> dict[str, Any]:
    return json.loads(json.dumps(config.__dict__, default=list))


def _select(scores: dict[float, float | None]) -> float:
    finite = {lr: s for lr, s in scores.items() if s is not None}
    if not finite:
        raise FloatingPointError(f"every learning rate diverged: {scores}")
    return max(finite, key=lambda lr: (finite[lr], -lr))


def _run_ours(config: TableConfig, encoded: dict, output: str, dim: int, device: str, tree_dir: Path | None,
              category: list[str] | None, log: Callable[[str], None], tree_prefix: str | None = None) -> dict[str, Any]:
    kwargs = dict(epochs=config.epochs, batch_size=config.batch_size, reduce=config.reduce, ngrams=config.ngrams,
                  seed=config.seed, device=device, reassigns=config.reassigns, tree_prior=config.tree_prior,
                  tree_decay=config.tree_decay, reset_moved_nodes=config.reset_moved_nodes, trainer=config.trainer,
                  statistics=config.statistics, schedule=config.schedule, threads=config.threads)
    vocab, train_split, valid_split, _ = encoded["valid"]
    scores: dict[float, float | None] = {}
    for lr in config.lr_grid:
        try:
            trained = train_bow(train_split, output, dim, lr, vocab_size=len(vocab), **kwargs)
            scores[lr] = evaluate_bow(trained, valid_split, device=device)["p_at_1"]
        except (FloatingPointError, NonFiniteInputError):  # diverged in training or in its last steps
            scores[lr] = None
        log(f"  d={dim} {output} lr={lr}: valid P@1 {scores[lr]}")
    vocab, train_split, test_split, source = encoded["test"]
    # retrain on all of train at the best rate; should that run diverge (SGD on more data at a rate at the
    # edge of stability), fall back to the next best rate and say so
    diverged = []
    for best in sorted((lr for lr, v in scores.items() if v is not None), key=lambda lr: (-scores[lr], lr)):
        try:
            trained = train_bow(train_split, output, dim, best, vocab_size=len(vocab), **kwargs)
            break
        except FloatingPointError:
            diverged.append(best)
            log(f"  d={dim} {output} lr={best}: diverged on the full training set, next best rate")
    else:
        raise FloatingPointError(f"{output} d={dim}: every rate diverged ({scores})")
    result = evaluate_bow(trained, test_split, device=device)
    row: dict[str, Any] = {"output": output, "lr": best, "valid_p_at_1": {str(k): v for k, v in scores.items()},
                           "diverged_on_full_train": diverged, "train_seconds": trained.train_seconds, **result}
    if trained.start_tree is not None:
        tree = trained.layer.tree
        row["tree_nodes"] = tree.num_nodes
        row["tree_max_depth"] = tree.max_depth
        counts = _label_counts(train_split) + 1.0
        row["expected_depth_train_counts"] = tree.expected_depth(counts[: tree.num_labels])
        row["start_expected_depth_train_counts"] = trained.start_tree.expected_depth(counts[: tree.num_labels])
    if trained.learner is not None:
        row["reassigns"] = len(trained.learner.history)
        row["moved_labels_first"] = trained.reassign_moved[0] if trained.reassign_moved else None
        row["moved_labels_last"] = trained.reassign_moved[-1] if trained.reassign_moved else None
        row["reassign_seconds"] = float(sum(r.seconds for r in trained.learner.history))
    if category is not None and trained.start_tree is not None:
        row["author_grouping"] = author_grouping(trained.layer.tree, category)
        row["start_author_grouping"] = author_grouping(trained.start_tree, category)
    if tree_dir is not None and config.save_trees and trained.learner is not None:
        tree_dir.mkdir(parents=True, exist_ok=True)
        names = [str(n) for n in source.label_names]
        stem = f"{tree_prefix or _data_slug(config.data)}-d{dim}-{output}"
        final = Tree(trained.layer.tree.child_node, trained.layer.tree.child_label, trained.layer.tree.num_labels,
                     label_names=names)
        start = Tree(trained.start_tree.child_node, trained.start_tree.child_label, trained.start_tree.num_labels,
                     label_names=names)
        # paths relative to the result file's folder
        row["tree_file"] = str(final.save(tree_dir / f"{stem}.json").relative_to(tree_dir.parent))
        row["start_tree_file"] = str(start.save(tree_dir / f"{stem}-start.json").relative_to(tree_dir.parent))
    log(f"d={dim} {output}: lr={best} P@1={result['p_at_1']:.2f} train {trained.train_seconds:.1f}s "
        f"test {result['test_seconds']:.2f}s visited {result['nodes_visited']:.1f}")
    return row


def _run_peer(config: TableConfig, encoded: dict, peer: str, dim: int, log: Callable[[str], None]) -> dict[str, Any]:
    results = {}
    for name in ("valid", "test"):
        _, train_split, eval_split, source = encoded[name]
        results[name] = (train_split, eval_split, _doc_tokens(source.train_texts), _doc_tokens(source.test_texts))
    if peer.startswith("fasttext"):
        loss = peer.split("-", 1)[1]
        # the same threads as our rows: one for the PyTorch trainer, the Hogwild threads of the compiled one
        threads = (config.threads or torch.get_num_threads()) if config.trainer == "fast" else 1
        scores: dict[float, float | None] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("valid", "test"):
                (Path(tmp) / name).mkdir()
            train_split, eval_split, train_tokens, eval_tokens = results["valid"]
            train_lines = _fasttext_lines(train_split, train_tokens, np.random.default_rng(config.seed))
            eval_texts = [" ".join(f"w{t}" for t in words.tolist()) for words in eval_tokens]
            for lr in config.lr_grid:
                got = run_fasttext(train_lines, eval_texts, eval_split, loss, dim, lr, config.epochs, config.ngrams,
                                   config.seed, Path(tmp) / "valid", threads)
                scores[lr] = got["p_at_1"] if math.isfinite(got["p_at_1"]) else None
                log(f"  d={dim} {peer} lr={lr}: valid P@1 {scores[lr]}")
            best = _select(scores)
            train_split, eval_split, train_tokens, eval_tokens = results["test"]
            train_lines = _fasttext_lines(train_split, train_tokens, np.random.default_rng(config.seed))
            eval_texts = [" ".join(f"w{t}" for t in words.tolist()) for words in eval_tokens]
            result = run_fasttext(train_lines, eval_texts, eval_split, loss, dim, best, config.epochs, config.ngrams,
                                  config.seed, Path(tmp) / "test", threads)
            result["threads"] = threads
        import fasttext

        version = getattr(fasttext, "__version__", None) or _package_version("fasttext-wheel")
    else:
        scores = {}
        train_split, eval_split, train_tokens, eval_tokens = results["valid"]
        for lr in config.vw_lr_grid:
            scores[lr] = run_vw(train_split, train_tokens, eval_split, eval_tokens, lr, config.epochs,
                                config.seed)["p_at_1"]
            log(f"  d={dim} {peer} -l {lr}: valid P@1 {scores[lr]}")
        best = _select(scores)
        train_split, eval_split, train_tokens, eval_tokens = results["test"]
        result = run_vw(train_split, train_tokens, eval_split, eval_tokens, best, config.epochs, config.seed)
        version = _package_version("vowpalwabbit")
    log(f"d={dim} {peer}: lr={best} P@1={result['p_at_1']:.2f} train {result['train_seconds']:.1f}s")
    return {"output": peer, "lr": best, "valid_p_at_1": {str(k): v for k, v in scores.items()},
            "version": version, **result}


def _package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _data_slug(data: str) -> str:
    return data if data in STAND_INS else Path(data).name.split(".")[0]


def _describe(output: str) -> tuple[str, str, int | None]:
    """(model name as in the paper's table, implementation, arity)."""
    if output in OUTPUTS:
        kind, arity = OUTPUTS[output]
        return _MODEL_NAMES[kind], "hsm", arity
    if output == "fasttext-hs":
        return "fastText", "fastText", 2
    if output == "fasttext-softmax":
        return "fastText softmax", "fastText", None
    return "VW log_multi", "Vowpal Wabbit", 2


def _record(table: str, dim: int, row: dict[str, Any], common: dict[str, Any]) -> dict[str, Any]:
    model, implementation, arity = _describe(row["output"])
    # the paper's "FastText" row is the binary Huffman tree (fastText -loss hs): ours and fastText's map to it
    paper_model = "fastText" if (row["output"] in ("huffman2", "fasttext-hs")) else model
    key = _paper_key(table, dim, paper_model, arity)
    fields = {"table": table, "d": dim, "model": model, "implementation": implementation, "arity": arity,
              "paper_row": key, **common, **row}
    if row.get("skipped"):
        return {"claim": None, "metric": "skipped", **fields}  # no value: nothing was measured
    # Not a `claim`: the stand-ins are not YFCC100M, so these numbers must not sit beside the paper's on
    # the landing page as if they reproduced it. With the real YFCC100M file they would (claim=paper_row).
    claim = f"{key}.p_at_1" if (key and not common["stand_in"]) else None
    return make_record(claim, row["p_at_1"], metric="P@1 (%)", **fields)


def _gains(table: str, records: list[dict[str, Any]], common: dict[str, Any]) -> list[dict[str, Any]]:
    """Learned minus Huffman P@1 at each (d, arity): the paper's "up to 3.3 points" claim."""
    by = {(r["d"], r["output"]): r for r in records if not r.get("skipped")}
    gains = []
    for (dim, output), row in sorted(by.items()):
        if not output.startswith("learned"):
            continue
        base = by.get((dim, output.replace("learned", "huffman")))
        if base is None:
            continue
        gains.append(make_record(None, row["p_at_1"] - base["p_at_1"], metric="P@1 gain, learned - Huffman (points)",
                                 table=table, d=dim, arity=row["arity"], model="gain", output=f"gain{row['arity']}",
                                 **common))
    return gains


# ---------------------------------------------------------------------------------------------- commands
def _parse_options(scale: str, options: dict[str, Any]) -> TableConfig:
    """Experiment options (strings from the command line, or Python values) -> a config.

    Quick scale (CI, notebooks): a slice of ``cooking`` (or 40 Gutenberg books), ``d = 50``,
    LR grid {0.1, 0.5}. Full scale: the whole stand-in, d in {50, 200}, the paper's grid."""
    quick = check_scale(scale) == "quick"
    config = TableConfig()
    if quick:
        config = replace(config, dims=(50,), lr_grid=(0.1, 0.5), vw_lr_grid=(0.5,), train_limit=3000, test_limit=1000,
                         max_books=40)
    def as_tuple(value: Any, cast: Callable[[str], Any]) -> tuple:
        if isinstance(value, str):
            return tuple(cast(v) for v in value.split(",") if v.strip())
        return tuple(cast(v) for v in value)

    def as_bool(value: Any) -> bool:
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")

    def as_opt_int(value: Any) -> int | None:
        return None if value in (None, "", "none", "None") else int(value)

    def optional_str(value: Any) -> str | None:
        return None if value in (None, "", "none", "None") else str(value)

    # every option parsed and range-checked here; a bad one is a ValueError naming it and its value
    casts: dict[str, Callable[[str, Any], Any]] = {
        "data": lambda k, v: str(v).strip(),  # a stand-in or a file: checked when loaded
        "test": lambda k, v: optional_str(v),
        "dims": lambda k, v: option_ints(k, v, minimum=1),
        "outputs": lambda k, v: as_tuple(v, str), "peers": lambda k, v: as_tuple(v, str),
        "lr_grid": lambda k, v: option_floats(k, v, positive=True),
        "vw_lr_grid": lambda k, v: option_floats(k, v, positive=True),
        "epochs": lambda k, v: option_int(k, v, minimum=1), "batch_size": lambda k, v: option_int(k, v, minimum=1),
        "reduce": lambda k, v: option_choice(k, v, ("mean", "sum")),
        "ngrams": lambda k, v: option_int(k, v, minimum=1, maximum=2),
        "validation_fraction": lambda k, v: option_float(k, v, positive=True, below=1.0),
        "train_limit": lambda k, v: option_int(k, v, minimum=1, allow_none=True),
        "test_limit": lambda k, v: option_int(k, v, minimum=1, allow_none=True),
        "max_books": lambda k, v: option_int(k, v, minimum=1, allow_none=True),
        "min_label_count": lambda k, v: option_int(k, v, minimum=1),
        "seed": lambda k, v: option_int(k, v, minimum=0), "save_trees": option_bool,
        "reassigns": lambda k, v: option_int(k, v, minimum=1),
        "tree_prior": lambda k, v: option_choice(k, v, ("sticky", "uniform")),
        "tree_decay": lambda k, v: option_float(k, v, minimum=0.0, maximum=1.0),
        "reset_moved_nodes": option_bool,
        "trainer": lambda k, v: option_choice(k, v, ("torch", "fast")),
        "statistics": lambda k, v: option_choice(k, v, ("ours", "released")),
        "schedule": lambda k, v: option_choice(k, v, ("first_half", "every_tokens")),
        "threads": lambda k, v: option_int(k, v, minimum=1, allow_none=True),
    }
    aliases = {"d": "dims", "lr": "lr_grid", "lrs": "lr_grid"}
    updates = {}
    for key, value in options.items():
        key = aliases.get(key, key)
        if key not in casts:
            raise ValueError(f"unknown option {key!r}; known: {sorted(casts)}")
        try:
            updates[key] = casts[key](key, value)
        except ValueError as exc:
            message = str(exc)
            raise ValueError(message if message.startswith("option ") else f"option {key}={value!r}: {exc}") from None
        except TypeError as exc:
            raise ValueError(f"option {key}={value!r}: {exc}") from None
    if "data" in updates and not updates["data"]:
        raise ValueError("option data='': data must be one of cooking, gutenberg-books or a fastText file")
    config = replace(config, **updates)
    unknown = [o for o in config.outputs if o not in OUTPUTS]
    if unknown:
        raise ValueError(f"unknown outputs {unknown}; choose from {list(OUTPUTS)}")
    unknown = [p for p in config.peers if p not in PEERS]
    if unknown:
        raise ValueError(f"unknown peers {unknown}; choose from {list(PEERS)}")
    if not config.outputs and not config.peers:
        raise ValueError("options outputs and peers are both empty: nothing to run")
    if config.reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {config.reduce!r}")
    if config.tree_prior not in ("sticky", "uniform"):
        raise ValueError(f"tree_prior must be 'sticky' or 'uniform', got {config.tree_prior!r}")
    if not 0.0 <= config.tree_decay <= 1.0 or config.reassigns < 1:
        raise ValueError("tree_decay must lie in [0, 1] and reassigns be >= 1")
    if not config.lr_grid or any(not (math.isfinite(lr) and lr > 0) for lr in config.lr_grid):
        raise ValueError(f"lr_grid must hold positive rates, got {config.lr_grid}")
    if "vw-log_multi" in config.peers and not config.vw_lr_grid:
        raise ValueError("option vw_lr_grid is empty but the vw-log_multi peer runs")
    return config


def _default_out(table: str, scale: str, data: str) -> Path:
    """Where a table goes without ``out``: under :func:`hsm.results.output_root` (not the committed
    ``results/``), ``classification/<table>-<data>[-quick].json``."""
    suffix = "" if scale == "full" else "-quick"
    return output_path(f"results/classification/{table}-{_data_slug(data)}{suffix}.json")


def _run_command(table: str, scale: str, device: str, out: Path | str | None, options: dict[str, Any],
                 force: bool = False) -> Path:
    """Check everything (scale, options, device, no larger-scale result at ``out`` unless
    ``force``: ValueError), then run the table and write its result file."""
    config = _parse_options(scale, options)
    device = check_device(device)
    name = "table1" if table == "table1" else "table3"
    out = Path(out) if out is not None else _default_out(name, scale, config.data)
    check_replace(out, scale, force)
    start = time.perf_counter()
    records = run_table(config, table, device=device, out=out)
    prov = provenance(config={**_config_json(config), "table": table, "device": device,
                              "torch_threads": torch.get_num_threads()},
                      wall_time_s=time.perf_counter() - start, scale=scale)
    return write_results(out, records, prov, force=force)


@experiment("icml-table1", "ICML Table 1: P@1, train/test time; flat, Huffman (2, 5, 20), learned (5, 20), "
            "fastText, VW; data=cooking|gutenberg-books|<fastText file>",
            "results/classification/table1-cooking.json")
def icml_table1(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                **options: Any) -> Path:
    """ICML Table 1 on ``data`` (a stand-in, or a YFCC100M-style fastText file). ``out`` None:
    ``hsm-results/classification/table1-<data>[-quick].json``; a full-scale file at ``out`` is not
    replaced by a quick run unless ``force``. ValueError for a bad scale, device or option."""
    return _run_command("table1", scale, device, out, options, force)


@experiment("icml-table3", "ICML supplement Table 3: Table 1 with recall at 1",
            "results/classification/table3-cooking.json")
def icml_table3(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                **options: Any) -> Path:
    """ICML supplement Table 3 (Table 1 with R@1). Every Table 1 run records recall too, so when
    the Table 1 result file of the same data, scale and options exists (``reuse=auto``, default)
    its rows are re-issued as Table 3 rows instead of training everything again; ``reuse=no``
    re-runs."""
    options = dict(options)
    reuse = str(options.pop("reuse", "auto")).lower()
    if reuse not in ("auto", "no"):
        raise ValueError(f"option reuse: reuse must be 'auto' or 'no', got {reuse!r}")
    config = _parse_options(scale, options)
    check_device(device)
    if out is not None and Path(out).name.startswith("table3"):
        source = Path(out).with_name(Path(out).name.replace("table3", "table1", 1))
    else:
        source = _default_out("table1", scale, config.data)
    payload = None
    if reuse == "auto" and source.exists():
        try:
            payload = load_results(source)
        except ValueError as exc:  # unreadable: warn by name and train instead
            import warnings

            warnings.warn(f"ignoring unreadable Table 1 file {source} ({exc}); training Table 3 instead",
                          stacklevel=2)
    if payload is not None:
        cfg = {k: v for k, v in payload["provenance"]["config"].items() if k not in ("table", "device", "torch_threads")}
        if cfg == _config_json(config):
            records = []
            for record in payload["records"]:
                record = dict(record, table="table3")
                if record.get("paper_row"):
                    record["paper_row"] = record["paper_row"].replace(".table1.", ".table3.")
                if record.get("claim"):
                    record["claim"] = record["claim"].replace(".table1.", ".table3.")
                records.append(record)
            out = Path(out) if out is not None else source.with_name(source.name.replace("table1", "table3"))
            prov = dict(payload["provenance"], config={**payload["provenance"]["config"], "table": "table3",
                                                       "derived_from": str(source)})
            return write_results(out, records, prov, force=force)
    return _run_command("table3", scale, device, out, options, force)


# ---------------------------------------------------------------------------------------------- display
_ROW_ORDER = ["fasttext-softmax", "vw-log_multi", "flat", "fasttext-hs", "huffman2", "huffman5", "huffman20",
              "learned5", "learned20"]


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def table_markdown(records: Sequence[dict[str, Any]], recall: bool = False) -> str:
    """Our rows laid out like the paper's Table 1 (``recall=False``) or Table 3 (with R@1)."""
    head = ["d", "Model", "Implementation", "Arity", "P@1"] + (["R@1"] if recall else []) + \
        ["Train", "Test", "Nodes visited", "Expected depth", "LR"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = [r for r in records if r.get("model") != "gain"]
    rows.sort(key=lambda r: (r["d"], _ROW_ORDER.index(r["output"]) if r["output"] in _ROW_ORDER else 99))
    for r in rows:
        arity = "-" if r.get("arity") is None else str(r["arity"])
        if r.get("skipped"):
            cells = [str(r["d"]), r["model"], r["implementation"], arity, f"skipped: {r['skipped']}"] + \
                [""] * (len(head) - 5)
        else:
            visited = r.get("nodes_visited")
            cells = [str(r["d"]), r["model"], r["implementation"], arity, f"{r['p_at_1']:.1f}"]
            cells += [f"{r['r_at_1']:.2f}"] if recall else []
            cells += [_seconds(r.get("train_seconds")), _seconds(r.get("test_seconds")),
                      "-" if visited is None else f"{visited:.1f}",
                      "-" if r.get("expected_depth") is None else f"{r['expected_depth']:.2f}",
                      f"{r['lr']:g}"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def paper_table_markdown(table: str = "table1") -> str:
    """The paper's YFCC100M rows (ICML Table 1, or supplement Table 3 with recall), as printed."""
    from hsm import paper

    recall = table == "table3"
    head = ["d", "Model", "Arity", "P@1"] + (["Recall"] if recall else []) + ["Train", "Test"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for number in paper.table(f"icml2017.{table}"):
        if not number.key.endswith(".p_at_1"):
            continue
        base = number.key[: -len(".p_at_1")]
        s = number.setting
        rec = paper.NUMBERS.get(f"{base}.recall")
        cells = [str(s["d"]), s["model"], "-" if s["arity"] is None else str(s["arity"]), f"{number.value:g}"]
        cells += [("-" if rec is None else f"{rec.value:g}")] if recall else []
        cells += [paper.get(f"{base}.train_time").printed, paper.get(f"{base}.test_time").printed]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
