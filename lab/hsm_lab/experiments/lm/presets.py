"""The presets of the language-model experiments, as plain values: what each experiment trains on
and how long at each scale (:class:`LMScale`, :data:`SCALES`), where it writes (:data:`DEFAULT_OUT`),
and the ablation's variants (:data:`ABLATION_VARIANTS`). ``-o key=value`` options override
:class:`LMScale` fields (:func:`hsm_lab.experiments.lm.commands._parse_options`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hsm_lab.data.gutenberg import CHUNK_TOKENS

__all__ = ["ABLATION_VARIANTS", "ABLATION_WHAT", "DEFAULT_OUT", "LMScale", "RESULTS_DIR", "RUN_FOLDER", "SCALES"]

RESULTS_DIR = "results/lm"
#: result file of each experiment
DEFAULT_OUT = {"lm-ptb": f"{RESULTS_DIR}/ptb.json", "lm-ptb-schedules": f"{RESULTS_DIR}/ptb-schedules.json",
               "lm-gutenberg-65": f"{RESULTS_DIR}/gutenberg-65.json",
               "lm-gutenberg-75": f"{RESULTS_DIR}/gutenberg-75.json",
               "lm-ptb-ablation": f"{RESULTS_DIR}/ptb-ablation.json",
               "lm-gutenberg-offset": f"{RESULTS_DIR}/gutenberg-offset.json"}


@dataclass
class LMScale:
    """What one scale of an experiment trains on, and how long."""

    dataset: str
    context: int
    arity: int
    epochs: int
    reassign_per_epoch: int
    lr_grid: tuple[float, ...]
    select_steps: int
    random_seeds: int
    learn_epochs: float
    max_books: int | None = None
    vocab_size: int | None = None
    train_tokens: int | None = None
    eval_tokens: int | None = None
    batch_size: int = 128
    embed_epochs: int = 1
    description: str = ""
    l2: float = 0.0  #: L2 penalty of every run (LMRunConfig.l2); the arXiv paper's PTB setting is 5e-5
    #: learned trees only: NodeStatistics decay per rebuild (ours 0.5; 1 = never, the released code)
    decay: float = 0.5
    #: learning-rate trials: score on the first this many validation tokens (None: all of them;
    #: a Gutenberg validation pass over 4.4M tokens costs more than the trial's training)
    select_eval_tokens: int | None = None
    #: the random-tree row trains seeds first_random_seed, ..., first_random_seed + random_seeds - 1
    #: (so the seeds of a long table can run as separate parts)
    first_random_seed: int = 0
    #: the seed of the random tree the learned tree (and each schedule of it) starts from, so that
    #: the learned row can be repeated from several starting trees as separate parts
    learned_tree_seed: int = 0
    #: the clustering tree's 50-dim word vectors: "fasttext" (the paper's: fastText skip-gram,
    #: hs loss, 5 epochs, whole words), "fasttext-ngrams" (the same with fastText's character
    #: n-grams of 3 to 6 characters) or "lbl" (ours: a log-bilinear LM with a random-tree HSM,
    #: embed_epochs)
    clustering_embeddings: str = "fasttext"
    #: the clustering tree's top level (hsm.clustering.clustering_tree's groups): "kmeans" (ours) or
    #: "random" (clusters grouped at random under the root)
    clustering_groups: str = "kmeans"
    #: Gutenberg only: the held-out text (hsm_lab.data.gutenberg.split_pieces): "books" (whole books, the
    #: corpus' split) or "chunks" (pieces of chunk_tokens tokens inside books); split_seed None is the
    #: corpus' own draw
    split: str = "books"
    split_seed: int | None = None
    chunk_tokens: int = CHUNK_TOKENS
    #: Gutenberg only: vocabulary of the training types seen at least this often (and at most vocab_size)
    min_count: int = 1


#: lm-ptb, quick: CI slices (about a minute)
_PTB_QUICK = LMScale("ptb", context=3, arity=13, epochs=2, reassign_per_epoch=20, lr_grid=(0.05,),
                     select_steps=0, random_seeds=1, learn_epochs=1, vocab_size=2000, train_tokens=150_000,
                     eval_tokens=20_000,
                     clustering_embeddings="lbl",  # fastText is an optional extra (hsm[baselines])
                     description="quick: first 150k PTB training tokens, first 20k valid/test tokens, "
                                 "vocabulary capped at 2,000 (13-ary depth-3 trees), 2 epochs "
                                 "(learned tree: 1 epoch learned + 1 fine-tuned), one random tree")
#: lm-ptb, full: the paper's setting
_PTB_FULL = LMScale("ptb", context=3, arity=25, epochs=4, reassign_per_epoch=20,
                    lr_grid=(0.025, 0.05, 0.1, 0.25), select_steps=1500, random_seeds=5, learn_epochs=3,
                    description="full: PTB (Mikolov split), 10k vocabulary, 25-ary depth-3 trees, 4 epochs, "
                                "learned tree 3 epochs + 1 fine-tuning (the better of arXiv Fig. 3)")
#: lm-gutenberg-65, quick
_GUTENBERG_QUICK = LMScale("gutenberg", context=4, arity=13, epochs=2, reassign_per_epoch=50, lr_grid=(0.05,),
                           select_steps=0, random_seeds=1, learn_epochs=1, max_books=10, vocab_size=2000,
                           train_tokens=300_000, eval_tokens=20_000,
                           clustering_embeddings="lbl",  # fastText is an optional extra (hsm[baselines])
                           description="quick: 10 books (8 train), first 300k training tokens, vocabulary 2,000 "
                                       "(13-ary depth-3 trees), 2 epochs (learned: 1 + 1 fine-tuned), one random tree")

#: lm-gutenberg-65, full: the paper's data and trees
_GUTENBERG_FULL = LMScale("gutenberg", context=4, arity=65, epochs=4, reassign_per_epoch=50,
                          lr_grid=(0.01, 0.02, 0.05, 0.1, 0.25, 0.5), select_steps=10_000, random_seeds=5,
                          learn_epochs=2, select_eval_tokens=500_000,
                          description="full: all 678 books (542 train, ~50M tokens), 250k vocabulary, 65-ary "
                                      "depth-3 trees (needs a GPU for the flat softmax)")

#: quick: CI slices (about a minute); full: the paper's setting (PTB) or what the hardware allows.
SCALES: dict[str, dict[str, LMScale]] = {
    "lm-ptb": {"quick": _PTB_QUICK, "full": _PTB_FULL},
    "lm-gutenberg-65": {
        "quick": _GUTENBERG_QUICK,
        "full": _GUTENBERG_FULL,
    },
    # one random tree for one epoch at lm-gutenberg-65's chosen rate, on a varied split or vocabulary
    "lm-gutenberg-offset": {
        "quick": replace(_GUTENBERG_QUICK, epochs=1, learn_epochs=0,
                         description="quick: 10 books, first 300k training tokens, vocabulary 2,000 (13-ary "
                                     "depth-3 tree), 1 epoch, one random tree"),
        "full": replace(_GUTENBERG_FULL, epochs=1, learn_epochs=0, random_seeds=1, lr_grid=(0.05,), select_steps=0,
                        description="full: all 678 books, 250k vocabulary (at most), 65-ary depth-3 random tree "
                                    "(seed 0), 1 epoch at lm-gutenberg-65's chosen rate 0.05"),
    },
    "lm-gutenberg-75": {
        # the same slice as lm-gutenberg-65's quick preset, with the arXiv rebuild rate
        "quick": replace(_GUTENBERG_QUICK, reassign_per_epoch=20),
        "full": LMScale("gutenberg", context=4, arity=75, epochs=4, reassign_per_epoch=20,
                        lr_grid=(0.025, 0.05, 0.1), select_steps=10_000, random_seeds=5, learn_epochs=2,
                        select_eval_tokens=500_000,
                        description="full: all 678 books (542 train, ~50M tokens), 250k vocabulary, 75-ary "
                                    "depth-3 trees (needs a GPU for the flat softmax)"),
    },
    # the schedules share lm-ptb's runs (same configurations, same run folder): at full scale only the
    # "learn 1 epoch + fine-tune 3" run is new
    "lm-ptb-schedules": {
        "quick": replace(_PTB_QUICK, epochs=3, learn_epochs=2,
                         description=_PTB_QUICK.description.replace(
                             "2 epochs (learned tree: 1 epoch learned + 1 fine-tuned)", "3 epochs") +
                         "; learned trees: 1 epoch learned + 2 fine-tuned, and 2 + 1"),
        "full": _PTB_FULL,
    },
    "lm-ptb-ablation": {
        "quick": LMScale("ptb", context=3, arity=13, epochs=2, reassign_per_epoch=20, lr_grid=(0.05,), select_steps=0,
                         random_seeds=2, learn_epochs=1, vocab_size=2000, train_tokens=60_000, eval_tokens=10_000,
                         clustering_embeddings="lbl",  # fastText is an optional extra (hsm[baselines])
                         description="quick: first 60k PTB training tokens, first 10k valid/test tokens, vocabulary "
                                     "2,000 (13-ary trees), 2 epochs (learned: 1 learning + 1 fine-tuning), lr 0.05"),
        # full PTB data, but 2 epochs: on a slice (250k tokens) the trees over-fit after one epoch (no
        # L2: see the hsm_lab.experiments.lm docstring) and the learned tree then "wins" by training less
        "full": LMScale("ptb", context=3, arity=25, epochs=2, reassign_per_epoch=20, lr_grid=(0.05,), select_steps=0,
                        random_seeds=3, learn_epochs=1,
                        description="ablation: full PTB (929k training tokens, 10k vocabulary, 25-ary depth-3 trees), "
                                    "2 epochs (learned: 1 learning + 1 fine-tuning, lm-ptb's 2-epoch schedule), "
                                    "lr 0.05 (lm-ptb's selected tree rate), 3 random trees"),
    },
}
#: experiments whose runs are shared (same run folder under the cache)
RUN_FOLDER = {"lm-ptb-schedules": "lm-ptb"}


#: One change at a time from the learned tree's setting of ``lm-ptb`` (LMRunConfig fields), to see
#: which of the choices the papers leave open (hsm.statistics: decay, prior; the rebuild rate;
#: the ranking; the learning rate; the schedule) limits the learned tree's gain over the random
#: tree it starts from. ``learn_all`` learns the tree in every epoch (no fine-tuning).
ABLATION_VARIANTS: dict[str, dict[str, Any]] = {  # in the order they run (most telling first)
    "base": {},
    "reassign_5": {"reassign_per_epoch": 5},
    "l2_5e-5": {"l2": 5e-5},
    "reassign_50": {"reassign_per_epoch": 50},
    "decay_0": {"decay": 0.0},
    "decay_1": {"decay": 1.0},
    "prior_uniform": {"prior_mode": "uniform"},
    "learn_all": {"learn_epochs": "all"},
    "lr_0.025": {"lr": 0.025},
    "lr_0.1": {"lr": 0.1},
    "wrt_p": {"wrt": "p"},
    "decay_0.9": {"decay": 0.9},
    "reassign_1": {"reassign_per_epoch": 1},
    # two changes at once (labelled as such): the two single changes that helped most
    "reassign_5+decay_1": {"reassign_per_epoch": 5, "decay": 1.0},
}
#: what each ablation variant changes, in words (the notebook's table)
ABLATION_WHAT: dict[str, str] = {
    "base": "lm-ptb's setting: 20 rebuilds/epoch, decay 0.5, current-child prior, eq. 12, learned then fine-tuned",
    "reassign_1": "1 rebuild per epoch (at its end)", "reassign_5": "5 rebuilds per epoch",
    "reassign_50": "50 rebuilds per epoch (ICML's rate)",
    "reassign_5+decay_1": "two changes at once: 5 rebuilds per epoch and statistics that never decay",
    "decay_0": "statistics reset at every rebuild (decay 0)", "decay_0.9": "statistics decay 0.9",
    "decay_1": "statistics never decay (the released code)", "prior_uniform": "uniform prior (the thesis' 1/M)",
    "wrt_p": "ranking by eq. 10 (p) instead of eq. 12 (log p)", "lr_0.025": "learning rate 0.025 (the arXiv paper's)",
    "lr_0.1": "learning rate 0.1", "l2_5e-5": "L2 5e-5 (the arXiv paper's PTB setting; lazy on sparse rows)",
    "learn_all": "tree learned in every epoch (no fine-tuning)",
    "retrained": "base's final tree, fixed, trained from scratch (tree quality without the cost of moving words)",
}


def _ablation_changes(name: str, epochs: int) -> dict[str, Any]:
    changes = dict(ABLATION_VARIANTS[name])
    if changes.get("learn_epochs") == "all":
        changes["learn_epochs"] = epochs
    return changes
