"""One training run of the log-bilinear LM as plain values (:class:`LMRunConfig`), its result
(:class:`LMRunResult`), and the run key that names its files in the run folder.

The key must never change for an existing configuration: finished runs and checkpoints under
``hsm_lab.config.runs_dir()`` (``HSM_RUNS``, else ``lm-runs/`` in the cache) are found by it (see :meth:`LMRunConfig.key`)."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["LMRunConfig", "LMRunResult", "OUTPUT_KINDS", "SAMPLED_KINDS", "RANKING_SCORE"]

OUTPUT_KINDS = ("flat", "random", "clustering", "learned", "adaptive")
#: flat softmax trained with a sampling approximation of the normaliser (Barber & Botev,
#: :class:`hsm.sampling.SampledSoftmax`); exact at evaluation, so perplexities compare directly
SAMPLED_KINDS = ("importance", "bernoulli", "ranking", "blackout", "nce", "negative_sampling")

#: LMRunConfig.wrt (the old name, kept in run keys) -> TreeLearner's score
RANKING_SCORE = {"logp": "eq12", "p": "eq10"}


@dataclass
class LMRunConfig:
    """One training run of the log-bilinear LM with one output layer."""

    output: str  #: flat | random | clustering | learned | one of SAMPLED_KINDS
    context: int = 3
    dim: int = 200
    arity: int = 25
    depth: int = 3
    batch_size: int = 128
    lr: float = 0.025
    epochs: int = 4
    learn_epochs: float = 3  #: learned tree: epochs (may be fractional) during which the tree is re-assigned
    reassign_per_epoch: int = 20
    tree_seed: int = 0
    seed: int = 0
    max_steps_per_epoch: int | None = None  #: LR selection runs stop early
    eval_per_epoch: bool = True
    decay: float = 0.5  #: NodeStatistics decay at each re-assignment (hsm.statistics)
    num_negatives: int = 20  #: sampled outputs: negatives per batch (Barber & Botev's K)
    prior: float = 1.0  #: NodeStatistics pseudo-count (hsm.statistics, point 1)
    prior_mode: str = "current_child"  #: NodeStatistics prior: "current_child" (released code) or "uniform" (thesis)
    #: AssignLabels ranking: "logp" (eq. 12, the LM variant) or "p" (eq. 10); the old spelling of
    #: TreeLearner's score= is kept here because it is part of the keys of finished runs
    wrt: str = "logp"
    #: a fixed tree that is not ``Tree.random(tree_seed)`` (e.g. "retrained:<run>"): part of the
    #: checkpoint key, so such runs never reuse a random-tree run's checkpoint
    fixed_tree: str | None = None
    #: fixed trees: collect the node statistics anyway and record the mean J_n per depth at the
    #: steps where a learned tree would be rebuilt (the random tree's J_n, for comparison)
    track_objective: bool = False
    #: L2 penalty as a gradient term ``l2 * w`` (the arXiv paper's 5e-5 on PTB); for the sparse
    #: (embedding, node) parameters only on the rows a batch touches ("lazy" L2, see _add_l2)
    l2: float = 0.0

    def key(self) -> str:
        fields = asdict(self)
        if self.output not in SAMPLED_KINDS:
            # keeps the keys (and so the checkpoints) of runs made before sampled outputs existed
            fields.pop("num_negatives")
        for name, default in _KEY_OPTIONAL.items():
            # fields added later leave the keys of runs that use their defaults unchanged
            if fields[name] == default:
                fields.pop(name)
        return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


#: LMRunConfig fields left out of the checkpoint key when they hold these (default) values
_KEY_OPTIONAL: dict[str, Any] = {"prior": 1.0, "prior_mode": "current_child", "wrt": "logp", "fixed_tree": None,
                                 "track_objective": False, "l2": 0.0}


@dataclass
class LMRunResult:
    config: dict[str, Any]
    epochs: list[dict[str, float]] = field(default_factory=list)  #: per epoch: train_nll, valid/test ppl
    train_ms_per_batch: float = math.nan
    test_ms_per_batch: float = math.nan
    valid_perplexity: float = math.nan
    test_perplexity: float = math.nan
    reassignments: list[dict[str, Any]] = field(default_factory=list)
    tree: dict[str, Any] | None = None  #: final tree (Tree.to_dict), for trees
    seconds: float = 0.0
    #: where it trained ("cpu", "cuda", "cpu+cuda" when resumed elsewhere; None: stored before this was
    #: recorded): a finished run loaded from the run folder keeps the timings of the device it ran on
    device: str | None = None
