"""Algorithm 1 (joint learning of the representation, the node functions and the tree), and a
generic training loop for a model with an ``hsm`` output layer.

Algorithm 1 interleaves two things:

* ordinary gradient steps on the tree log-likelihood (eq. 5; the LM variant of §6 uses
  ``d log p_target`` in NodeCompute, which for a fixed tree is exactly hierarchical-softmax
  training), during which the node statistics SumProbas / Counts are collected from the node
  outputs of the forward pass (:class:`hsm.NodeStatistics`);
* every so often, AssignLabels: the tree is rebuilt top-down from those statistics with
  Algorithm 3 (fixed depth) or Algorithm 2 (well-formed trees).

:class:`TreeLearner` is that second half, attached to any :class:`HierarchicalSoftmax`; call
:meth:`TreeLearner.step` after each optimiser step. Every experiment that learns a tree uses it.
:func:`train_epoch` and :func:`evaluate` are the loops for a user's model (device-agnostic,
progress bar, NaN check), and the taxonomy experiment's. The language-model and classification
experiments run their own loops around the same :class:`TreeLearner`: the first checkpoints inside
an epoch (an epoch at the paper's scale can outlast a job's time limit), the second changes the rate at
every step (the paper's linear decay) and freezes the tree half-way.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from ._checks import check_count, check_fraction
from .assign import ReassignRecord, Reassignment, rebuild_tree
from .label_addition import LabelAddition, add_labels
from .layers import HierarchicalSoftmax, NonFiniteInputError
from .objective import RankingScore, check_ranking_score
from .tree import check_integer
from .statistics import NodeStatistics, node_objectives

__all__ = ["LEARN_SHARE", "REBUILDS", "ReassignRecord", "TreeLearner", "evaluate", "train_epoch"]

#: :meth:`TreeLearner.for_planned_steps`'s defaults: the share of the planned steps that learn the tree,
#: and the rebuilds in that share (the PTB schedule of the language-model chapters: 3 of 6 epochs, 20 a epoch)
LEARN_SHARE = 0.5
REBUILDS = 60


def _process_group_size() -> int:
    """The number of processes of the default ``torch.distributed`` group; 1 outside one."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return 1
    return torch.distributed.get_world_size()


