"""Language modelling (arXiv §7 Table 1 and Fig. 3; ICML §7.2 Table 2 and Fig. 2).

The log-bilinear LM (:class:`hsm.models.LogBilinearLM`, ``r_x = sum_k R_k U_{w_{t-k}}``) with four
output layers behind one interface:

* ``flat``: the flat softmax over the vocabulary;
* ``random``: a hierarchical softmax on a random depth-``D`` M-ary tree (best of several seeds,
  picked on validation; the arXiv paper takes the best of 5);
* ``clustering``: ICML §7.2's clustering tree: 50-dimensional word embeddings, MiniBatchKMeans into
  ``M**2`` centroids, words filled greedily into the nearest non-full centroid (M words each).
  The paper does not say how the ``M**2`` clusters are grouped under the root; we run a second
  k-means over the centroids into M groups of M clusters (same greedy fill). The paper learns the
  embeddings with fastText (5 epochs, hierarchical-softmax loss); fastText is not installed here,
  so we learn them with our own log-bilinear model (d = 50, random-tree HSM) on the same training
  data, and use its input embeddings ``U``;
* ``learned``: Algorithm 1 (:class:`hsm.TreeLearner`) with Algorithm 3 (depth constraint) and the
  log-likelihood ranking of eq. 12, starting from a random tree, re-assigning 20 times per epoch
  (arXiv) or 50 times (ICML) while the tree is learned, then fine-tuning with the tree fixed.

Choices where the papers are silent (written into every result file's config):

* initial tree of the learned model: a random tree (seed 0 of the random-tree seeds);
* batch size: 128 (the largest of ICML's grid {32, 64, 128}; the fastest on our CPU); the learning
  rate is selected from a grid on validation perplexity after a short run (``select_steps``
  steps), separately for the flat softmax and for the trees (the random tree's choice is used for
  all trees, so the trees differ only in structure);
* the arXiv paper's L2 of 5e-5 on PTB is **not** applied by default: torch's Adagrad refuses
  weight decay with sparse gradients, and sparse gradients are what makes the tree cheap.
  ``-o l2=5e-5`` (``LMRunConfig.l2``) adds it ourselves, lazily: only on the embedding and node
  rows a batch touches (:func:`_add_l2`);
* examples are shuffled every epoch; perplexity is ``exp`` of the mean NLL per token over the
  whole split, every token a target (``<eos>``-padded windows);
* ms/batch: wall time per optimiser step (forward, backward, Adagrad, and for the learned tree the
  statistics and the amortised re-assignments), and per test batch (forward: ``log p(target)``),
  measured in the same run on the same machine, after ``warmup`` steps.

``lm-ptb-ablation`` varies one setting of the learned tree at a time (rebuild rate, statistics
decay and prior, ranking, learning rate, L2, schedule) on the full PTB, and retrains the final
learned tree from scratch, to see why the learned tree gains less over the random tree than in
the paper.

Long runs are resumable: each (experiment, run) checkpoints after every epoch under
``hsm.config.cache_dir()/lm-runs/`` and stores its finished record, so re-running the experiment
command continues where it stopped. Those files are written atomically under unique temporary
names (two runs of the same command do not collide; a full disk leaves the previous file); a
finished-run or checkpoint file that cannot be read is ignored with a warning naming it, and
the run is recomputed (from the checkpoint when only the finished-run file is bad).

Result files go to ``out``, or without it under :func:`hsm.results.output_root`
(``hsm-results/lm/...``), never over the committed ``results/`` unless ``out`` names them; a
full-scale file is not replaced by a quick run unless ``force=True``.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm import config as hsm_config
from hsm.data.lm import UNK, LMCorpus
from hsm.experiments import (check_device, check_scale, experiment, option_choice, option_choices, option_float,
                             option_floats, option_int)
from hsm.layers import FlatSoftmax, HierarchicalSoftmax, NonFiniteInputError, RowSparseAdagrad
from hsm.models import LogBilinearLM
from hsm.sampling import SampledSoftmax
from hsm.results import atomic_write, check_replace, make_record, output_path, provenance, read_json_or_none, write_results
from hsm.training import TreeLearner
from hsm.tree import Tree

__all__ = [
    "LMRunConfig",
    "cap_vocabulary",
    "clustering_tree",
    "greedy_fill",
    "load_lm_corpus",
    "train_lm",
    "run_lm_ptb",
    "run_lm_ptb_schedules",
    "run_lm_gutenberg_65",
    "run_lm_gutenberg_75",
    "run_lm_ptb_ablation",
    "run_ablation",
    "ABLATION_VARIANTS",
    "OUTPUT_KINDS",
    "SAMPLED_KINDS",
]

OUTPUT_KINDS = ("flat", "random", "clustering", "learned", "adaptive")
#: flat softmax trained with a sampling approximation of the normaliser (seed 004,
#: :class:`hsm.sampling.SampledSoftmax`); exact at evaluation, so perplexities compare directly
SAMPLED_KINDS = ("importance", "bernoulli", "ranking", "blackout", "nce", "negative_sampling")
RESULTS_DIR = "results/lm"
#: result file of each experiment
DEFAULT_OUT = {"lm-ptb": f"{RESULTS_DIR}/ptb.json", "lm-ptb-schedules": f"{RESULTS_DIR}/ptb-schedules.json",
               "lm-gutenberg-65": f"{RESULTS_DIR}/gutenberg-65.json",
               "lm-gutenberg-75": f"{RESULTS_DIR}/gutenberg-75.json"}


# ============================================================================ data
def cap_vocabulary(corpus: LMCorpus, vocab_size: int) -> LMCorpus:
    """Keep the ``vocab_size`` most frequent ids (``<unk>`` among them); map the rest to ``<unk>``.

    Ids of :class:`LMCorpus` are sorted by decreasing training count, so the kept words are the
    first ids; ``<unk>`` is kept (and, if it was not among them, it replaces the least frequent
    kept word). Counts of dropped words are added to ``<unk>``'s.
    """
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
    if vocab_size >= corpus.vocab_size:
        return corpus
    unk = corpus.index(UNK)
    if unk < 0:
        raise ValueError(f"{corpus.name} has no {UNK} token to map dropped words to")
    keep = list(range(vocab_size))
    if unk not in keep:
        keep[-1] = unk
    keep_arr = np.array(sorted(keep))
    new_unk = int(np.searchsorted(keep_arr, unk))
    mapping = np.full(corpus.vocab_size, new_unk, dtype=np.int64)
    mapping[keep_arr] = np.arange(len(keep_arr))
    mapping_t = torch.from_numpy(mapping)
    counts = np.bincount(mapping, weights=corpus.counts, minlength=len(keep_arr)).astype(np.int64)
    stats = dict(corpus.stats, vocab_cap=vocab_size, original_vocab=corpus.vocab_size)
    return LMCorpus(
        name=f"{corpus.name}-V{vocab_size}", vocab=[corpus.vocab[i] for i in keep_arr],
        train=mapping_t[corpus.train], valid=mapping_t[corpus.valid], test=mapping_t[corpus.test],
        counts=counts, context=corpus.context, stats=stats,
    )


def _slice(corpus: LMCorpus, train_tokens: int | None, eval_tokens: int | None) -> LMCorpus:
    """The first tokens of each split (None: all)."""
    cut = lambda t, n: t if n is None else t[:n]  # noqa: E731
    train = cut(corpus.train, train_tokens)
    counts = (corpus.counts if train_tokens is None else
              np.bincount(train.numpy(), minlength=corpus.vocab_size).astype(np.int64))
    return LMCorpus(name=corpus.name, vocab=corpus.vocab, train=train, valid=cut(corpus.valid, eval_tokens),
                    test=cut(corpus.test, eval_tokens), counts=counts, context=corpus.context,
                    stats=dict(corpus.stats, train_tokens_used=int(train.numel())))


def load_lm_corpus(dataset: str, *, max_books: int | None = None, vocab_size: int | None = None,
                   train_tokens: int | None = None, eval_tokens: int | None = None) -> LMCorpus:
    """PTB or our Gutenberg corpus, optionally reduced (fewer books/tokens, capped vocabulary).

    The vocabulary cap is applied before slicing, from the counts of the whole training split
    (PTB) or of the selected books (Gutenberg: the cap is the loader's own ``vocab_size``).
    """
    if dataset == "ptb":
        from hsm.data import load_ptb

        corpus = load_ptb()
        if vocab_size is not None:
            corpus = cap_vocabulary(corpus, vocab_size)
    elif dataset == "gutenberg":
        from hsm.data import load_gutenberg

        corpus = load_gutenberg(max_books=max_books, vocab_size=vocab_size or 250_000, progress=False)
    else:
        raise ValueError(f"dataset must be 'ptb' or 'gutenberg', got {dataset!r}")
    if train_tokens is not None or eval_tokens is not None:
        corpus = _slice(corpus, train_tokens, eval_tokens)
    return corpus


# ============================================================================ trees
def greedy_fill(distances: np.ndarray, capacity: int, order: np.ndarray | None = None) -> np.ndarray:
    """Give every row (word) the nearest column (centroid) that still has room (ICML §7.2:
    "greedily assign words to clusters until full").

    Rows are served in ``order`` (default: by increasing distance to their nearest centroid, so
    the words that are surest of their cluster go first). Needs ``capacity * n_cols >= n_rows``.
    """
    n_rows, n_cols = distances.shape
    if capacity * n_cols < n_rows:
        raise ValueError(f"{n_cols} clusters of {capacity} cannot hold {n_rows} items")
    if order is None:
        order = np.argsort(distances.min(axis=1), kind="stable")
    load = np.zeros(n_cols, dtype=np.int64)
    assignment = np.empty(n_rows, dtype=np.int64)
    full_penalty = np.zeros(n_cols)
    for row in order:
        col = int(np.argmin(distances[row] + full_penalty))
        assignment[row] = col
        load[col] += 1
        if load[col] == capacity:
            full_penalty[col] = np.inf
    return assignment


def _kmeans_fill(points: np.ndarray, n_clusters: int, capacity: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.cluster import MiniBatchKMeans

    n_clusters = min(n_clusters, len(points))
    km = MiniBatchKMeans(n_clusters=n_clusters, random_state=seed, batch_size=4096, n_init=3)
    km.fit(points)
    centres = km.cluster_centers_
    # squared distances, chunked (250k words x 4225 centroids would be 8 GB at once)
    dist = np.empty((len(points), n_clusters), dtype=np.float32)
    c_norm = (centres**2).sum(1)
    for start in range(0, len(points), 8192):
        chunk = points[start:start + 8192]
        dist[start:start + 8192] = (chunk**2).sum(1)[:, None] - 2 * chunk @ centres.T + c_norm[None, :]
    return greedy_fill(dist, capacity), centres


def clustering_tree(embeddings: np.ndarray, arity: int, depth: int = 3, seed: int = 0,
                    label_names: Sequence[str] | None = None) -> Tree:
    """The clustering tree of ICML §7.2 (depth 3): words -> ``M**2`` clusters of at most M words
    (MiniBatchKMeans + greedy fill); clusters -> M groups of M clusters under the root (a second
    k-means over the centroids with the same greedy fill: our choice, the paper is silent)."""
    if depth != 3:
        raise ValueError("the clustering tree is built for depth 3 (root -> groups -> clusters -> words)")
    points = np.asarray(embeddings, dtype=np.float64)
    if points.ndim != 2 or len(points) < 2:
        raise ValueError(f"embeddings must be a [K, d] array with K >= 2, got shape {points.shape}")
    cluster_of_word, centres = _kmeans_fill(points, arity**2, arity, seed)
    # renumber clusters 0..C-1 (some may be empty after the fill)
    used, cluster_of_word = np.unique(cluster_of_word, return_inverse=True)
    centres = centres[used]
    group_of_cluster, _ = _kmeans_fill(centres, arity, arity, seed + 1)
    # cluster c, the r-th of group g, fills bottom node g*M + r: group g is the g-th child of the
    # root even when groups have fewer than M clusters (fewer than M**2 clusters in use)
    order = np.argsort(group_of_cluster, kind="stable")
    sizes = np.bincount(group_of_cluster, minlength=arity)
    rank_in_group = np.empty(len(centres), dtype=np.int64)
    rank_in_group[order] = np.arange(len(centres)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    bottom_node = group_of_cluster * arity + rank_in_group
    return Tree.from_clusters(bottom_node[cluster_of_word], arity, depth, label_names=label_names)


# ============================================================================ training
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
    num_negatives: int = 20  #: sampled outputs: negatives per batch (seed 004's K)
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def _add_l2(parameters: Sequence[torch.nn.Parameter], l2: float) -> None:
    """Add ``l2 * w`` to every gradient (L2 regularisation, arXiv §7: 5e-5 on PTB).

    torch's Adagrad refuses ``weight_decay`` with sparse gradients, so we add the term ourselves;
    for a sparse gradient only on the rows it touches ("lazy" L2: a word's embedding, or a node's
    vectors, shrink when they are used, not at every step), which keeps the step sparse. The
    paper does not say which form its Torch code used."""
    for param in parameters:
        grad = param.grad
        if grad is None:
            continue
        if grad.is_sparse:
            grad = grad.coalesce()
            rows = grad.indices()[0]
            param.grad = torch.sparse_coo_tensor(grad.indices(), grad.values() + l2 * param[rows], grad.shape,
                                                 check_invariants=False, is_coalesced=True)
        else:
            grad.add_(param, alpha=l2)


class RankedAdaptiveSoftmax(torch.nn.Module):
    """:class:`torch.nn.AdaptiveLogSoftmaxWithLoss` over words renumbered by frequency rank (its
    cutoffs split the ids into a head of frequent words and tails of rarer ones, so the ids must
    be ranks), with the benchmark's cutoffs (:data:`hsm.bench.ADAPTIVE_CUTOFFS`, 2k/20k/100k
    below V, ``div_value=4``: Grave et al.'s setting for large vocabularies).

    forward(h [B, d], y [B]) -> (output [B] log-probabilities of the targets, loss []): the same
    interface as the tree and flat layers."""

    def __init__(self, dim: int, counts: np.ndarray) -> None:
        super().__init__()
        from hsm.bench import ADAPTIVE_CUTOFFS, adaptive_cutoffs

        counts = np.asarray(counts)
        order = np.argsort(-counts, kind="stable")  # word ids by decreasing count
        rank = np.empty(len(counts), dtype=np.int64)
        rank[order] = np.arange(len(counts))
        self.register_buffer("rank", torch.from_numpy(rank))
        self.adaptive = torch.nn.AdaptiveLogSoftmaxWithLoss(
            dim, len(counts), adaptive_cutoffs(len(counts), dim, base=ADAPTIVE_CUTOFFS), div_value=4.0)

    def forward(self, hidden: torch.Tensor, target: torch.Tensor):
        return self.adaptive(hidden, self.rank[target])


def _make_output(cfg: LMRunConfig, vocab_size: int, tree: Tree | None,
                 counts: np.ndarray | None = None) -> torch.nn.Module:
    if cfg.output == "flat":
        return FlatSoftmax(cfg.dim, vocab_size)
    if cfg.output == "adaptive":
        if counts is None:
            raise ValueError("output 'adaptive' needs the training counts (its cutoffs follow frequency ranks)")
        return RankedAdaptiveSoftmax(cfg.dim, counts)
    if cfg.output in SAMPLED_KINDS:
        if counts is None:
            raise ValueError(f"output {cfg.output!r} needs the training counts (its proposal distribution)")
        # add-one smoothing keeps every word reachable by the sampler (hsm.sampling.class_frequencies)
        freq = torch.as_tensor(np.asarray(counts, dtype=np.float64) + 1.0)
        return SampledSoftmax(cfg.dim, vocab_size, freq, method=cfg.output,
                              num_negatives=cfg.num_negatives, seed=cfg.seed, sparse=True)
    if tree is None:
        raise ValueError(f"output {cfg.output!r} needs a tree")
    return HierarchicalSoftmax(cfg.dim, tree, sparse=True)


@torch.no_grad()
def _evaluate(model: torch.nn.Module, output: torch.nn.Module, contexts: torch.Tensor, targets: torch.Tensor,
              batch_size: int, device: torch.device, timed: bool = False) -> tuple[float, float]:
    """(perplexity, ms per batch) of a split: exp of the mean NLL per token."""
    model.eval()
    output.eval()
    nll, times = 0.0, []
    for start in range(0, len(targets), batch_size):
        x = contexts[start:start + batch_size]
        y = targets[start:start + batch_size]
        if timed:
            _sync(device)
            t0 = time.perf_counter()
        logp = output(model(x), y).output
        if timed:
            _sync(device)
            times.append(time.perf_counter() - t0)
        nll -= float(logp.sum())
    ms = 1000 * float(np.mean(times[min(5, len(times) - 1):])) if times else math.nan
    return math.exp(nll / len(targets)), ms


def _run_dir(experiment_name: str) -> Path:
    path = hsm_config.cache_dir() / "lm-runs" / experiment_name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` through :func:`hsm.results.atomic_write` (unique temporary, fsync, rename)."""
    atomic_write(path, lambda handle: torch.save(obj, handle))


def _load_finished(done_path: Path) -> LMRunResult | None:
    """The finished run stored in ``done_path``, or None (missing; unreadable or not a run record:
    warned about by name, and recomputed)."""
    data = read_json_or_none(done_path, "finished-run file")
    if data is None:
        return None
    try:
        return LMRunResult(**data)
    except TypeError as exc:
        warnings.warn(f"ignoring finished-run file {done_path}: not a run record ({exc}); it will be recomputed",
                      stacklevel=2)
        return None


def _load_checkpoint(ckpt_path: Path) -> dict[str, Any] | None:
    """The checkpoint in ``ckpt_path``, or None when missing or unreadable (truncated by a full
    disk, say: warned about by name; the run then starts over)."""
    if not ckpt_path.exists():
        return None
    try:
        state = torch.load(ckpt_path, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - torch/pickle raise many types for a bad file
        warnings.warn(f"ignoring unreadable checkpoint {ckpt_path} ({type(exc).__name__}: {exc}); "
                      "the run starts over", stacklevel=2)
        return None
    if not isinstance(state, dict) or "model" not in state:
        warnings.warn(f"ignoring checkpoint {ckpt_path}: not a training checkpoint; the run starts over", stacklevel=2)
        return None
    return state


def train_lm(
    corpus: LMCorpus,
    cfg: LMRunConfig,
    tree: Tree | None = None,
    device: str | torch.device = "cpu",
    checkpoint_dir: Path | None = None,
    warmup: int = 20,
    log: Callable[[str], None] | None = None,
    checkpoint_seconds: float | None = None,
) -> LMRunResult:
    """Train the log-bilinear LM with Adagrad and the output layer ``cfg.output``.

    ``tree`` is the fixed tree (random, clustering) or the initial tree (learned). The learned
    tree re-assigns ``cfg.reassign_per_epoch`` times per epoch for ``cfg.learn_epochs`` epochs
    (:class:`hsm.TreeLearner`, Algorithm 3, eq. 12), then stays fixed. Valid and test
    perplexity are recorded after every epoch (the papers' Figs. 2 and 3 show test perplexity
    per epoch). With ``checkpoint_dir`` the run resumes from its last checkpoint and, once done,
    returns its stored result without training again. A checkpoint is written after every epoch
    and, within an epoch, every ``checkpoint_seconds`` of training (default: the environment
    variable ``HSM_CHECKPOINT_SECONDS``, else 300), so that a Gutenberg epoch (318k steps) can be
    trained across runs that are each cut off after a few minutes (the GPU tool's 10-minute
    calls): a resumed run redraws the same example order and continues at the next step.
    """
    if cfg.output not in OUTPUT_KINDS + SAMPLED_KINDS:
        raise ValueError(f"output must be one of {OUTPUT_KINDS + SAMPLED_KINDS}, got {cfg.output!r}")
    if cfg.output in ("random", "clustering", "learned") and tree is None:
        raise ValueError(f"output {cfg.output!r} needs a tree")
    if tree is not None and tree.num_labels != corpus.vocab_size:
        raise ValueError(f"the tree has {tree.num_labels} labels, the vocabulary {corpus.vocab_size} words")
    if cfg.epochs < 1 or cfg.batch_size < 1 or not cfg.lr > 0:
        raise ValueError(f"epochs, batch_size and lr must be positive: {cfg}")
    if cfg.l2 < 0:
        raise ValueError(f"l2 must be >= 0, got {cfg.l2}")
    if cfg.wrt not in ("logp", "p"):
        raise ValueError(f"wrt must be 'logp' (eq. 12) or 'p' (eq. 10), got {cfg.wrt!r}")
    device = torch.device(check_device(device))
    log = log or (lambda message: None)
    if checkpoint_seconds is None:
        raw = os.environ.get("HSM_CHECKPOINT_SECONDS", "300")
        try:
            checkpoint_seconds = float(raw)
        except ValueError:
            raise ValueError(f"HSM_CHECKPOINT_SECONDS must be a number of seconds, got {raw!r}") from None
    if not checkpoint_seconds > 0:
        raise ValueError(f"checkpoint_seconds must be > 0, got {checkpoint_seconds}")
    done_path = ckpt_path = None
    if checkpoint_dir is not None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        stem = f"{cfg.output}-{cfg.key()}-{corpus.name}-{corpus.train.numel()}"
        done_path = checkpoint_dir / f"{stem}.json"
        ckpt_path = checkpoint_dir / f"{stem}.pt"
        finished = _load_finished(done_path)
        if finished is not None:
            log(f"{cfg.output}: finished earlier, loading {done_path.name}")
            if finished.device is not None and finished.device != str(device):
                warnings.warn(f"finished run {done_path} trained on {finished.device}, not {device}: its ms/batch "
                              f"are {finished.device}'s (recorded per run as trained_on)", stacklevel=2)
            return finished

    hsm_config.seed_everything(cfg.seed)
    model = LogBilinearLM(corpus.vocab_size, cfg.dim, cfg.context, sparse=True).to(device)
    output = _make_output(cfg, corpus.vocab_size, tree, corpus.counts).to(device)
    # compiled model kernels beside the tree's; torch's products beside outputs that run on
    # torch's OpenMP threads (mixing the two pools loses time to OpenMP's spinning)
    model.use_kernels = isinstance(output, HierarchicalSoftmax)
    parameters = list(model.parameters()) + list(output.parameters())
    optimizer = RowSparseAdagrad(parameters, lr=cfg.lr)  # torch.optim.Adagrad's update, one pass over touched rows
    if isinstance(output, HierarchicalSoftmax) and cfg.l2 == 0:
        # the tree's update inside its compiled backward, bit for bit the same (with an L2 term the
        # gradients are changed between backward and step, so the update stays in step())
        optimizer.fuse(output)
    x_train, y_train = (t.to(device) for t in corpus.windows("train", cfg.context))
    x_valid, y_valid = (t.contiguous().to(device) for t in corpus.windows("valid", cfg.context))
    x_test, y_test = (t.contiguous().to(device) for t in corpus.windows("test", cfg.context))
    n_train = len(y_train)
    steps_per_epoch = math.ceil(n_train / cfg.batch_size)
    if cfg.max_steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, cfg.max_steps_per_epoch)
    learner = None
    reassign_every = max(1, steps_per_epoch // cfg.reassign_per_epoch)
    tracking = cfg.track_objective and cfg.output in ("random", "clustering")
    if cfg.output == "learned" or tracking:
        # tracking a fixed tree: the same statistics, read at the same steps, never rebuilt
        learner = TreeLearner(output, reassign_every=reassign_every, score=RANKING_SCORE[cfg.wrt], algorithm="depth",
                              decay=cfg.decay, prior=cfg.prior, prior_mode=cfg.prior_mode)
    tracked: list[dict[str, Any]] = []
    result = LMRunResult(config=asdict(cfg))
    step_times: list[float] = []
    start_epoch = 0
    resume_step, resume_total, resume_order_state = 0, 0.0, None
    generator = torch.Generator().manual_seed(cfg.seed)
    state = _load_checkpoint(ckpt_path) if ckpt_path is not None else None
    if state is not None:
        model.load_state_dict(state["model"])
        if learner is not None:
            output.set_tree(Tree.from_dict(state["tree"]))
            learner.statistics.load_state_dict(state["statistics"])
            learner.steps = state["learner_steps"]
            if state["frozen"]:
                learner.freeze()
        output.load_state_dict(state["output"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        result = LMRunResult(**state["result"])
        step_times = state["step_times"]
        start_epoch = len(result.epochs)
        # (checkpoints written before within-epoch saving existed kept the tracked records in the result)
        tracked = list(state["tracked"]) if "tracked" in state else (list(result.reassignments) if tracking else [])
        if state.get("step_in_epoch"):  # a checkpoint taken within an epoch
            resume_step, resume_total = state["step_in_epoch"], state["epoch_loss_total"]
            resume_order_state = state["order_generator"]
            log(f"{cfg.output}: resuming in epoch {start_epoch + 1} at step {resume_step}")
        else:
            log(f"{cfg.output}: resuming after epoch {start_epoch}")
    # the learner's history restarts on resume: keep what the checkpoint recorded
    earlier_reassignments = list(result.reassignments) if not tracking else []
    t_start = time.perf_counter() - result.seconds
    # where this part trains (a resumed run may have started on another device): kept in the checkpoints
    # (a checkpoint written before devices were recorded: "unknown+cuda")
    if result.device is None:
        result.device = f"unknown+{device}" if (result.epochs or resume_step) else str(device)
    elif result.device.split("+")[-1] != str(device):
        result.device = f"{result.device}+{device}"

    def reassignment_history() -> list[dict[str, Any]]:
        if tracking:
            return list(tracked)
        if learner is None:
            return []
        return earlier_reassignments + [
            {"step": h.step, "epoch": h.step / steps_per_epoch, "moved_labels": h.moved_labels,
             "seconds": h.seconds, "objective_by_depth": {str(k): v for k, v in h.objective_by_depth.items()}}
            for h in learner.history
        ]

    def save_checkpoint(step_in_epoch: int = 0, epoch_loss_total: float = 0.0, order_state=None) -> None:
        _atomic_save({
            "model": model.state_dict(), "output": output.state_dict(), "optimizer": optimizer.state_dict(),
            "tree": output.tree.to_dict() if isinstance(output, HierarchicalSoftmax) else None,
            "statistics": learner.statistics.state_dict() if learner is not None else None,
            "learner_steps": learner.steps if learner is not None else 0,
            "frozen": learner.frozen if learner is not None else False,
            "generator": generator.get_state(), "result": asdict(result), "step_times": step_times,
            "tracked": tracked, "step_in_epoch": step_in_epoch, "epoch_loss_total": epoch_loss_total,
            "order_generator": order_state,
        }, ckpt_path)

    for epoch in range(start_epoch, cfg.epochs):
        if learner is not None and not tracking and epoch >= cfg.learn_epochs and not learner.frozen:
            learner.freeze()
        model.train()
        output.train()
        first_step, total = 0, 0.0
        if resume_order_state is not None:  # redraw the interrupted epoch's order, go on after its last step
            generator.set_state(resume_order_state)
            first_step, total, resume_order_state = resume_step, resume_total, None
        order_state = generator.get_state()
        order = torch.randperm(n_train, generator=generator).to(device)
        last_save = time.perf_counter()
        for step in range(first_step, steps_per_epoch):
            index = order[step * cfg.batch_size:(step + 1) * cfg.batch_size]
            x, y = x_train[index], y_train[index]
            _sync(device)
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            try:
                loss = output(model(x), y).loss
            except NonFiniteInputError as exc:  # the representation diverged: the same report as a NaN loss
                raise FloatingPointError(f"{cfg.output}: non-finite representation at epoch {epoch} step {step} "
                                         f"(lr {cfg.lr} too large?): {exc}") from exc
            loss.backward()
            if cfg.l2 > 0:
                _add_l2(parameters, cfg.l2)
            optimizer.step()
            if learner is not None and not tracking:
                learner.step()
                if not learner.frozen and epoch * steps_per_epoch + step + 1 >= cfg.learn_epochs * steps_per_epoch:
                    learner.freeze()  # a fractional learn_epochs ends the tree learning mid-epoch
            elif tracking and (epoch * steps_per_epoch + step + 1) % reassign_every == 0:
                global_step = epoch * steps_per_epoch + step + 1
                tracked.append({"step": global_step, "epoch": global_step / steps_per_epoch, "moved_labels": 0.0,
                                "seconds": 0.0, "objective_by_depth": {
                                    str(k): v for k, v in learner.objective_by_depth().items()}})
                learner.statistics.on_reassign(output.tree)  # the same decay as a learned tree's statistics
            _sync(device)
            step_times.append(time.perf_counter() - t0)
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"{cfg.output}: loss {value} at epoch {epoch} step {step} (lr {cfg.lr} "
                                         "too large?)")
            total += value
            if (ckpt_path is not None and step + 1 < steps_per_epoch
                    and time.perf_counter() - last_save >= checkpoint_seconds):
                result.reassignments = reassignment_history()
                result.seconds = time.perf_counter() - t_start
                save_checkpoint(step + 1, total, order_state)
                last_save = time.perf_counter()
                done = step + 1 - first_step
                ms = 1000 * float(np.mean(step_times[-done:]))
                log(f"{cfg.output} lr={cfg.lr} epoch {epoch + 1}: step {step + 1:,}/{steps_per_epoch:,}, "
                    f"train nll {total / (step + 1):.4f}, {ms:.2f} ms/step, "
                    f"epoch ends in {(steps_per_epoch - step - 1) * ms / 60000:.0f} min (checkpoint saved)")
        record: dict[str, float] = {"epoch": epoch + 1, "train_nll": total / steps_per_epoch}
        last = epoch == cfg.epochs - 1
        if cfg.eval_per_epoch or last:
            try:
                record["valid_perplexity"], _ = _evaluate(model, output, x_valid, y_valid, cfg.batch_size, device)
                record["test_perplexity"], test_ms = _evaluate(model, output, x_test, y_test, cfg.batch_size, device,
                                                              timed=last)
            except NonFiniteInputError as exc:  # the epoch's last steps diverged
                raise FloatingPointError(f"{cfg.output}: non-finite representation after epoch {epoch + 1} "
                                         f"(lr {cfg.lr} too large?): {exc}") from exc
            if last:
                result.test_ms_per_batch = test_ms
        result.epochs.append(record)
        if tracking or learner is not None:
            result.reassignments = reassignment_history()
        result.seconds = time.perf_counter() - t_start
        if ckpt_path is not None and not last:
            save_checkpoint()
        # logged after the checkpoint: an interrupted run resumes after the last epoch it printed
        log(f"{cfg.output} lr={cfg.lr} epoch {epoch + 1}: " + ", ".join(
            f"{k}={v:.4g}" for k, v in record.items() if k != "epoch"))

    result.train_ms_per_batch = 1000 * float(np.mean(step_times[min(warmup, len(step_times) - 1):]))
    final = result.epochs[-1]
    result.valid_perplexity = final["valid_perplexity"]
    result.test_perplexity = final["test_perplexity"]
    if isinstance(output, HierarchicalSoftmax):
        result.tree = output.tree.to_dict()
    if done_path is not None:
        # atomic: a failed write (full disk) raises here and leaves the checkpoint for the rerun
        atomic_write(done_path, json.dumps(asdict(result)))
        if ckpt_path is not None and ckpt_path.exists():
            ckpt_path.unlink()
    return result


def learn_embeddings(corpus: LMCorpus, cfg: LMRunConfig, dim: int = 50, epochs: int = 1,
                     device: str | torch.device = "cpu") -> np.ndarray:
    """Word embeddings of dimension ``dim`` for the clustering tree: the input embeddings ``U``
    of a log-bilinear LM trained with a random-tree HSM (our stand-in for the paper's fastText
    run, which used a hierarchical-softmax loss too)."""
    device = torch.device(check_device(device))
    hsm_config.seed_everything(cfg.seed + 1000)
    model = LogBilinearLM(corpus.vocab_size, dim, cfg.context, sparse=True).to(device)
    output = HierarchicalSoftmax(dim, Tree.random(corpus.vocab_size, cfg.arity, cfg.depth, seed=cfg.tree_seed + 1000),
                                 sparse=True).to(device)
    optimizer = RowSparseAdagrad(list(model.parameters()) + list(output.parameters()), lr=cfg.lr)
    x_train, y_train = (t.to(device) for t in corpus.windows("train", cfg.context))
    generator = torch.Generator().manual_seed(cfg.seed + 1000)
    steps = math.ceil(len(y_train) / cfg.batch_size)
    if cfg.max_steps_per_epoch is not None:
        steps = min(steps, cfg.max_steps_per_epoch)
    for _ in range(epochs):
        order = torch.randperm(len(y_train), generator=generator).to(device)
        for step in range(steps):
            index = order[step * cfg.batch_size:(step + 1) * cfg.batch_size]
            optimizer.zero_grad(set_to_none=True)
            output(model(x_train[index]), y_train[index]).loss.backward()
            optimizer.step()
    return model.embedding.weight.detach().cpu().numpy()


def fasttext_embeddings(corpus: LMCorpus, dim: int = 50, epochs: int = 5, loss: str = "hs",
                        threads: int | None = None) -> np.ndarray:
    """Word vectors of dimension ``dim`` from fastText (``fasttext-wheel``) trained on the
    training split, one row per vocabulary word: the clustering tree's embeddings as ICML §7.2
    builds them ("FastTree", 5 epochs, hierarchical-softmax loss).

    The paper does not say which fastText model; we use skip-gram (fastText's unsupervised
    default) on whole words (no character n-grams: the tree clusters words, and the n-grams
    would triple the cost), every word kept (``minCount=1``, the vocabulary is already capped).
    The vectors are cached under ``hsm.config.cache_dir()`` like any derived data. fastText
    (``fasttext-wheel`` 0.9.2 takes no seed) with several threads is not deterministic.
    Raises ImportError with the install command when fastText is missing."""
    try:
        import fasttext
    except ImportError as exc:
        raise ImportError("the paper's clustering tree needs fastText: pip install 'fasttext-wheel>=0.9.2' "
                          "(or the hsm[baselines] extra); the option clustering_embeddings=lbl uses our own "
                          "log-bilinear embeddings instead") from exc
    if loss not in ("hs", "ns", "softmax"):
        raise ValueError(f"loss must be 'hs', 'ns' or 'softmax', got {loss!r}")
    threads = threads or torch.get_num_threads()
    folder = hsm_config.cache_dir() / "derived" / "fasttext"
    stem = f"{corpus.name}-{corpus.train.numel()}-V{corpus.vocab_size}-d{dim}-e{epochs}-{loss}"
    vectors_path = folder / f"{stem}.npy"
    if vectors_path.exists():
        try:
            vectors = np.load(vectors_path)
            if vectors.shape == (corpus.vocab_size, dim) and np.isfinite(vectors).all():
                return vectors
        except (OSError, ValueError):
            pass
        warnings.warn(f"{vectors_path}: unreadable or wrong shape, training the vectors again", stacklevel=2)
    words = np.asarray(corpus.vocab, dtype=object)
    bad = [w for w in corpus.vocab if not w or any(ch.isspace() for ch in w)]
    if bad:
        raise ValueError(f"{len(bad)} vocabulary words are empty or contain white space (e.g. {bad[0]!r}): "
                         "fastText splits on white space")
    text_path = folder / f"{corpus.name}-{corpus.train.numel()}-V{corpus.vocab_size}-train.txt"
    if not text_path.exists():
        # lines of 1,000 tokens (fastText reads at most 1,024 words a line)
        ids = corpus.train.numpy()

        def write(handle) -> None:
            for start in range(0, len(ids), 1000):
                handle.write((" ".join(words[ids[start:start + 1000]]) + "\n").encode())

        atomic_write(text_path, write)
    model = fasttext.train_unsupervised(str(text_path), model="skipgram", dim=dim, epoch=epochs, loss=loss,
                                        minCount=1, minn=0, maxn=0, thread=threads, verbose=0)
    vectors = np.stack([model.get_word_vector(w) for w in corpus.vocab]).astype(np.float32)
    atomic_write(vectors_path, lambda handle: np.save(handle, vectors))
    return vectors


# ============================================================================ experiments
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
    #: (so the seeds of a long table can run as separate parts); the learned tree starts from seed 0
    first_random_seed: int = 0
    #: the clustering tree's 50-dim word vectors: "fasttext" (the paper's: fastText skip-gram,
    #: hs loss, 5 epochs) or "lbl" (ours: a log-bilinear LM with a random-tree HSM, embed_epochs)
    clustering_embeddings: str = "fasttext"


def _parse_options(options: dict[str, Any]) -> dict[str, Any]:
    """``-o key=value`` options (strings from the CLI, or Python values) to checked LMScale fields.

    Raises ValueError naming the option and its value for an unknown key, a value that does not
    parse, or one out of range (counts >= 1, arity >= 2, learning rates finite and > 0, a
    non-empty ``lr_grid``, ``decay`` in [0, 1], ``l2`` >= 0, ...)."""
    known = {f for f in LMScale.__dataclass_fields__}
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key not in known:
            raise ValueError(f"unknown option {key!r}; known: {sorted(known)}")
        if key == "lr_grid":
            out[key] = option_floats(key, value, positive=True)
        elif key == "dataset":
            out[key] = option_choice(key, value, ("ptb", "gutenberg"))
        elif key == "description":
            out[key] = str(value)
        elif key == "clustering_embeddings":
            out[key] = option_choice(key, value, ("fasttext", "lbl"))
        elif key == "l2":
            out[key] = option_float(key, value, minimum=0.0)
        elif key == "decay":
            out[key] = option_float(key, value, minimum=0.0, maximum=1.0)
        elif key == "learn_epochs":
            number = option_float(key, value, minimum=0.0)
            out[key] = int(number) if number.is_integer() else number
        elif key in _OPTIONAL_COUNTS:
            out[key] = option_int(key, value, minimum=_OPTIONAL_COUNTS[key], allow_none=True)
        else:
            out[key] = option_int(key, value, minimum=_COUNT_MINIMUM.get(key, 1))
    return out


#: LMScale fields that may be None ("none": the whole corpus / vocabulary), with their minimum
_OPTIONAL_COUNTS = {"max_books": 1, "vocab_size": 2, "train_tokens": 1, "eval_tokens": 1, "select_eval_tokens": 1}
#: integer LMScale fields whose minimum is not 1
_COUNT_MINIMUM = {"arity": 2, "select_steps": 0, "first_random_seed": 0}


def _select_lr(corpus: LMCorpus, base: LMRunConfig, tree: Tree | None, sc: LMScale, device, run_dir: Path,
               log) -> tuple[float, list[dict[str, Any]]]:
    """The learning rate of ``sc.lr_grid`` with the best validation perplexity after
    ``sc.select_steps`` steps (one grid per output family)."""
    if len(sc.lr_grid) == 1:
        return sc.lr_grid[0], []
    if sc.select_eval_tokens is not None:
        corpus = _slice(corpus, None, sc.select_eval_tokens)
        # their own folder: a trial scored on a slice must not be taken for one scored on all of it
        run_dir = run_dir / f"select-eval{sc.select_eval_tokens}"
    trials = []
    for lr in sc.lr_grid:
        cfg = replace(base, lr=lr, epochs=1, learn_epochs=0, max_steps_per_epoch=sc.select_steps,
                      output=base.output if base.output in ("flat", "adaptive") else "random")
        try:
            res = train_lm(corpus, cfg, tree=tree, device=device, checkpoint_dir=run_dir, log=log)
            ppl, seconds = res.valid_perplexity, res.seconds
        except FloatingPointError:
            ppl, seconds = math.inf, 0.0
        trials.append({"lr": lr, "valid_perplexity": ppl if math.isfinite(ppl) else None, "seconds": seconds})
    best = min(trials, key=lambda t: t["valid_perplexity"] if t["valid_perplexity"] is not None else math.inf)
    return best["lr"], trials


def _table_corpus(sc: LMScale, device: str) -> LMCorpus:
    """The corpus of a table or ablation at scale ``sc``, after checking that a depth-3 tree of
    ``sc.arity`` holds its vocabulary; on CPU, torch gets one intra-op thread (on a shared 2-core
    machine torch's default, one thread per core, spin-waits for the busy core and runs about 10x
    slower; HSM_THREADS overrides)."""
    if torch.device(device).type == "cpu":
        hsm_config.configure_threads(default=1)
    corpus = load_lm_corpus(sc.dataset, max_books=sc.max_books, vocab_size=sc.vocab_size,
                            train_tokens=sc.train_tokens, eval_tokens=sc.eval_tokens)
    if sc.arity**3 < corpus.vocab_size:
        raise ValueError(f"a {sc.arity}-ary depth-3 tree holds {sc.arity**3} words < vocabulary {corpus.vocab_size}")
    return corpus


def run_table(
    name: str,
    sc: LMScale,
    outputs: Sequence[str],
    device: str,
    log: Callable[[str], None] | None = None,
    schedules: Sequence[tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """Train every output layer of a table at scale ``sc``; return the runs and selections.

    ``schedules`` adds learned-tree runs ``(label, learn_epochs)`` (arXiv Fig. 3)."""
    log = log or (lambda message: print(message, flush=True))
    corpus = _table_corpus(sc, device)
    V = corpus.vocab_size
    run_dir = _run_dir(RUN_FOLDER.get(name, name))
    base = LMRunConfig(output="random", context=sc.context, arity=sc.arity, depth=3, batch_size=sc.batch_size,
                       epochs=sc.epochs, learn_epochs=sc.learn_epochs, reassign_per_epoch=sc.reassign_per_epoch,
                       l2=sc.l2)
    seeds = range(sc.first_random_seed, sc.first_random_seed + sc.random_seeds)
    random_trees = {s: Tree.random(V, sc.arity, 3, seed=s, label_names=corpus.vocab) for s in seeds}
    first_tree = random_trees[0] if 0 in random_trees else Tree.random(V, sc.arity, 3, seed=0, label_names=corpus.vocab)
    runs: dict[str, Any] = {}
    selection: dict[str, Any] = {}
    tree_lr, trials = _select_lr(corpus, base, first_tree, sc, device, run_dir, log)
    selection["tree_lr"], selection["tree_trials"] = tree_lr, trials
    if "flat" in outputs:
        flat_lr, trials = _select_lr(corpus, replace(base, output="flat"), None, sc, device, run_dir, log)
        selection["flat_lr"], selection["flat_trials"] = flat_lr, trials
        runs["flat"] = train_lm(corpus, replace(base, output="flat", lr=flat_lr), device=device,
                                checkpoint_dir=run_dir, log=log)
    if "adaptive" in outputs:
        adaptive_lr, trials = _select_lr(corpus, replace(base, output="adaptive"), None, sc, device, run_dir, log)
        selection["adaptive_lr"], selection["adaptive_trials"] = adaptive_lr, trials
        runs["adaptive"] = train_lm(corpus, replace(base, output="adaptive", lr=adaptive_lr), device=device,
                                    checkpoint_dir=run_dir, log=log)
    if "random" in outputs:
        candidates = [train_lm(corpus, replace(base, output="random", lr=tree_lr, tree_seed=s), tree=t, device=device,
                               checkpoint_dir=run_dir, log=log) for s, t in random_trees.items()]
        best = min(range(len(candidates)), key=lambda i: candidates[i].valid_perplexity)
        runs["random"] = candidates[best]
        selection["random_seed_valid"] = [c.valid_perplexity for c in candidates]
        selection["random_seed_test"] = [c.test_perplexity for c in candidates]
        selection["random_best_seed"] = list(seeds)[best]
        selection["random_seeds"] = list(seeds)
        selection["random_seed_seconds"] = [c.seconds for c in candidates]
    if "clustering" in outputs:
        if sc.clustering_embeddings == "fasttext":
            emb = fasttext_embeddings(corpus, dim=50, epochs=5, loss="hs")
        else:
            emb = learn_embeddings(corpus, replace(base, lr=tree_lr), dim=50, epochs=sc.embed_epochs, device=device)
        tree = clustering_tree(emb, sc.arity, 3, seed=0, label_names=corpus.vocab)
        runs["clustering"] = train_lm(corpus, replace(base, output="clustering", lr=tree_lr), tree=tree,
                                      device=device, checkpoint_dir=run_dir, log=log)
    if "learned" in outputs:
        runs["learned"] = train_lm(corpus, replace(base, output="learned", lr=tree_lr, decay=sc.decay),
                                   tree=first_tree, device=device, checkpoint_dir=run_dir, log=log)
    for label, learn_epochs in schedules or ():
        runs[label] = train_lm(corpus, replace(base, output="learned", lr=tree_lr, learn_epochs=learn_epochs,
                                               decay=sc.decay),
                               tree=first_tree, device=device, checkpoint_dir=run_dir, log=log)
    return {"corpus": corpus, "runs": runs, "selection": selection}


_MODEL_NAMES = {"flat": "Flat soft-max", "random": "Random Tree", "clustering": "Clustering Tree",
                "learned": "Learned Tree", "adaptive": "Adaptive softmax (torch, 2k/20k/100k, div 4; not in the paper)"}
_SLUGS = {"flat": "flat_soft_max", "random": "random_tree", "clustering": "clustering_tree",
          "learned": "learned_tree"}


def _records(table: dict[str, Any], sc: LMScale, claim_prefix: str | None, claim_kind: str,
             scale: str, tree_files: dict[str, Any] | None = None, tree_stem: str = "") -> list[dict[str, Any]]:
    """One record per (run, measure); claims only at full scale and only for runs that match the
    paper's setting (the reduced Gutenberg runs carry no claim: see ``scale_note``)."""
    corpus: LMCorpus = table["corpus"]
    records = []
    common = {"dataset": sc.dataset, "vocab_size": corpus.vocab_size, "train_tokens": int(corpus.train.numel()),
              "valid_tokens": int(corpus.valid.numel()), "test_tokens": int(corpus.test.numel()),
              "context": sc.context, "arity": sc.arity, "depth": 3, "scale": scale,
              "scale_note": f"{sc.dataset}: {int(corpus.train.numel()):,} training tokens, vocabulary "
                            f"{corpus.vocab_size:,}, {sc.arity}-ary depth-3 trees, {sc.epochs} epochs "
                            f"(learned tree: {sc.learn_epochs} learning the tree), batch {sc.batch_size}"
                            + (f", L2 {sc.l2:g}" if sc.l2 else ", no L2")
                            + (f", learned-tree statistics decay {sc.decay:g}" if sc.decay != 0.5 else "")
                            + "; " + sc.description}
    for kind, run in table["runs"].items():
        learn = run.config.get("learn_epochs")
        model = _MODEL_NAMES.get(kind, f"Learned Tree (learn {learn:g} + fine-tune "
                                       f"{run.config['epochs'] - learn:g} epochs)")
        slug = _SLUGS.get(kind)
        fields = dict(common, model=model, run=kind, lr=run.config["lr"], batch_size=run.config["batch_size"],
                      epochs=run.config["epochs"], learn_epochs=run.config.get("learn_epochs"),
                      per_epoch=run.epochs, wall_time_s=run.seconds, trained_on=run.device)
        if kind in ("flat", "adaptive"):
            fields.update(arity=None, depth=None)
        claim = lambda measure: (f"{claim_prefix}.{slug}.{measure}"  # noqa: E731
                                 if claim_prefix and slug else None)
        records.append(make_record(claim("perplexity"), run.test_perplexity, measure="test_perplexity",
                                   valid_perplexity=run.valid_perplexity, **fields))
        if claim_kind == "arxiv":
            records.append(make_record(claim("ms_per_batch"), run.train_ms_per_batch, measure="train_ms_per_batch",
                                       **fields))
        else:
            records.append(make_record(claim("train_ms_per_batch"), run.train_ms_per_batch,
                                       measure="train_ms_per_batch", **fields))
            records.append(make_record(claim("test_ms_per_batch"), run.test_ms_per_batch,
                                       measure="test_ms_per_batch", **fields))
        if claim_kind == "arxiv":
            records.append(make_record(None, run.test_ms_per_batch, measure="test_ms_per_batch", **fields))
        if run.reassignments:
            records.append(make_record(None, float(np.mean([r["moved_labels"] for r in run.reassignments])),
                                       measure="mean_moved_labels", reassignments=run.reassignments, **fields))
        if run.tree is not None and kind.startswith("learned") and tree_files is not None:
            tree_files[kind] = {"tree": run.tree, "counts": corpus.counts.tolist()}
            records.append(make_record(None, float(run.tree["num_labels"]), measure="final_tree",
                                       tree_file=f"{tree_stem}-{kind}-tree.json.gz", **fields))
    flat = table["runs"].get("flat")
    learned = table["runs"].get("learned")
    if flat is not None and learned is not None:
        speed = dict(common, model="Learned Tree vs Flat soft-max")
        if claim_kind == "icml":
            records.append(make_record("icml2017.speedup.train" if claim_prefix else None,
                                       flat.train_ms_per_batch / learned.train_ms_per_batch,
                                       measure="train_speedup", **speed))
            records.append(make_record("icml2017.speedup.test" if claim_prefix else None,
                                       flat.test_ms_per_batch / learned.test_ms_per_batch,
                                       measure="test_speedup", **speed))
        elif sc.dataset == "gutenberg":
            records.append(make_record("arxiv2016.speedup.gutenberg" if claim_prefix else None,
                                       flat.train_ms_per_batch / learned.train_ms_per_batch,
                                       measure="train_speedup", **speed))
    records.append(make_record(None, float(table["selection"].get("tree_lr", math.nan)), measure="selection",
                               selection=table["selection"], **common))
    return records


_EMBEDDINGS = {"fasttext": "fastText skip-gram (fasttext-wheel), d=50, hs loss, 5 epochs, whole words",
               "lbl": "our log-bilinear LM, d=50, random-tree HSM"}


def _out_path(out: Path | None, default: str) -> Path:
    """``out``, else ``default`` under :func:`hsm.results.output_root` (not the committed results)."""
    return output_path(default, out)


def _write(name: str, out: Path | None, default: str, records, sc: LMScale, scale: str, device: str,
           seconds: float, tree_files: dict[str, Any] | None = None, options: dict[str, Any] | None = None,
           training_seconds: float | None = None, extra_config: dict[str, Any] | None = None,
           force: bool = False) -> Path:
    """Write the result file and, beside it, each learned tree with the word counts as
    ``<stem>-<run>-tree.json.gz`` (not a result file: the notebooks draw the tree from it)."""
    path = _out_path(out, default)
    check_replace(path, scale, force)  # before the tree files: a refused result leaves them alone too
    path.parent.mkdir(parents=True, exist_ok=True)
    for kind, payload in (tree_files or {}).items():
        # gzip: a 250k-word tree with its words and counts is 6.9 MB as text, 1.8 MB compressed
        data = gzip.compress(json.dumps(payload).encode(), mtime=0)
        atomic_write(path.with_name(f"{path.stem}-{kind}-tree.json.gz"), data)
    prov = provenance(config={"experiment": name, "scale": scale, "device": device, **asdict(sc),
                              "optimizer": "Adagrad", "initial_learned_tree": "random (seed 0)",
                              "clustering_embeddings": _EMBEDDINGS[sc.clustering_embeddings]},
                      wall_time_s=seconds, scale=scale)
    # a run whose preset was overridden says so in its scale label (the landing page shows it)
    overrides = {k: v for k, v in (options or {}).items() if k != "description"}
    prov["hsm_scale"] = scale if not overrides else (
        f"{scale}, reduced: " + ", ".join(f"{k}={v}" for k, v in sorted(overrides.items())))
    prov["config"]["overrides"] = overrides
    prov["config"]["training_seconds"] = training_seconds
    prov["config"].update(extra_config or {})
    return write_results(path, records, prov, force=force)


def _scale_for(name: str, scale: str, options: dict[str, Any]) -> LMScale:
    """The preset of ``name`` at ``scale`` with ``options`` applied (all checked: ValueError)."""
    presets = SCALES[name]
    sc = replace(presets[check_scale(scale)], **_parse_options(options))
    if sc.max_books is not None and sc.dataset != "gutenberg":
        raise ValueError(f"option max_books={sc.max_books}: only the gutenberg dataset has books")
    return sc


#: quick: CI slices (about a minute); full: the paper's setting (PTB) or what the hardware allows.
SCALES: dict[str, dict[str, LMScale]] = {
    "lm-ptb": {
        "quick": LMScale("ptb", context=3, arity=13, epochs=2, reassign_per_epoch=20, lr_grid=(0.05,),
                         select_steps=0, random_seeds=1, learn_epochs=1, vocab_size=2000, train_tokens=150_000,
                         eval_tokens=20_000,
                         clustering_embeddings="lbl",  # fastText is an optional extra (hsm[baselines])
                         description="quick: first 150k PTB training tokens, first 20k valid/test tokens, "
                                     "vocabulary capped at 2,000 (13-ary depth-3 trees), 2 epochs "
                                     "(learned tree: 1 epoch learned + 1 fine-tuned), one random tree"),
        "full": LMScale("ptb", context=3, arity=25, epochs=4, reassign_per_epoch=20,
                        lr_grid=(0.025, 0.05, 0.1, 0.25), select_steps=1500, random_seeds=5, learn_epochs=3,
                        description="full: PTB (Mikolov split), 10k vocabulary, 25-ary depth-3 trees, 4 epochs, "
                                    "learned tree 3 epochs + 1 fine-tuning (the better of arXiv Fig. 3)"),
    },
    "lm-gutenberg-65": {
        "quick": LMScale("gutenberg", context=4, arity=13, epochs=2, reassign_per_epoch=50, lr_grid=(0.05,),
                         select_steps=0, random_seeds=1, learn_epochs=1, max_books=10, vocab_size=2000,
                         train_tokens=300_000, eval_tokens=20_000,
                         clustering_embeddings="lbl",  # fastText is an optional extra (hsm[baselines])
                         description="quick: 10 books (8 train), first 300k training tokens, vocabulary 2,000 "
                                     "(13-ary depth-3 trees), 2 epochs (learned: 1 + 1 fine-tuned), one random tree"),
        "full": LMScale("gutenberg", context=4, arity=65, epochs=4, reassign_per_epoch=50,
                        lr_grid=(0.01, 0.02, 0.05, 0.1, 0.25, 0.5), select_steps=10_000, random_seeds=5,
                        learn_epochs=2, select_eval_tokens=500_000,
                        description="full: all 678 books (542 train, ~50M tokens), 250k vocabulary, 65-ary "
                                    "depth-3 trees (needs a GPU for the flat softmax)"),
    },
    "lm-gutenberg-75": {
        # the same slice as lm-gutenberg-65's quick preset, with the arXiv rebuild rate
        "quick": None,
        "full": LMScale("gutenberg", context=4, arity=75, epochs=4, reassign_per_epoch=20,
                        lr_grid=(0.025, 0.05, 0.1), select_steps=10_000, random_seeds=5, learn_epochs=2,
                        select_eval_tokens=500_000,
                        description="full: all 678 books (542 train, ~50M tokens), 250k vocabulary, 75-ary "
                                    "depth-3 trees (needs a GPU for the flat softmax)"),
    },
}
SCALES["lm-gutenberg-75"]["quick"] = replace(SCALES["lm-gutenberg-65"]["quick"], reassign_per_epoch=20)
# the schedules share lm-ptb's runs (same configurations, same run folder): at full scale only the
# "learn 1 epoch + fine-tune 3" run is new
SCALES["lm-ptb-schedules"] = {
    "quick": replace(SCALES["lm-ptb"]["quick"], epochs=3, learn_epochs=2,
                     description=SCALES["lm-ptb"]["quick"].description.replace(
                         "2 epochs (learned tree: 1 epoch learned + 1 fine-tuned)", "3 epochs") +
                     "; learned trees: 1 epoch learned + 2 fine-tuned, and 2 + 1"),
    "full": SCALES["lm-ptb"]["full"],
}
#: experiments whose runs are shared (same run folder under the cache)
RUN_FOLDER = {"lm-ptb-schedules": "lm-ptb"}


def _run_experiment(name: str, scale: str, device: str, out: Path | None, options: dict[str, Any],
                    outputs: Sequence[str], claim_prefix: str, claim_kind: str,
                    schedules: Callable[[LMScale], list[tuple[str, int]]] | None = None,
                    force: bool = False) -> Path:
    """Run one registered experiment: train its output layers, write its records (claims only
    when the data are the paper's: full vocabulary, all tokens), save its learned trees.

    Everything is checked before training starts (ValueError): the scale, the device, the
    options, and that ``out`` does not hold a larger-scale result (unless ``force``)."""
    start = time.perf_counter()
    options = dict(options)
    runs = options.pop("runs", None)
    if runs is not None:
        # a table too long for one sitting, split into parts (each its own result file, --out);
        # "selection" alone picks the learning rate and trains nothing
        chosen = option_choices("runs", runs, tuple(outputs) + ("selection",))
        if "selection" in chosen and len(chosen) > 1:
            raise ValueError(f"option runs={runs!r}: 'selection' trains nothing, so it stands alone")
        outputs = tuple(kind for kind in outputs if kind in chosen)
        if schedules is not None and "learned" not in chosen:
            schedules = None
    sc = _scale_for(name, scale, options)
    device = check_device(device)
    check_replace(_out_path(out, DEFAULT_OUT[name]), scale, force)
    table = run_table(name, sc, outputs, device, schedules=schedules(sc) if schedules else None)
    if sc.dataset == "ptb":
        paper_data = sc.vocab_size is None and sc.train_tokens is None
    else:
        paper_data = sc.max_books is None and sc.vocab_size in (None, 250_000) and sc.train_tokens is None
    selection = table["selection"]
    # training time of every run this result rests on (runs finished earlier are loaded from the
    # run folder, so this invocation's wall time can be much shorter)
    training_seconds = (sum(run.seconds for kind, run in table["runs"].items() if kind != "random")
                        + sum(selection.get("random_seed_seconds", []))
                        + sum(t["seconds"] for key in ("tree_trials", "flat_trials", "adaptive_trials")
                              for t in selection.get(key, [])))
    trees: dict[str, Any] = {}
    records = _records(table, sc, claim_prefix if scale == "full" and paper_data else None, claim_kind, scale,
                       trees, _out_path(out, DEFAULT_OUT[name]).stem)
    return _write(name, out, DEFAULT_OUT[name], records, sc, scale, device, time.perf_counter() - start, trees,
                  options, training_seconds, extra_config={"runs": list(outputs)}, force=force)


def _ptb_schedules(sc: LMScale) -> list[tuple[str, int]]:
    """arXiv Fig. 3: learn the tree for 1 epoch then fine-tune, and learn for all but the last."""
    last = max(sc.epochs - 1, 1)
    return [(f"learned_1_{sc.epochs - 1}", 1), (f"learned_{last}_{sc.epochs - last}", last)]


@experiment("lm-ptb", "arXiv Table 1 (PTB): flat, random, learned tree; 25-ary depth 3, T=3", DEFAULT_OUT["lm-ptb"])
def run_lm_ptb(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
               **options: Any) -> Path:
    """arXiv Table 1, PTB columns. ``out`` None: ``hsm-results/lm/ptb.json`` (see the module
    docstring); ValueError for a bad scale, device or option, or a refused replacement."""
    return _run_experiment("lm-ptb", scale, device, out, options, ("flat", "random", "learned"),
                           "arxiv2016.table1.ptb", "arxiv", force=force)


@experiment("lm-ptb-schedules", "arXiv Fig. 3 (PTB): perplexity per epoch, learn 1+fine-tune 3, learn 3+1, "
            "random, flat", DEFAULT_OUT["lm-ptb-schedules"])
def run_lm_ptb_schedules(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                         **options: Any) -> Path:
    """arXiv Fig. 3 (PTB): the two tree-learning schedules against the random tree and flat."""
    return _run_experiment("lm-ptb-schedules", scale, device, out, options, ("flat", "random"), "", "arxiv",
                           schedules=_ptb_schedules, force=force)


@experiment("lm-gutenberg-65", "ICML Table 2 + Fig. 2 (Gutenberg): clustering, random, flat, learned; 65-ary "
            "depth 3, T=4", DEFAULT_OUT["lm-gutenberg-65"])
def run_lm_gutenberg_65(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                        **options: Any) -> Path:
    """ICML Table 2 and Fig. 2."""
    return _run_experiment("lm-gutenberg-65", scale, device, out, options,
                           ("clustering", "random", "flat", "learned", "adaptive"), "icml2017.table2", "icml",
                           force=force)


@experiment("lm-gutenberg-75", "arXiv Table 1 (Gutenberg columns): flat, random, learned; 75-ary depth 3, T=4",
            DEFAULT_OUT["lm-gutenberg-75"])
def run_lm_gutenberg_75(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                        **options: Any) -> Path:
    """arXiv Table 1, Gutenberg columns."""
    return _run_experiment("lm-gutenberg-75", scale, device, out, options, ("flat", "random", "learned"),
                           "arxiv2016.table1.gutenberg", "arxiv", force=force)


# ======================================================================= ablation: why the learned tree gains little
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


def run_ablation(sc: LMScale, variants: Sequence[str], device: str = "cpu",
                 log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train the learned tree under each of ``variants`` (:data:`ABLATION_VARIANTS`), the random
    tree it starts from (seed 0, with its J_n tracked at the same steps) at every learning rate
    used, ``sc.random_seeds`` random trees for the seed-to-seed spread, and (with ``base``) the
    base run's final tree retrained from scratch. Learning rate: ``sc.lr_grid[0]`` unless the
    variant changes it. Runs checkpoint under the cache (``lm-runs/lm-ptb-ablation``)."""
    unknown = [v for v in variants if v not in ABLATION_VARIANTS]
    if unknown or not variants:
        raise ValueError(f"unknown or no ablation variants {unknown}; known: {list(ABLATION_VARIANTS)}")
    log = log or (lambda message: print(message, flush=True))
    corpus = _table_corpus(sc, device)
    V = corpus.vocab_size
    run_dir = _run_dir("lm-ptb-ablation")
    base = LMRunConfig(output="learned", context=sc.context, arity=sc.arity, depth=3, batch_size=sc.batch_size,
                       epochs=sc.epochs, learn_epochs=sc.learn_epochs, reassign_per_epoch=sc.reassign_per_epoch,
                       lr=sc.lr_grid[0])
    trees = [Tree.random(V, sc.arity, 3, seed=s, label_names=corpus.vocab) for s in range(max(1, sc.random_seeds))]
    runs: dict[str, LMRunResult] = {}
    # the random tree each learned run is compared with: seed 0 (its initial tree) trained with
    # the same learning rate and L2 (the settings that change the random tree too)
    reference: dict[tuple[float, float], str] = {}
    for seed, tree in enumerate(trees):
        cfg = replace(base, output="random", tree_seed=seed, track_objective=seed == 0)
        runs[f"random_seed{seed}"] = train_lm(corpus, cfg, tree=tree, device=device, checkpoint_dir=run_dir, log=log)
    reference[(base.lr, base.l2)] = "random_seed0"
    for name in variants:
        cfg = replace(base, **_ablation_changes(name, sc.epochs))
        if (cfg.lr, cfg.l2) not in reference:
            label = "random_" + "_".join(f"{k}{v:g}" for k, v in (("lr", cfg.lr), ("l2", cfg.l2))
                                          if v != getattr(base, k))
            runs[label] = train_lm(corpus, replace(base, output="random", lr=cfg.lr, l2=cfg.l2, track_objective=True),
                                   tree=trees[0], device=device, checkpoint_dir=run_dir, log=log)
            reference[(cfg.lr, cfg.l2)] = label
        runs[name] = train_lm(corpus, cfg, tree=trees[0], device=device, checkpoint_dir=run_dir, log=log)
        if name == "base" and runs["base"].tree is not None:
            # right after base: whether its tree is better than random, once words stop moving
            runs["retrained"] = train_lm(corpus, replace(base, output="random", fixed_tree="retrained:base"),
                                         tree=Tree.from_dict(runs["base"].tree), device=device,
                                         checkpoint_dir=run_dir, log=log)
    reference_of = {name: reference[(run.config["lr"], run.config.get("l2", 0.0))] for name, run in runs.items()}
    return {"corpus": corpus, "runs": runs, "reference": reference_of, "variants": list(variants)}


def _ablation_records(table: dict[str, Any], sc: LMScale, scale: str) -> list[dict[str, Any]]:
    """One ``test_perplexity`` record per run (variant or baseline), with its gain over the random
    tree it started from (seed 0, same learning rate), its rebuild history (moved labels, J_n per
    depth) and, for the learned trees, the mean share of words moved per rebuild in the last
    learning epoch; one ``random_seed_spread`` record."""
    corpus: LMCorpus = table["corpus"]
    common = {"dataset": sc.dataset, "vocab_size": corpus.vocab_size, "train_tokens": int(corpus.train.numel()),
              "valid_tokens": int(corpus.valid.numel()), "test_tokens": int(corpus.test.numel()),
              "context": sc.context, "arity": sc.arity, "depth": 3, "scale": scale,
              "scale_note": f"{sc.dataset}: {int(corpus.train.numel()):,} training tokens, vocabulary "
                            f"{corpus.vocab_size:,}, {sc.arity}-ary depth-3 trees, {sc.epochs} epochs "
                            f"(learned tree: {sc.learn_epochs} learning the tree), batch {sc.batch_size}; "
                            + sc.description}
    records = []
    for name, run in table["runs"].items():
        cfg = run.config
        learned = cfg["output"] == "learned"
        reference = table["runs"][table["reference"][name]]
        history = run.reassignments
        fields = dict(common, run=name, variant=name if learned or name == "retrained" else None,
                      what=ABLATION_WHAT.get(name, f"random tree (seed {cfg['tree_seed']}, lr {cfg['lr']:g}"
                                                   + (f", L2 {cfg['l2']:g})" if cfg.get("l2") else ")")),
                      model="Learned Tree" if learned else "Random Tree" if cfg.get("fixed_tree") is None else
                      "Learned Tree (fixed, retrained)", output=cfg["output"], lr=cfg["lr"],
                      changes=(_ablation_changes(name, sc.epochs) if name in ABLATION_VARIANTS else
                               {"fixed_tree": cfg.get("fixed_tree")} if cfg.get("fixed_tree") else {}),
                      config=cfg, per_epoch=run.epochs, wall_time_s=run.seconds, trained_on=run.device,
                      train_ms_per_batch=run.train_ms_per_batch, reassignments=history,
                      reference_run=table["reference"][name],
                      gain_vs_random=reference.test_perplexity - run.test_perplexity)
        if learned and history:
            last_epoch = math.ceil(max(h["epoch"] for h in history) - 1e-9)
            fields["moved_labels_last_epoch"] = float(np.mean(
                [h["moved_labels"] for h in history if h["epoch"] > last_epoch - 1]))
        if history:
            fields["objective_by_depth_last"] = history[-1]["objective_by_depth"]
        records.append(make_record(None, run.test_perplexity, measure="test_perplexity",
                                   valid_perplexity=run.valid_perplexity, **fields))
    seeds = [run.test_perplexity for name, run in table["runs"].items() if name.startswith("random_seed")]
    records.append(make_record(None, float(np.std(seeds)), measure="random_seed_spread", test_perplexities=seeds,
                               valid_perplexities=[run.valid_perplexity for name, run in table["runs"].items()
                                                   if name.startswith("random_seed")], **common))
    return records


SCALES["lm-ptb-ablation"] = {
    "quick": LMScale("ptb", context=3, arity=13, epochs=2, reassign_per_epoch=20, lr_grid=(0.05,), select_steps=0,
                     random_seeds=2, learn_epochs=1, vocab_size=2000, train_tokens=60_000, eval_tokens=10_000,
                     clustering_embeddings="lbl",  # fastText is an optional extra (hsm[baselines])
                     description="quick: first 60k PTB training tokens, first 10k valid/test tokens, vocabulary "
                                 "2,000 (13-ary trees), 2 epochs (learned: 1 learning + 1 fine-tuning), lr 0.05"),
    # full PTB data, but 2 epochs: on a slice (250k tokens) the trees over-fit after one epoch (no
    # L2: see the module docstring) and the learned tree then "wins" by training less
    "full": LMScale("ptb", context=3, arity=25, epochs=2, reassign_per_epoch=20, lr_grid=(0.05,), select_steps=0,
                    random_seeds=3, learn_epochs=1,
                    description="ablation: full PTB (929k training tokens, 10k vocabulary, 25-ary depth-3 trees), "
                                "2 epochs (learned: 1 learning + 1 fine-tuning, lm-ptb's 2-epoch schedule), lr 0.05 "
                                "(lm-ptb's selected tree rate), 3 random trees"),
}
DEFAULT_OUT["lm-ptb-ablation"] = f"{RESULTS_DIR}/ptb-ablation.json"


@experiment("lm-ptb-ablation", "Why the learned tree gains little over the random tree (PTB, reduced): one "
            "change at a time (rebuild rate, statistics decay and prior, ranking, learning rate, schedule)",
            DEFAULT_OUT["lm-ptb-ablation"])
def run_lm_ptb_ablation(scale: str = "quick", device: str = "cpu", out: Path | None = None, force: bool = False,
                        **options: Any) -> Path:
    """Ablation of the learned tree's setting on a reduced PTB (``-o variants=base,decay_0,...``
    picks a subset of :data:`ABLATION_VARIANTS`; the other options are LMScale fields)."""
    start = time.perf_counter()
    options = dict(options)
    variants = options.pop("variants", None)
    variants = (list(ABLATION_VARIANTS) if variants is None else
                [v for v in (variants.split(",") if isinstance(variants, str) else variants) if v])
    sc = _scale_for("lm-ptb-ablation", scale, options)
    unknown = [v for v in variants if v not in ABLATION_VARIANTS]
    if unknown or not variants:
        raise ValueError(f"option variants: unknown or no ablation variants {unknown}; known: {list(ABLATION_VARIANTS)}")
    device = check_device(device)
    check_replace(_out_path(out, DEFAULT_OUT["lm-ptb-ablation"]), scale, force)
    table = run_ablation(sc, variants, device)
    records = _ablation_records(table, sc, scale)
    training_seconds = sum(run.seconds for run in table["runs"].values())
    return _write("lm-ptb-ablation", out, DEFAULT_OUT["lm-ptb-ablation"], records, sc, scale, device,
                  time.perf_counter() - start, None, dict(options, **({"variants": ",".join(variants)}
                                                            if variants != list(ABLATION_VARIANTS) else {})),
                  training_seconds, extra_config={
                      "variants": {v: _ablation_changes(v, sc.epochs) for v in variants},
                      "initial_learned_tree": "random (seed 0), the random_seed0 run's tree"}, force=force)


# ============================================================================ reading results (notebooks)
def runs_of(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{run: {measure: record}}`` from a result file's records."""
    out: dict[str, dict[str, Any]] = {}
    for record in payload["records"]:
        if "run" in record:
            out.setdefault(record["run"], {})[record["measure"]] = record
    return out


def combine_parts(payloads: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One table from a table run in parts (``-o runs=...``, one result file each).

    Returns ``{"records": ..., "parts": [...], "random_seeds": {seed: {"valid": .., "test": ..}}}``:
    every part's rows, with the random row the random part whose seed has the best validation
    perplexity (as :func:`run_table` picks it), and every random seed's perplexities for the
    spread. ValueError when two parts hold the same other row, or when the parts were trained on
    different data (vocabulary, training tokens, context)."""
    records: list[dict[str, Any]] = []
    seeds: dict[int, dict[str, float]] = {}
    best_random: tuple[float, list[dict[str, Any]]] | None = None
    seen: dict[str, int] = {}
    data = None
    for index, payload in enumerate(payloads):
        runs = runs_of(payload)
        for record in payload["records"]:
            if record.get("measure") == "selection" and "random_seeds" in record.get("selection", {}):
                sel = record["selection"]
                for seed, valid, test in zip(sel["random_seeds"], sel["random_seed_valid"], sel["random_seed_test"]):
                    seeds[int(seed)] = {"valid": valid, "test": test}
        for run, measures in runs.items():
            ppl = measures["test_perplexity"]
            setting = (ppl["vocab_size"], ppl["train_tokens"], ppl["context"])
            if data is not None and setting != data:
                raise ValueError(f"part {index} was trained on other data (vocabulary, tokens, context) {setting} "
                                 f"than the first part {data}")
            data = setting
            if run == "random":
                if best_random is None or ppl["valid_perplexity"] < best_random[0]:
                    best_random = (ppl["valid_perplexity"], list(measures.values()))
                continue
            if run in seen:
                raise ValueError(f"row {run!r} is in parts {seen[run]} and {index}")
            seen[run] = index
            records.extend(measures.values())
    if best_random is not None:
        records.extend(best_random[1])
    return {"records": records, "random_seeds": seeds, "parts": [p.get("provenance", {}) for p in payloads]}


def table_markdown(payload: dict[str, Any], paper_prefix: str | None = None, timing: str = "icml",
                   delta: bool = False) -> str:
    """Our rows (test perplexity, train and test ms/batch) with the paper's numbers beside them,
    labelled as the paper's; ``paper_prefix`` e.g. ``icml2017.table2`` or ``arxiv2016.table1.ptb``;
    ``delta`` adds ours minus the paper's perplexity."""
    from hsm import paper

    rows = runs_of(payload)
    head = "| Model | perplexity (ours) | train ms/batch (ours) | test ms/batch (ours) |"
    sep = "|---|---|---|---|"
    if paper_prefix:
        paper_ms = "train / test ms/batch (paper)" if timing == "icml" else "ms/batch (paper)"
        head += f" perplexity (paper) | {paper_ms} |" + (" perplexity, ours - paper |" if delta else "")
        sep += "---|---|" + ("---|" if delta else "")
    lines = [head, sep]
    most_epochs = max((m["test_perplexity"].get("epochs") or 0 for m in rows.values()), default=0)
    for run, measures in rows.items():
        ppl = measures["test_perplexity"]
        name = ppl["model"]
        if ppl.get("epochs") and ppl["epochs"] < most_epochs:  # a row trained less than the others says so
            name += f" ({ppl['epochs']} epoch{'s' if ppl['epochs'] > 1 else ''} only)"
        line = (f"| {name} | {ppl['value']:.1f} | {measures['train_ms_per_batch']['value']:.2f} | "
                f"{measures['test_ms_per_batch']['value']:.2f} |")
        slug = _SLUGS.get(run)
        if paper_prefix:
            if slug and f"{paper_prefix}.{slug}.perplexity" in paper.NUMBERS:
                p_ppl = paper.get(f"{paper_prefix}.{slug}.perplexity").value
                if timing == "icml":
                    p_ms = (f"{paper.get(f'{paper_prefix}.{slug}.train_ms_per_batch').value:g} / "
                            f"{paper.get(f'{paper_prefix}.{slug}.test_ms_per_batch').value:g}")
                else:
                    p_ms = f"{paper.get(f'{paper_prefix}.{slug}.ms_per_batch').value:g}"
                line += f" {p_ppl:g} | {p_ms} |" + (f" {ppl['value'] - p_ppl:+.1f} |" if delta else "")
            else:
                line += " - | - |" + (" - |" if delta else "")
        lines.append(line)
    return "\n".join(lines) + "\n"


def plot_per_epoch(payload: dict[str, Any], ax: Any, split: str = "test_perplexity", title: str = "") -> Any:
    """Perplexity after each epoch, one line per run (arXiv Fig. 3, ICML Fig. 2)."""
    for run, measures in runs_of(payload).items():
        rec = measures["test_perplexity"]
        epochs = [e["epoch"] for e in rec["per_epoch"]]
        values = [e[split] for e in rec["per_epoch"]]
        ax.plot(epochs, values, marker="o", label=rec["model"])
    ax.set_xlabel("epoch")
    ax.set_ylabel(split.replace("_", " "))
    ax.set_xticks(sorted({e["epoch"] for m in runs_of(payload).values() for e in m["test_perplexity"]["per_epoch"]}))
    ax.legend(fontsize=8)
    ax.set_title(title)
    return ax


def plot_learning_evidence(payload: dict[str, Any], axes: Sequence[Any], run: str = "learned") -> None:
    """Left: mass-weighted mean J_n per depth before each re-assignment; right: fraction of
    words whose path changed at each re-assignment."""
    rec = runs_of(payload)[run]["mean_moved_labels"]
    history = rec["reassignments"]
    epochs = [h["epoch"] for h in history]
    depths = sorted({int(d) for h in history for d in h["objective_by_depth"]})
    for depth in depths:
        axes[0].plot(epochs, [h["objective_by_depth"].get(str(depth), math.nan) for h in history],
                     marker=".", label=f"depth {depth} (root = 0)")
    axes[0].set_xlabel("epoch")
    axes[0].set_ylabel("mean $J_n$ (eq. 6, continuous)")
    axes[0].legend(fontsize=8)
    axes[1].plot(epochs, [h["moved_labels"] for h in history], marker=".")
    axes[1].set_xlabel("epoch")
    axes[1].set_ylabel("fraction of words moved")
    axes[1].set_yscale("log")


def load_tree_file(path: str | Path) -> tuple[Tree, np.ndarray]:
    """A learned tree saved beside a result file (``.json.gz``, or ``.json`` as written before
    trees were compressed), and the training counts of its words."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    data = json.loads(raw)
    return Tree.from_dict(data["tree"]), np.asarray(data["counts"])


def leaf_table(tree: Tree, counts: np.ndarray, nodes: int = 4, words: int = 10,
               min_words: int = 8, sample_seed: int | None = None) -> dict[str, list[str]]:
    """Words at deepest internal nodes, like ICML supplement Table 4: the ``nodes`` bottom nodes
    with the most training mass among those holding at least ``min_words`` words, each with its
    ``words`` most frequent words; with ``sample_seed``, ``nodes`` of those bottom nodes drawn at
    random instead (a typical view rather than the busiest). (Fixed rules, not a hand-picked set
    of coherent nodes.)"""
    counts = np.asarray(counts, dtype=np.float64)
    # each word's parent (the last node of its path), once: calling labels_under per node would
    # scan all K paths for each of the M^2 bottom nodes (40 s at K = 250k)
    K = tree.num_labels
    mask = tree.path_mask[:K]
    parent = tree.path_nodes[:K][np.arange(K), mask.sum(axis=1) - 1]
    sizes = np.bincount(parent, minlength=tree.num_nodes)
    mass = np.bincount(parent, weights=counts[:K], minlength=tree.num_nodes)
    bottom = np.nonzero((tree.node_depth == tree.max_depth - 1) & (sizes >= min_words))[0]
    if sample_seed is not None:  # a typical view: bottom nodes drawn at random, in node order
        pick = np.random.default_rng(sample_seed).choice(bottom.size, size=min(nodes, bottom.size), replace=False)
        chosen = [int(n) for n in np.sort(bottom[pick])]
    else:
        candidates = [(float(mass[n]), int(n)) for n in bottom]
        chosen = [n for _, n in sorted(candidates, reverse=True)[:nodes]]
    return {f"node {n}": tree.top_labels(n, counts, words) for n in chosen}


def leaf_table_markdown(table: dict[str, list[str]]) -> str:
    names = list(table)
    rows = max(len(v) for v in table.values())
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for i in range(rows):
        lines.append("| " + " | ".join((table[n][i] if i < len(table[n]) else "") for n in names) + " |")
    return "\n".join(lines) + "\n"


def ablation_rows(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{run: test_perplexity record}`` of an ``lm-ptb-ablation`` result file, in run order."""
    return {r["run"]: r for r in payload["records"] if r.get("measure") == "test_perplexity"}


def ablation_markdown(payload: dict[str, Any]) -> str:
    """The ablation as a table: what each run changes, its validation and test perplexity, its
    gain over the random tree it started from (same learning rate and L2), the share of words
    moved per rebuild in its last learning epoch and the mean J_n per depth at its last rebuild."""
    lines = ["| run | what changes | valid ppl | test ppl | gain over random (test) | words moved per rebuild "
             "(last learning epoch) | J_n at depth 0 / 1 / 2 (last rebuild) |",
             "|---|---|---|---|---|---|---|"]
    for name, rec in ablation_rows(payload).items():
        moved = rec.get("moved_labels_last_epoch")
        j = rec.get("objective_by_depth_last") or {}
        j_text = " / ".join(f"{j[d]:.3f}" for d in sorted(j, key=int)) if j else "-"
        gain = f"{rec['gain_vs_random']:+.1f} (vs {rec['reference_run']})" if name != rec["reference_run"] else "-"
        lines.append(f"| {name} | {rec['what']} | {rec['valid_perplexity']:.1f} | {rec['value']:.1f} | {gain} | "
                     f"{'-' if moved is None else f'{100 * moved:.1f} %'} | {j_text} |")
    return "\n".join(lines) + "\n"


def plot_ablation(payload: dict[str, Any], axes: Sequence[Any],
                  moved_runs: Sequence[str] = ("base", "reassign_5", "reassign_50", "decay_0", "decay_1",
                                               "prior_uniform")) -> None:
    """Left: mean J_n per depth along training, learned tree (base, solid) against the random tree
    it started from (dashed, the same statistics read at the same steps); middle: share of words
    moved at each rebuild for ``moved_runs``; right: each variant's test-perplexity gain over its
    random tree, with the random trees' seed-to-seed spread (2 standard deviations) shaded."""
    rows = ablation_rows(payload)
    colours = plt_colours()
    for run, style in (("base", "-"), ("random_seed0", "--")):
        history = rows.get(run, {}).get("reassignments") or []
        for depth in sorted({d for h in history for d in h["objective_by_depth"]}, key=int):
            axes[0].plot([h["epoch"] for h in history], [h["objective_by_depth"].get(depth, math.nan) for h in history],
                         style, color=colours[int(depth) % len(colours)],
                         label=f"{'learned' if run == 'base' else 'random'}, depth {depth}")
    axes[0].set_xlabel("epoch")
    axes[0].set_ylabel("mass-weighted mean $J_n$")
    axes[0].legend(fontsize=7, ncol=2)
    for run in moved_runs:
        history = rows.get(run, {}).get("reassignments") or []
        if history:
            axes[1].plot([h["epoch"] for h in history], [h["moved_labels"] for h in history], marker=".", label=run)
    axes[1].set_xlabel("epoch")
    axes[1].set_ylabel("share of words moved per rebuild")
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=7)
    variants = [(name, rec) for name, rec in rows.items() if rec.get("variant")]
    axes[2].barh([name for name, _ in variants], [rec["gain_vs_random"] for _, rec in variants])
    spread = next((r for r in payload["records"] if r.get("measure") == "random_seed_spread"), None)
    if spread is not None:
        axes[2].axvspan(-2 * spread["value"], 2 * spread["value"], color="grey", alpha=0.25,
                        label="random seeds: ±2 s.d.")
        axes[2].legend(fontsize=7)
    axes[2].axvline(0, color="black", lw=0.8)
    # a bar or two far off the scale (learning the tree in every epoch) would hide the others:
    # clip the axis and write those values at its edge
    limit = 10.0
    axes[2].set_xlim(-limit, limit)
    for y, (_, rec) in enumerate(variants):
        if abs(rec["gain_vs_random"]) > limit:
            edge = math.copysign(limit, rec["gain_vs_random"])
            axes[2].text(edge * 0.97, y, f"{rec['gain_vs_random']:+.1f}", va="center", fontsize=7,
                         ha="right" if edge > 0 else "left", color="white")
    axes[2].set_xlabel("test ppl gain over random (clipped at ±10)")
    axes[2].invert_yaxis()


def plt_colours() -> list[str]:
    """matplotlib's default colour cycle."""
    import matplotlib.pyplot as plt

    return plt.rcParams["axes.prop_cycle"].by_key()["color"]


def best_epoch_markdown(payload: dict[str, Any], paper_prefix: str | None = None) -> str:
    """Each run's test perplexity after its last epoch and at its best **validation** epoch (early
    stopping, chosen on validation only), with the paper's number (after 4 epochs) beside them."""
    from hsm import paper

    lines = ["| Model | test ppl, last epoch (ours) | best valid epoch (ours) | test ppl there (ours) |"
             + (" perplexity (paper) |" if paper_prefix else ""),
             "|---|---|---|---|" + ("---|" if paper_prefix else "")]
    for run, measures in runs_of(payload).items():
        rec = measures["test_perplexity"]
        best = min(rec["per_epoch"], key=lambda e: e["valid_perplexity"])
        line = f"| {rec['model']} | {rec['value']:.1f} | {best['epoch']} | {best['test_perplexity']:.1f} |"
        if paper_prefix:
            key = f"{paper_prefix}.{_SLUGS.get(run)}.perplexity"
            line += f" {paper.get(key).value:g} |" if key in paper.NUMBERS else " - |"
        lines.append(line)
    return "\n".join(lines) + "\n"
