"""The training driver of :class:`hsm.classifiers.fast_classifier.FastBowClassifier`: compiled per-example
Hogwild SGD over chunks of examples, with Algorithm 1's AssignLabels calls between chunks.

:class:`HogwildTrainer` runs one :meth:`FastBowClassifier.fit <hsm.classifiers.fast_classifier.FastBowClassifier.fit>`:
it plans when the tree is rebuilt (:func:`first_half_plan`, ICML §11.1, or :func:`token_plan`,
the released fork's ``FastText::trainThread``), cuts every epoch into chunks at those points,
runs each chunk on the kernel :func:`_sgd_examples` split over Hogwild threads (fastText's
threads, Recht et al. 2011), and between two chunks calls AssignLabels (Algorithm 2) on the
node statistics the kernel collected (NodeCompute of Algorithm 1). Each thread's share of a
chunk is itself run in steps of about :data:`STEP_WORK` multiply-adds, so that Python, and with
it Ctrl-C, gets control a few times a second; a step carries on the progress count where the
previous one stopped, so the updates, their order and the rates are those of one call. The module docstring of
:mod:`hsm.classifiers.fast_classifier` says what one kernel step computes (eq. 5 and its SGD step) and why
the rate and rebuild schedules are what they are.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numba
import numpy as np
import torch

from hsm.assign import ReassignRecord, Reassignment, rebuild_tree
from hsm.kernels import FASTMATH, run_on_pool
from hsm.layers import FlatSoftmax, HierarchicalSoftmax
from hsm.objective import RankingScore
from hsm.statistics import NodeStatistics, ReleasedStatistics
from hsm.tree import Tree

__all__ = ["FitHistory", "HogwildTrainer", "TrainedClassifier", "first_half_plan", "output_arrays", "path_arrays", "statistics_arrays",
           "token_plan"]

_SCHEDULE_LINEAR, _SCHEDULE_CONSTANT_THEN_LINEAR = 0, 1

#: multiply-adds one call of the compiled kernel does per thread, about 10-50 ms of work: a
#: KeyboardInterrupt is only seen between two calls (the kernel runs without Python), and a call
#: costs about 0.1 ms of hand-off, so longer steps would gain nothing and shorter ones start to cost
STEP_WORK = 200_000_000
_NEG_INF = np.float32(-np.inf)


# ---------------------------------------------------------------------------------------------- kernels
@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def example_rate(lr, schedule, start, k, stride, phase, total):  # pragma: no cover - compiled
    """The step size of the k-th example of a chunk: training has done ``start + k * stride +
    phase`` of its ``total`` examples; ``schedule`` 0 decays the rate linearly to 0 (fastText),
    1 keeps it constant for the first half and then decays it linearly (ICML §11.1)."""
    progress = (start + k * stride + phase) / total
    if schedule == 0:
        return np.float32(lr * (1.0 - progress))
    return np.float32(lr * min(1.0, 2.0 * (1.0 - progress)))


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH, error_model="numpy")
def _sgd_examples(values, offsets, order, targets, mean, embedding, weight, bias, penalty, path_nodes,
                  path_children, path_mask, lr, schedule, start, stride, phase, total, collect, sum_probas,
                  path_counts, label_counts, losses):  # pragma: no cover - compiled
    """One SGD step per example ``order[k]`` (k = 0, 1, ...), in place; ``losses[k]`` gets its NLL.

    ``values`` / ``offsets``: the ragged documents (word ids); ``targets[i]`` example i's label;
    ``embedding`` [V, d]; ``weight`` [N, M*d], ``bias`` [N, M] (0 rows: none), ``penalty`` [N, M]
    (-inf on slots holding no real label; 0 rows: none) and the label paths ``path_*`` [K', L] of
    the tree (the flat softmax: one node, M = K). The k-th example's rate uses progress
    ``(start + k * stride + phase) / total``. With ``collect``, SumProbas / Counts of Algorithm 1
    are added per (label, depth) (:class:`hsm.NodeStatistics`' layout). Returns -1, or the k of
    the first example whose loss is not finite (it stops there).
    """
    dim = embedding.shape[1]
    arity = weight.shape[1] // dim
    has_bias = bias.shape[0] > 0
    has_penalty = penalty.shape[0] > 0
    length = path_nodes.shape[1]
    h = np.empty(dim, dtype=np.float32)
    grad = np.empty(dim, dtype=np.float32)
    logit = np.empty(arity, dtype=np.float32)
    one = np.float32(1.0)
    for k in range(order.shape[0]):
        i = order[k]
        rate = example_rate(lr, schedule, start, k, stride, phase, total)
        first, last = offsets[i], offsets[i + 1]
        for j in range(dim):
            h[j] = 0.0
            grad[j] = 0.0
        for t in range(first, last):
            row = values[t]
            for j in range(dim):
                h[j] += embedding[row, j]
        count = last - first
        if mean and count > 0:
            for j in range(dim):
                h[j] /= np.float32(count)  # EmbeddingBag's mean: the sum, then a division
        y = targets[i]
        loss = 0.0
        for depth in range(length):
            if not path_mask[y, depth]:
                break  # paths are padded at the end
            n = path_nodes[y, depth]
            c = path_children[y, depth]
            top = _NEG_INF
            for m in range(arity):
                if has_penalty and penalty[n, m] == _NEG_INF:
                    logit[m] = _NEG_INF  # a slot holding no real label: probability 0
                    continue
                base = m * dim
                acc = np.float32(0.0)
                for j in range(dim):
                    acc += weight[n, base + j] * h[j]
                if has_bias:
                    acc += bias[n, m]
                logit[m] = acc
                top = max(top, acc)
            norm = np.float32(0.0)
            for m in range(arity):
                norm += np.exp(logit[m] - top)
            loss += np.log(norm) + top - logit[c]
            inverse = one / norm
            for m in range(arity):
                p = np.exp(logit[m] - top) * inverse
                if collect:
                    sum_probas[y, depth, m] += p
                alpha = rate * ((one if m == c else np.float32(0.0)) - p)
                if alpha == 0.0:
                    continue  # masked slots (p = 0, m != c): nothing to add
                base = m * dim
                for j in range(dim):
                    w = weight[n, base + j]
                    grad[j] += alpha * w  # the input gradient uses the weights before this update
                    weight[n, base + j] = w + alpha * h[j]
                if has_bias:
                    bias[n, m] += alpha
            if collect:
                path_counts[y, depth] += 1.0
        if collect:
            label_counts[y] += 1.0
        losses[k] = loss
        if not np.isfinite(loss):
            return k
        if mean and count > 0:
            for j in range(dim):
                grad[j] /= np.float32(count)
        for t in range(first, last):
            row = values[t]
            for j in range(dim):
                embedding[row, j] += grad[j]
    return -1


@numba.njit(cache=True)
def _token_checks(lengths, local, rate):  # pragma: no cover - compiled
    """fastText's ``lrUpdateRate`` checks over one epoch: after example k (in visiting order)
    the local token count ``local`` (carried over from the previous epoch) grows by
    ``lengths[k]``; a check happens when it exceeds ``rate``, and it restarts from 0. Returns
    (positions: examples done at each check, tokens added since the previous check, the local
    count left at the end)."""
    positions = np.empty(lengths.shape[0], dtype=np.int64)
    added = np.empty(lengths.shape[0], dtype=np.int64)
    count = 0
    for k in range(lengths.shape[0]):
        local += lengths[k]
        if local > rate:
            positions[count] = k + 1
            added[count] = local
            count += 1
            local = 0
    return positions[:count].copy(), added[:count].copy(), local


# ---------------------------------------------------------------------------------------------- operands
def path_arrays(tree: Tree | None, num_labels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(penalty, path_nodes, path_children, path_mask) as the kernels read them: ``penalty``
    [N, M] is -inf on slots holding no real label (0 rows when every slot holds one);
    ``tree=None`` is the flat softmax, one node with ``num_labels`` children."""
    if tree is None:
        k = num_labels
        return (np.zeros((0, k), dtype=np.float32), np.zeros((k, 1), dtype=np.int64),
                np.arange(k, dtype=np.int64)[:, None], np.ones((k, 1), dtype=bool))
    penalty = (np.zeros((0, tree.arity), dtype=np.float32) if tree.slot_mask.all()
               else np.where(tree.slot_mask, 0.0, -np.inf).astype(np.float32))
    return (penalty, np.ascontiguousarray(tree.path_nodes, dtype=np.int64),
            np.ascontiguousarray(tree.path_children, dtype=np.int64), np.ascontiguousarray(tree.path_mask))


def output_arrays(layer: HierarchicalSoftmax | FlatSoftmax, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                       np.ndarray, np.ndarray, np.ndarray]:
    """(weight [N, M*d], bias [N, M], penalty, path_nodes, path_children, path_mask): views of
    the layer's tensors (the kernel writes the parameters in place); the flat softmax is one
    node with K children."""
    if isinstance(layer, FlatSoftmax):
        k = layer.num_labels
        weight = layer.linear.weight.data.numpy().reshape(1, k * dim)
        bias = (layer.linear.bias.data.numpy().reshape(1, k) if layer.linear.bias is not None
                else np.zeros((0, k), dtype=np.float32))
        return (weight, bias, *path_arrays(None, k))
    tree = layer.tree
    weight = layer.weight.data.numpy()
    bias = layer.bias.data.numpy() if layer.bias is not None else np.zeros((0, tree.arity), dtype=np.float32)
    return (weight, bias, *path_arrays(tree, tree.num_labels))


def statistics_arrays(stats: NodeStatistics | ReleasedStatistics | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(SumProbas, path counts, label counts) of Algorithm 1's statistics as arrays the kernel adds
    to in place; empty arrays when no statistics are collected."""
    if stats is None:
        return np.zeros((0, 1, 1), np.float32), np.zeros((0, 1), np.float32), np.zeros(0, np.float32)
    if isinstance(stats, NodeStatistics):
        return stats.sum_probas.numpy(), stats.path_counts.numpy(), stats.label_counts.numpy()
    return stats.sum_probas, stats.path_counts, stats.label_counts


# ---------------------------------------------------------------------------------------------- rebuild plans
def first_half_plan(total: int, rebuilds: int) -> tuple[list[int], int]:
    """``schedule="first_half"``: (examples done at each rebuild, examples after which the
    tree is frozen and statistics are no longer collected), as ``train_bow`` with a batch of
    one: a rebuild every ``half // rebuilds`` examples, frozen once ``rebuilds`` are done or
    half of training is (ICML §11.1)."""
    half = total // 2
    every = max(1, half // rebuilds)
    points = [every * k for k in range(1, rebuilds + 1) if every * k <= half]
    return points, (points[-1] if len(points) == rebuilds else half)


def token_plan(lengths_in_order: np.ndarray, state: dict[str, int], offset: int, rebuild_tokens: int) -> list[int]:
    """``schedule="every_tokens"`` for one epoch whose documents have ``lengths_in_order``:
    the examples done (``offset`` + position) at its rebuilds. ``state`` carries the fork's
    counters (``FastText::trainThread``) from epoch to epoch: ``local`` (tokens since the
    last check), ``tokens`` (counted at the checks), ``next`` (``nextLOMupdate``); a check comes
    every ``rebuild_tokens`` tokens (fastText's ``lrUpdateRate``)."""
    positions, added, state["local"] = _token_checks(lengths_in_order, state["local"], rebuild_tokens)
    points = []
    for position, count in zip(positions.tolist(), added.tolist()):
        state["tokens"] += count
        if state["tokens"] >= state["next"]:
            points.append(offset + position)
            half = state["samples"] // 2
            state["next"] += state["period"] if state["next"] + 1 < half else state["samples"]
    return points


# ---------------------------------------------------------------------------------------------- the driver
@dataclass
class FitHistory:
    """What :meth:`FastBowClassifier.fit` did."""

    #: mean training NLL (nats) of each epoch, measured on each example before its update
    epoch_loss: list[float] = field(default_factory=list)
    #: one record per AssignLabels call (``step`` = examples done; ``moved_labels`` = share of
    #: labels whose path changed; ``moved_nodes`` = internal nodes placed somewhere new)
    rebuilds: list[ReassignRecord] = field(default_factory=list)
    #: seconds of training (the epochs, rebuilds included)
    train_seconds: float = 0.0
    #: examples per second of training
    examples_per_second: float = 0.0
    #: per-example losses in visiting order, one array per epoch (``fit(record_losses=True)``)
    example_losses: list[np.ndarray] = field(default_factory=list)
    #: the visiting order of every epoch (``fit(record_losses=True)``)
    orders: list[np.ndarray] = field(default_factory=list)


class TrainedClassifier(Protocol):
    """What :class:`HogwildTrainer` reads of the classifier it trains (a
    :class:`hsm.classifiers.fast_classifier.FastBowClassifier`): its settings, and the model, output layer and
    statistics it updates in place."""

    dim: int
    arity: int
    epochs: int
    lr: float
    lr_schedule: str
    schedule: str
    rebuilds: int
    rebuild_tokens: int
    depth: Literal["free", "fixed"]
    output: str
    reduce: str
    score: RankingScore
    seed: int
    shuffle: bool
    threads: int | None
    reset_moved_nodes: bool
    model: torch.nn.Module
    layer: HierarchicalSoftmax | FlatSoftmax
    statistics: NodeStatistics | ReleasedStatistics | None


class HogwildTrainer:
    """One training run of ``classifier`` (its settings, model, layer and statistics, which it
    updates in place): :meth:`train` returns the :class:`FitHistory`."""

    def __init__(self, classifier: TrainedClassifier) -> None:
        self.classifier = classifier

    def train(self, values: np.ndarray, offsets: np.ndarray, label_values: np.ndarray, label_offsets: np.ndarray,
              record_losses: bool) -> FitHistory:
        """Every epoch of training on the ragged documents and labels (a chunk of examples per
        rebuild interval, Hogwild threads within a chunk)."""
        clf = self.classifier
        n = offsets.size - 1
        total = clf.epochs * n
        rng = np.random.default_rng(clf.seed)
        threads = clf.threads or torch.get_num_threads()
        schedule = clf.lr_schedule
        if schedule == "auto":
            schedule = "constant_then_linear" if clf.output == "learned" else "linear"
        schedule_code = _SCHEDULE_CONSTANT_THEN_LINEAR if schedule == "constant_then_linear" else _SCHEDULE_LINEAR
        lengths = np.diff(offsets)
        label_lengths = np.diff(label_offsets)
        learning = clf.output == "learned" and clf.rebuilds > 0
        pending: list[int] = []
        collect_until = 0  # statistics are collected while fewer examples than this are done
        tokens: dict[str, int] = {}
        if learning and clf.schedule == "first_half":
            pending, collect_until = first_half_plan(total, clf.rebuilds)
        elif learning:
            samples = int(clf.epochs * lengths.sum())
            tokens = {"samples": samples, "period": samples // 2 // clf.rebuilds, "local": 0, "tokens": 0}
            tokens["next"] = tokens["period"]
        mean, embedding = self._inputs()
        self._step = self._step_examples(lengths, label_lengths.size)
        history = FitHistory()
        start_time = time.perf_counter()
        done = 0
        for epoch in range(clf.epochs):
            order = rng.permutation(n) if clf.shuffle else np.arange(n)
            if (label_lengths == 1).all():
                targets = label_values
            else:  # one label per multi-label example and epoch, uniformly (fastText, train_bow)
                targets = label_values[label_offsets[:-1] + np.floor(rng.random(n) * label_lengths).astype(np.int64)]
            if tokens and tokens["next"] < tokens["samples"]:  # the fork's schedule still has rebuilds to come
                pending += token_plan(lengths[order], tokens, epoch * n, clf.rebuild_tokens)
                collect_until = pending[-1] if tokens["next"] >= tokens["samples"] else total
            losses = np.empty(n, dtype=np.float64)
            position = 0
            while position < n:
                stop = n
                if pending:
                    stop = min(stop, pending[0] - epoch * n)
                if done < collect_until:
                    stop = min(stop, collect_until - epoch * n)
                collect = done < collect_until
                self._run_chunk(values, offsets, order[position:stop], targets, mean, embedding, schedule_code,
                                done, total, collect, losses[position:stop], threads, epoch, position)
                done += stop - position
                position = stop
                if pending and pending[0] == done:
                    pending.pop(0)
                    history.rebuilds.append(self._rebuild(done))
            history.epoch_loss.append(float(losses.mean()))
            if record_losses:
                history.example_losses.append(losses)
                history.orders.append(order)
        history.train_seconds = time.perf_counter() - start_time
        history.examples_per_second = total / max(history.train_seconds, 1e-12)
        return history

    def _inputs(self) -> tuple[bool, np.ndarray]:
        """(mean reduction?, the embedding [V, d] the kernel trains in place)."""
        clf = self.classifier
        return clf.reduce == "mean", clf.model.embedding.weight.data.numpy()

    def _step_examples(self, lengths: np.ndarray, num_docs: int) -> int:
        """Examples per thread and kernel call: :data:`STEP_WORK` over an example's mean work
        (its words read and updated, d each, and M x d weights read and written per node of a
        path of mean length)."""
        clf = self.classifier
        tokens = float(lengths.mean()) if lengths.size else 0.0
        if clf.output == "flat":
            nodes, arity = 1.0, float(clf.layer.num_labels)
        else:
            tree = clf.layer.tree
            nodes, arity = float(tree.path_mask[: tree.num_labels].sum(1).mean()), float(clf.arity)
        work = clf.dim * (2.0 * tokens + 3.0 * arity * nodes) + 1.0
        return max(1, int(STEP_WORK // work))

    def _run_chunk(self, values, offsets, order, targets, mean, embedding, schedule_code, done, total, collect,
                   losses, threads, epoch, position) -> None:
        """Examples ``order`` (done: examples before them) on ``threads`` Hogwild threads, each
        thread's share in steps of ``self._step`` examples (a KeyboardInterrupt is raised between
        two steps). Thread ``index``'s k-th example has progress ``done + k * parts + index``
        however its share is cut into steps."""
        size = order.size
        if size == 0:
            return
        clf = self.classifier
        weight, bias, penalty, nodes, children, mask = output_arrays(clf.layer, clf.dim)
        sum_probas, path_counts, label_counts = statistics_arrays(clf.statistics)
        parts = max(1, min(threads, size))
        bounds = np.linspace(0, size, parts + 1).astype(np.int64)
        shares = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        step = max(1, int(getattr(self, "_step", size)))
        for offset in range(0, max(hi - lo for lo, hi in shares), step):
            # (thread, first, end) of this step: the thread's examples offset .. offset + step - 1
            pieces = [(index, lo + offset, min(hi, lo + offset + step)) for index, (lo, hi) in enumerate(shares)
                      if lo + offset < hi]
            bad = [-1] * len(pieces)

            def task(j: int, lo: int, hi: int, pieces=pieces, bad=bad, offset=offset) -> None:
                index = pieces[j][0]
                bad[j] = _sgd_examples(values, offsets, order[lo:hi], targets, mean, embedding, weight, bias, penalty,
                                       nodes, children, mask, clf.lr, schedule_code, float(done + offset * parts),
                                       float(parts), float(index), float(total), collect, sum_probas, path_counts,
                                       label_counts, losses[lo:hi])

            run_on_pool(task, [(lo, hi) for _, lo, hi in pieces])
            for (_, lo, _), k in zip(pieces, bad):
                if k >= 0:
                    raise FloatingPointError(
                        f"training loss is {losses[lo + k]} at epoch {epoch}, example {int(order[lo + k])} (position "
                        f"{position + lo + k} of the epoch, lr={clf.lr}): the rate is too high")

    def _rebuild(self, done: int) -> ReassignRecord:
        """AssignLabels (Algorithm 2, or Algorithm 3 of the ICML supplement for ``depth="fixed"``) on
        the statistics so far; the new tree goes into the layer."""
        clf = self.classifier
        layer = clf.layer

        def install(result: Reassignment) -> None:
            # the layer re-draws moved nodes from torch's global generator: seeded here, so a run is
            # reproducible from ``seed`` alone, and the caller's stream is left alone
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(clf.seed * 1_000_003 + done)
                layer.set_tree(result.tree, reset_nodes=result.moved_nodes if clf.reset_moved_nodes else None)

        algorithm = "depth" if clf.depth == "fixed" else "well_formed"
        return rebuild_tree(layer.tree, clf.statistics, algorithm, install, step=done, score=clf.score)[1]