class TreeLearner:
    """Learn the tree of a :class:`HierarchicalSoftmax` during training (Algorithm 1).

    Parameters
    ----------
    layer: the tree softmax whose tree is learned.
    reassign_every: optimiser steps between two AssignLabels calls (the papers: 20 or 50 per
        epoch, i.e. ``steps_per_epoch // 50``).
    score: AssignLabels' ranking score, ``"eq12"`` (ICML eq. 12, the LM variant, default) or
        ``"eq10"`` (eq. 10).
    algorithm: ``"depth"`` (Algorithm 3), ``"well_formed"`` (Algorithm 2) or ``"auto"``
        (Algorithm 3 for fixed-depth trees, else Algorithm 2).
    decay: the factor that multiplies the node statistics at every re-assignment. The default 1
        never forgets them, what the language-model chapters found best (on PTB and Gutenberg;
        0.5 and resetting did worse). :class:`NodeStatistics` built directly keeps its own
        default of 0.5, on which the experiments that build it rely.
    prior, prior_mode: see :mod:`hsm.statistics`.
    freeze_after: freeze the tree (:meth:`freeze`) when the step count reaches this, after the
        re-assignment due at that step; None (default): learn until :meth:`freeze` is called.
    statistics: a ready :class:`NodeStatistics` (or subclass) to use instead of building one.
    record_objective: record the mean J_n per depth before every rebuild (True), never (False),
        or every n-th rebuild (an int); at K = 250k it costs about as much as the rebuild itself.
    reset_moved_nodes: re-initialise the parameters of nodes Algorithm 2 moves to a new place.

    The schedule that pays is learn, freeze, fine-tune: learn the tree for part of the training
    (the language-model chapters: most of it, with many steps between rebuilds), then freeze it
    and keep training the model on the final tree, which pays back what every moved label cost::

        learner = TreeLearner(layer, reassign_every=steps_per_epoch // 20,
                              freeze_after=learn_epochs * steps_per_epoch)
        # or call learner.freeze() yourself after the learning epochs

    Raises TypeError for a non-integer ``reassign_every`` or ``freeze_after``, or a layer that is
    not a :class:`HierarchicalSoftmax`; ValueError for ``reassign_every < 1``, ``freeze_after <
    1``, an unknown ``score`` or ``algorithm``, and (from :class:`NodeStatistics`) ``decay``
    outside [0, 1] or ``prior`` not finite and > 0; RuntimeError inside an initialised
    ``torch.distributed`` process group of several processes, where each rank would learn its own
    tree from its own shard (use :class:`hsm.distributed.DistributedTreeLearner` there).

    Checkpoints: save ``layer.state_dict()`` (parameters *and* tree) and ``learner.state_dict()``
    (tree, statistics, step count, history); loading both into a fresh layer and learner, built on
    any tree of the same shape, resumes Algorithm 1 exactly (tests/test_bad_inputs_layers.py).
    """

    #: whether the class keeps the ranks of a process group on one tree; a plain TreeLearner
    #: learns from its own process's batches only, so several processes would fork the model
    _synchronises_ranks = False

    def __init__(
        self,
        layer: HierarchicalSoftmax,
        reassign_every: int,
        score: RankingScore | None = None,
        algorithm: Literal["auto", "depth", "well_formed"] = "auto",
        decay: float = 1.0,
        prior: float = 1.0,
        reset_moved_nodes: bool = True,
        prior_mode: str = "current_child",
        statistics: NodeStatistics | None = None,
        record_objective: bool | int = True,
        freeze_after: int | None = None,
    ) -> None:
        if not isinstance(layer, HierarchicalSoftmax):
            raise TypeError("TreeLearner needs an hsm.HierarchicalSoftmax layer")
        if not self._synchronises_ranks:
            world = _process_group_size()
            if world > 1:
                raise RuntimeError(f"TreeLearner would learn a different tree in each of the {world} processes of "
                                   "the torch.distributed group: use hsm.distributed.DistributedTreeLearner")
        if check_integer(reassign_every, "reassign_every") < 1:
            raise ValueError(f"reassign_every must be >= 1, got {reassign_every}")
        if freeze_after is not None and check_integer(freeze_after, "freeze_after") < 1:
            raise ValueError(f"freeze_after must be None or >= 1, got {freeze_after}")
        score = check_ranking_score(score, default="eq12")
        if not isinstance(record_objective, (bool, np.bool_, int, np.integer)):
            raise TypeError(f"record_objective must be True, False or an int >= 0, got {record_objective!r}")
        if record_objective < 0:
            raise ValueError(f"record_objective must be True, False or an int >= 0, got {record_objective}")
        if statistics is not None:
            if not isinstance(statistics, NodeStatistics):
                raise TypeError(f"statistics must be an hsm.NodeStatistics, got {type(statistics).__name__}")
            if statistics.num_labels != layer.num_labels or statistics.arity != layer.arity:
                raise ValueError(f"the statistics are for K={statistics.num_labels}, M={statistics.arity}; the layer "
                                 f"has K={layer.num_labels}, M={layer.arity}")
        if algorithm == "auto":
            algorithm = "depth" if layer.tree.depth_limit is not None else "well_formed"
        if algorithm not in ("depth", "well_formed"):
            raise ValueError(f"algorithm must be 'auto', 'depth' or 'well_formed', got {algorithm!r}")
        if algorithm == "depth" and layer.tree.depth_limit is None:
            raise ValueError("algorithm='depth' (Algorithm 3) needs a fixed-depth tree")
        self.layer = layer
        self.reassign_every = int(reassign_every)
        self.score: RankingScore = score
        self.algorithm = algorithm
        self.reset_moved_nodes = reset_moved_nodes
        self.record_objective = int(record_objective)
        self.statistics = statistics if statistics is not None else NodeStatistics(
            layer.tree, prior=prior, decay=decay, device=layer.weight.device, prior_mode=prior_mode)
        layer.statistics = self.statistics
        self.freeze_after = None if freeze_after is None else int(freeze_after)
        self.steps = 0
        self.frozen = False
        self.history: list[ReassignRecord] = []

    @classmethod
    def for_planned_steps(cls, layer: HierarchicalSoftmax, planned_steps: int, learn_share: float = LEARN_SHARE,
                          rebuilds: int = REBUILDS, **kwargs: Any) -> "TreeLearner":
        """A learner whose schedule is set by the number of optimiser steps the training will take, for
        training counted in steps (or in time: estimate the steps from the first ones' rate): the tree is
        rebuilt ``rebuilds`` times, evenly, over the first ``learn_share`` of ``planned_steps``, then frozen
        for the rest (learn, freeze, fine-tune). The defaults are the rule the language-model runs
        support: learn for the first half, with 60 rebuilds (PTB: 3 of 6 epochs at 20 a epoch).
        Other keyword arguments go to the constructor. The chosen ``reassign_every`` and
        ``freeze_after`` are attributes of the learner.

        Raises TypeError for a non-integer ``planned_steps`` or ``rebuilds``; ValueError unless
        ``planned_steps >= 1``, ``rebuilds >= 1`` and ``0 < learn_share <= 1``."""
        planned_steps, rebuilds = check_count(planned_steps, "planned_steps", 1), check_count(rebuilds, "rebuilds", 1)
        if check_fraction(learn_share, "learn_share") == 0:
            raise ValueError("learn_share must be > 0: the share of the planned steps that learn the tree")
        learning = max(1, round(learn_share * planned_steps))
        every = max(1, learning // rebuilds)
        return cls(layer, reassign_every=every, freeze_after=every * max(1, learning // every), **kwargs)

    def step(self) -> Reassignment | None:
        """Count one optimiser step; run AssignLabels when one is due, then freeze the tree if the
        count has reached ``freeze_after`` (only at that step: an :meth:`unfreeze` later holds)."""
        self.steps += 1
        result = None
        if not self.frozen and self.steps % self.reassign_every == 0:
            result = self.reassign()
        if self.steps == self.freeze_after and not self.frozen:
            self.freeze()
        return result

    def objective_by_depth(self) -> dict[int, float]:
        """Mass-weighted mean J_n (eq. 6, continuous estimate) of the nodes at each depth."""
        stats = node_objectives(self.layer.tree, self.statistics)
        out = {}
        for depth in np.unique(stats["depth"]):
            sel = stats["depth"] == depth
            out[int(depth)] = float(np.average(stats["objective"][sel], weights=stats["mass"][sel]))
        return out

    def reassign(self) -> Reassignment:
        """AssignLabels over the whole tree from the statistics collected so far."""
        every = self.record_objective
        before = self.objective_by_depth() if every and len(self.history) % every == 0 else {}

        def install(result: Reassignment) -> None:
            self.layer.set_tree(result.tree, reset_nodes=result.moved_nodes if self.reset_moved_nodes else None)

        result, record = rebuild_tree(self.layer.tree, self.statistics, self.algorithm, install, step=self.steps,
                                      score=self.score, objective_by_depth=before)
        self.history.append(record)
        return result

    def add_labels(self, examples: Sequence[Tensor], label_names: Sequence[str] | None = None,
                   placement: Literal["objective", "random"] = "objective", seed: int = 0, local_steps: int = 0,
                   local_lr: float = 0.1, reference: Tensor | None = None,
                   rehearsal: tuple[Tensor, Tensor] | None = None) -> LabelAddition:
        """Add labels the layer was not trained on, without retraining
        (:func:`hsm.label_addition.add_labels`): ``examples[i]`` [n_i, d] are representations of a
        few examples of new label ``K + i``; each is placed by Algorithm 2's pair score against
        this learner's statistics, under the tree's rule (fixed depth or well formed). The layer
        grows in place (new ``nn.Parameter`` objects: rebuild the optimiser); the statistics
        follow the grown tree, keeping what the trained labels collected."""
        old_labels = self.layer.num_labels
        result = add_labels(self.layer, examples, statistics=self.statistics, score=self.score,
                            label_names=label_names, placement=placement, seed=seed, local_steps=local_steps,
                            local_lr=local_lr, reference=reference, rehearsal=rehearsal)
        self.statistics = self.statistics.grown(result.tree, old_labels)
        if not self.frozen:
            self.layer.statistics = self.statistics
        return result

    def freeze(self) -> None:
        """Stop learning the tree (the ICML classification schedule freezes it half-way)."""
        self.frozen = True
        self.layer.statistics = None

    def unfreeze(self) -> None:
        self.frozen = False
        self.layer.statistics = self.statistics

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume Algorithm 1 from a checkpoint: the current tree (as its
        JSON description), the statistics, the step counter and the history. The layer's own
        parameters go in ``layer.state_dict()`` as usual."""
        return {"tree": self.layer.tree.to_dict(), "statistics": self.statistics.state_dict(), "steps": self.steps,
                "frozen": self.frozen, "history": [vars(record) for record in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: installs the saved tree in the layer (as the layer's own
        ``load_state_dict`` does) and restores the statistics, step count, frozen flag and
        history. Everything is checked against the saved tree first, and nothing is changed
        unless all of it loads: ValueError when ``state`` lacks an entry, its tree does not fit the
        layer (another K, M or N), or an entry is damaged (truncated or NaN / negative statistics,
        ``prior``, ``decay`` or ``prior_mode`` out of range, a bad step count or history;
        :meth:`hsm.statistics.NodeStatistics.checked_state`)."""
        from .tree import Tree

        if not isinstance(state, dict):
            raise ValueError(f"a TreeLearner state is a dict from TreeLearner.state_dict(), got {type(state).__name__}")
        missing = [key for key in ("tree", "statistics", "steps", "frozen", "history") if key not in state]
        if missing:
            raise ValueError(f"the TreeLearner state lacks {', '.join(map(repr, missing))} "
                             "(is it a TreeLearner.state_dict()?)")
        # everything is checked against the saved tree before anything is installed: a damaged
        # state leaves the layer and the learner as they were (all or nothing)
        try:
            tree = Tree.from_dict(state["tree"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the TreeLearner state's tree: {exc}") from None
        layer = self.layer
        if tree.arity != layer.arity or tree.num_nodes != layer.num_nodes or tree.num_labels != layer.num_labels:
            raise ValueError(f"the saved tree has K={tree.num_labels}, M={tree.arity}, N={tree.num_nodes}; the layer "
                             f"was built for K={layer.num_labels}, M={layer.arity}, N={layer.num_nodes}")
        if not hasattr(self.statistics, "checked_state"):  # a statistics object of the user's own
            raise ValueError(f"{type(self.statistics).__name__} cannot be restored by TreeLearner.load_state_dict "
                             "(it has no checked_state); restore it yourself")
        statistics = self.statistics.checked_state(state["statistics"], tree)
        steps = state["steps"]
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ValueError(f"the TreeLearner state's steps must be an integer >= 0, got {steps!r}")
        if not isinstance(state["frozen"], (bool, np.bool_)):
            raise ValueError(f"the TreeLearner state's frozen must be True or False, got {state['frozen']!r}")
        if not isinstance(state["history"], list):
            raise ValueError("the TreeLearner state's history must be a list of reassignment records")
        try:
            history = [ReassignRecord(**record) for record in state["history"]]
        except TypeError as exc:
            raise ValueError(f"the TreeLearner state's history holds a record that is not a ReassignRecord ({exc})") \
                from None
        layer.set_tree(tree)
        self.statistics._install(tree, statistics)
        self.steps = int(steps)
        self.history = history
        self.freeze() if state["frozen"] else self.unfreeze()


Batch = tuple[Tensor, Tensor]


def _progress(iterable: Iterable[Any], enabled: bool, **kwargs: Any) -> Iterable[Any]:
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ModuleNotFoundError:  # tqdm comes with the lab's extra; the library trains without a bar
        return iterable
    return tqdm(iterable, **kwargs)


def _kept(output_layer: nn.Module, y: Tensor) -> Tensor:
    """Which targets of ``y`` the layer evaluates: all but its ``ignore_index`` (padding), as
    ``nn.CrossEntropyLoss`` counts them; every target for a layer without that option
    (``nn.AdaptiveLogSoftmaxWithLoss``, say)."""
    ignore_index = getattr(output_layer, "ignore_index", None)
    if ignore_index is None:
        return torch.ones_like(y, dtype=torch.bool)
    return y != ignore_index


def _no_targets(output_layer: nn.Module, what: str) -> str:
    """The error for batches that hold no target to count (all empty, or all padding)."""
    ignore_index = getattr(output_layer, "ignore_index", None)
    if ignore_index is None:
        return f"no targets to {what}: every batch is empty"
    return (f"no targets to {what}: every batch is empty or all the layer's ignore_index ({ignore_index}); "
            "mark only the padding with it")


def train_epoch(
    model: nn.Module,
    output_layer: nn.Module,
    batches: Iterable[Batch],
    optimizer: torch.optim.Optimizer,
    learner: TreeLearner | None = None,
    device: torch.device | str = "cpu",
    progress: bool = False,
    max_steps: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> float:
    """One pass over ``batches`` of ``(x, y)``: ``h = model(x)``, ``loss = output_layer(h, y).loss``.

    ``y`` may be ``[B]`` or a sequence model's ``[B, T]`` with padding marked by the layer's
    ``ignore_index``. Returns the mean loss per kept target (one that is not ``ignore_index``) over
    the epoch, whatever the layer's ``reduction``: a batch's loss is turned into its sum over its
    kept targets (``"mean"`` times their number, ``"sum"`` as it is), so batches count by their
    kept targets, not by their rows, and a ``"sum"`` layer reports the same number as a ``"mean"``
    one. ``on_step(step, loss)`` gets the batch's mean in the same sense. A batch with no kept
    target (all padding) has nothing to learn from and is skipped (no optimiser step).

    Raises :class:`FloatingPointError` naming the step as soon as the loss, or the output layer's
    input, is not finite (a diverging learning rate, typically), rather than training on NaNs;
    ValueError when there is no batch, or no kept target in any.
    """
    model.train()
    output_layer.train()
    sum_layer = getattr(output_layer, "reduction", "mean") == "sum"
    total, count, batches_seen = 0.0, 0, 0
    for step, (x, y) in enumerate(_progress(batches, progress, desc="train", leave=False)):
        if max_steps is not None and step >= max_steps:
            break
        batches_seen += 1
        # counted where the batch arrives (the host, for a DataLoader): no wait for the device
        kept = int(_kept(output_layer, y).sum())
        if kept == 0:  # its mean loss is NaN (the mean of nothing), which is no divergence
            continue
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        try:
            loss = output_layer(model(x), y).loss
        except NonFiniteInputError as error:  # the model's output diverged: the same report as a NaN loss
            raise FloatingPointError(f"the output layer's input is not finite at step {step} ({error}): lower the "
                                     "learning rate or check the inputs") from error
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"loss is {value} at step {step}: lower the learning rate or check the inputs")
        loss.backward()
        optimizer.step()
        if learner is not None:
            learner.step()
        batch_sum = value if sum_layer else value * kept
        total += batch_sum
        count += kept
        if on_step is not None:
            on_step(step, batch_sum / kept)
    if batches_seen == 0:
        raise ValueError("no batches to train on (empty data?)")
    if count == 0:
        raise ValueError(_no_targets(output_layer, "train on"))
    return total / count


@torch.no_grad()
def evaluate(
    model: nn.Module,
    output_layer: nn.Module,
    batches: Iterable[Batch],
    device: torch.device | str = "cpu",
    progress: bool = False,
    accuracy: bool = True,
) -> dict[str, float]:
    """Mean negative log-likelihood (nats), perplexity exp(NLL) and, unless ``accuracy=False``
    (it runs the exact search on every batch), top-1 accuracy.

    All three are over the kept targets: ``y`` may be ``[B]``, or ``[B, T]`` (flattened or not)
    with padding marked by the layer's ``ignore_index``, and a padded position is neither
    evaluated nor counted, so a padded batch gives the numbers of its real tokens (as
    ``nn.CrossEntropyLoss`` with ``ignore_index`` does). ValueError when there is no batch, or no
    kept target in any."""
    model.eval()
    output_layer.eval()
    nll, correct, count, batches_seen = 0.0, 0, 0, 0
    for x, y in _progress(batches, progress, desc="eval", leave=False):
        batches_seen += 1
        x, y = x.to(device), y.to(device)
        kept = _kept(output_layer, y)
        kept_count = int(kept.sum())
        if kept_count == 0:  # all padding (or empty): nothing to evaluate
            continue
        h = model(x)
        # the layer gives padded positions 0; the mask makes that hold for any layer
        nll -= float(torch.where(kept, output_layer(h, y).output, 0.0).sum())
        if accuracy:
            correct += int(((output_layer.predict(h) == y) & kept).sum())
        count += kept_count
    if batches_seen == 0:
        raise ValueError("no batches to evaluate (empty data?)")
    if count == 0:
        raise ValueError(_no_targets(output_layer, "evaluate"))
    out = {"nll": nll / count, "perplexity": math.exp(nll / count)}
    if accuracy:
        out["accuracy"] = correct / count
    return out
