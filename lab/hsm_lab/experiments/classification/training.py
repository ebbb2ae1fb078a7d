"""Training the bag-of-words classifier (ICML §7.1, supplement §11.1): the output layers of the
table (:func:`build_output_layer`), the PyTorch mini-batch trainer (:func:`train_bow`) and the
adapter to the compiled per-example trainer (:class:`hsm.classifiers.fast_classifier.FastBowClassifier`)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from hsm import RowSparseSGD, Tree, TreeLearner
from hsm_lab.output_layers import output_layer
from hsm_lab.config import seed_everything
from hsm.classifiers.fast_classifier import fixed_depth_start
from hsm.layers import NonFiniteInputError
from hsm.text_models import BagOfWordsClassifier, make_bags

from hsm_lab.experiments.classification.data import EncodedSplit, _label_counts
from hsm_lab.experiments.classification.presets import LEARNED_KINDS, OUTPUTS, REASSIGNS

__all__ = ["TrainedBow", "build_output_layer", "train_bow"]


def build_output_layer(output: str, dim: int, counts: np.ndarray) -> tuple[torch.nn.Module, Tree | None]:
    """The output layer ``output`` (a key of :data:`OUTPUTS`) over ``len(counts)`` labels, zero
    initialised as fastText initialises its output matrix (so every run starts from the uniform
    distribution); Huffman trees are built on the training label counts, and a fixed-depth tree
    (kind ``learned_fixed_depth``) is :func:`hsm.classifiers.fast_classifier.fixed_depth_start`, the compiled
    trainer's own start."""
    if output not in OUTPUTS:
        raise ValueError(f"unknown output layer {output!r}; choose from {list(OUTPUTS)}")
    kind, arity = OUTPUTS[output]
    if kind == "flat":
        return output_layer("flat", dim, counts.size, zero=True), None
    if kind == "learned_fixed_depth":
        tree = fixed_depth_start(counts, arity)
    else:  # +1: a tag never seen in training still gets a (rare) leaf instead of a zero-weight tie
        tree = Tree.huffman(counts + 1.0, arity)
    return output_layer("tree", dim, counts.size, tree=tree, sparse=True, zero=True), tree


@dataclass
class TrainedBow:
    """A trained classifier: the bag-of-words ``model``, its output ``layer``, the tree learner
    (None unless the tree is learned) and the tree it started from, the training time, the mean
    loss of the last epoch, and the share of labels each AssignLabels call moved."""

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

    ``trainer="fast"``: :class:`hsm.classifiers.fast_classifier.FastBowClassifier`, compiled per-example
    Hogwild SGD on ``threads`` threads as fastText and the authors' fork train (``batch_size`` is
    then 1 by construction and ignored), with the statistics policy ``statistics`` ("ours" or
    "released") and the rebuild ``schedule`` ("first_half" or the fork's "every_tokens"); unigram
    bags on the CPU only (ValueError otherwise). ``trainer="torch"``: the PyTorch path below.

    SGD on the **summed** per-example NLL of each mini-batch, so ``lr`` is the per-example step
    of fastText's Hogwild SGD, decreased linearly to 0 over ``epochs`` passes. For a learned tree
    (Algorithm 1): rate constant for the first half, AssignLabels (Algorithm 2) ``reassigns``
    times, evenly spread over that half, then :meth:`TreeLearner.freeze` and a linear decay,
    ``lr_t = lr * min(1, 2 (1 - progress))`` as the released code's schedule.

    Tree-learning details the paper leaves open, set as the authors' released fastText fork does
    (the classification chapter's recipe table, ``notebooks/classification.md``):
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
    # with ngrams=2 the bigram ids live above vocab_size: the model adds the bucket rows itself
    model = BagOfWordsClassifier(vocab_size, dim, ngrams=ngrams, reduce=reduce, buckets=buckets).to(device)
    layer, start_tree = build_output_layer(output, dim, _label_counts(train))
    layer = layer.to(device)
    learner = None
    if kind in LEARNED_KINDS:
        half = epochs * math.ceil(len(train) / batch_size) // 2
        algorithm = "depth" if kind == "learned_fixed_depth" else "well_formed"  # Algorithm 3 or 2
        learner = TreeLearner(layer, reassign_every=max(1, half // reassigns), score="eq12", algorithm=algorithm,
                              decay=tree_decay, reset_moved_nodes=reset_moved_nodes,
                              prior_mode="current_child" if tree_prior == "sticky" else "uniform")
    params = list(model.parameters()) + list(layer.parameters())
    optimizer = RowSparseSGD(params, lr=lr)  # torch.optim.SGD's update, without its sort of sparse rows
    seconds, loss = _sgd(model, layer, learner, optimizer, train, rng, lr, epochs, batch_size, reassigns, device)
    moved = [record.moved_labels for record in learner.history] if learner is not None else []
    return TrainedBow(model, layer, learner, start_tree, seconds, loss, moved)


def _sgd(model: BagOfWordsClassifier, layer: torch.nn.Module, learner: TreeLearner | None,
         optimizer: torch.optim.Optimizer, train: EncodedSplit, rng: np.random.Generator, lr: float, epochs: int,
         batch_size: int, reassigns: int, device: str) -> tuple[float, float]:
    """:func:`train_bow`'s loop: ``epochs`` shuffled passes of mini-batches of ``batch_size``, one
    label sampled per example and epoch, the rate schedule of its docstring; for a learned tree,
    Algorithm 1's statistics and AssignLabels at every step until ``reassigns`` rebuilds or half of
    training, then the tree is frozen. (train seconds, mean loss per example of the last epoch);
    FloatingPointError when the loss or the representation is not finite."""
    n = len(train)
    total_steps = epochs * math.ceil(n / batch_size)
    half = total_steps // 2
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
    return time.perf_counter() - start, loss_sum / max(loss_count, 1)


def _train_bow_fast(train: EncodedSplit, output: str, dim: int, lr: float, epochs: int, reduce: str, ngrams: int,
                    vocab_size: int | None, reassigns: int, tree_prior: str, tree_decay: float,
                    reset_moved_nodes: bool, seed: int, device: str, statistics: str, schedule: str,
                    threads: int | None) -> TrainedBow:
    """:func:`train_bow` with :class:`hsm.classifiers.fast_classifier.FastBowClassifier`: per-example Hogwild SGD as
    fastText trains (the chapter's section "Mini-batches or one example at a time?")."""
    from types import SimpleNamespace

    from hsm.classifiers.fast_classifier import FastBowClassifier

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
    fixed_depth = kind == "learned_fixed_depth"
    clf = FastBowClassifier(dim=dim, output="learned" if fixed_depth else kind, arity=arity or 2, lr=lr,
                            epochs=epochs, reduce=reduce, depth="fixed" if fixed_depth else "free",
                            rebuilds=reassigns, schedule=schedule, statistics=statistics, decay=tree_decay,
                            prior_mode="current_child" if tree_prior == "sticky" else "uniform",
                            reset_moved_nodes=reset_moved_nodes, threads=threads, seed=seed)
    clf.fit(train, SimpleNamespace(values=train.label_values, offsets=train.label_offsets), num_words=words,
            num_labels=train.num_labels)
    learner = SimpleNamespace(history=clf.history.rebuilds) if kind in LEARNED_KINDS else None
    return TrainedBow(clf.model, clf.layer, learner, clf.start_tree, clf.history.train_seconds,
                      clf.history.epoch_loss[-1], [r.moved_labels for r in clf.history.rebuilds])
