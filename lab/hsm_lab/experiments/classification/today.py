"""Today's tools on the classification stand-ins: the label-tree libraries a practitioner would
try now, beside fastText with bigrams, in one run on the same splits and the same threads
(experiment ``today-tools``).

* ``omikuji-parabel``: omikuji (Rust) with its defaults, which are Parabel's (Prabhu et al. 2018):
  3 trees of balanced 2-means label clusters, leaves of at most 100 labels, one linear
  classifier (hinge loss, C = 1) per node, beam search of width 10.
* ``omikuji-bonsai``: omikuji with the settings its README gives for Bonsai (Khandagale et al.
  2019): regular (unbalanced) k-means with k = 100, trees at most 3 deep.
* ``napkinxc-plt``, ``napkinxc-hsm``: napkinXC's probabilistic label tree and hierarchical
  softmax over the same hierarchical 2-means label tree (its defaults: logistic node
  classifiers by LIBLINEAR, C = 10); the PLT estimates each label's marginal probability (a
  multi-label model), the HSM a distribution over labels (ICML eq. 1 with a clustered tree).
* ``napkinxc-ovr``: napkinXC's one-vs-rest logistic regressions, the flat reference.
* ``omikuji-parabel-1tree``: Parabel with one tree instead of its ensemble of three.
* ``hsm-sparse-*``: our :class:`hsm.classifiers.sparse_tree.SparseTreeClassifier` on the same TF-IDF rows:
  a softmax over the children of each node with a linear model per node, trained by per-example
  AdaGrad (``sparse_optimizer``) for ``sparse_epochs`` epochs; ``flat`` (one softmax over all labels), ``huffman`` and
  ``kmeans`` (the M-ary Huffman tree, or the balanced k-means label tree, fixed), and
  ``learned-huffman`` / ``learned-kmeans`` (Algorithm 1 from that tree). Its rate is picked from
  ``sparse_lr_grid`` on 10 % of the training rows (once per method, or once for all with
  ``sparse_pick=first``); multi-label rows are trained on all their labels (``sparse_multi_label``).
  Ablations of ours, run only when named in ``methods``: ``refit-huffman`` / ``refit-kmeans``
  (the tree Algorithm 1 learned from that start, then a model trained from zero on it, fixed;
  ``train_seconds`` counts both fits) and ``learned-*-fresh-steps`` / ``learned-*-fresh`` (a
  rebuild restarts the AdaGrad sums, or also zeroes the weights, of every node whose children
  changed). ``ovr``, ``plt-huffman`` and ``plt-kmeans`` are the same model with a logistic
  decision per child instead of the softmax over the children (``node_loss="binary"``: one-vs-rest
  for the flat layer, a probabilistic label tree for a tree), trained on all of a row's labels;
  ``learned-kmeans-fixed-depth`` learns from the k-means tree with Algorithm 3 of the ICML
  supplement, which keeps every label at the start's depth (``refit-kmeans-fixed-depth``: that
  tree, refit). A learned or refit record gives ``labels_moved_from_start``, the share of labels
  whose path differs from the start tree's.
* ``fasttext-bigrams``: fastText (softmax loss, d = 50, ``-wordNgrams 2`` with 2M buckets), the
  learning rate and epochs picked on validation P@1 from {0.1, 0.25, 0.5, 1.0} x {5, 25} (the
  fastText tutorial's cooking setting is lr 1.0, 25 epochs, bigrams).

The label-tree libraries read sparse TF-IDF vectors of unigrams and hashed bigrams
(:mod:`hsm.classifiers.sparse_features`, fitted on the training split); fastText reads the words and makes
its own bigrams. The libraries' settings are their published defaults, not tuned on our data
(only fastText's rate and epochs are picked on a validation split carved from train, as the
chapter's Table 1 does). Every method gets the same ``threads``.

Reported per method and seed: P@1 (the share of test examples whose top label is one of theirs,
as :func:`~.evaluation._precision_recall`), P@5 (hits among the top 5 over 5, averaged over
examples), training wall time (fitting only; the features are built once and timed apart),
prediction wall time per example, and the model's size in bytes. Methods that are deterministic
given their data (``napkinxc-ovr``) run once; omikuji takes no seed (its k-means starts at
random), so its seeds are repeats.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from hsm_lab.experiments import (check_device, check_scale, experiment, option_choice, option_choices, option_floats,
                             option_int, option_ints)
from hsm_lab.results import check_replace, output_path, provenance, read_json_or_none, write_results
from hsm.classifiers.sparse_features import tfidf_features

from hsm_lab.experiments.classification.data import EncodedSplit, _ragged_labels, _subset_rows, encode_data, load_classification_data
from hsm_lab.experiments.classification.peers import _doc_tokens, _fasttext_lines, _package_version, _word_text, run_fasttext
from hsm_lab.experiments.classification.presets import STAND_INS

__all__ = ["ABLATIONS", "DEFAULT_METHODS", "METHOD_NAMES", "SPARSE_METHODS", "TODAY_METHODS", "TodayConfig",
           "precision_at_k", "run_today", "summarise", "today_scale_label", "today_tools", "unavailable_methods"]

#: our rows: :class:`hsm.classifiers.sparse_tree.SparseTreeClassifier` on the same TF-IDF rows, method -> its
#: settings. ``output="refit"``: the tree learned from that start, then a new model trained from
#: zero on it, fixed (is the learned tree itself worse, or its training?). ``changed_nodes``: what
#: a rebuild does to the nodes it changes. ``node_loss="binary"``: the probabilistic label tree's
#: logistic decision per child. ``depth="fixed"``: Algorithm 3 keeps the k-means tree's depth.
SPARSE_METHODS: dict[str, dict[str, str]] = {
    "hsm-sparse-flat": {"output": "flat"},
    "hsm-sparse-huffman": {"output": "tree", "start": "huffman"},
    "hsm-sparse-kmeans": {"output": "tree", "start": "kmeans"},
    "hsm-sparse-learned-huffman": {"output": "learned", "start": "huffman"},
    "hsm-sparse-learned-kmeans": {"output": "learned", "start": "kmeans"},
    "hsm-sparse-refit-huffman": {"output": "refit", "start": "huffman"},
    "hsm-sparse-refit-kmeans": {"output": "refit", "start": "kmeans"},
    "hsm-sparse-learned-huffman-fresh-steps": {"output": "learned", "start": "huffman", "changed_nodes": "fresh_steps"},
    "hsm-sparse-learned-kmeans-fresh-steps": {"output": "learned", "start": "kmeans", "changed_nodes": "fresh_steps"},
    "hsm-sparse-learned-huffman-fresh": {"output": "learned", "start": "huffman", "changed_nodes": "fresh"},
    "hsm-sparse-learned-kmeans-fresh": {"output": "learned", "start": "kmeans", "changed_nodes": "fresh"},
    "hsm-sparse-learned-kmeans-fixed-depth": {"output": "learned", "start": "kmeans", "depth": "fixed"},
    "hsm-sparse-refit-kmeans-fixed-depth": {"output": "refit", "start": "kmeans", "depth": "fixed"},
    "hsm-sparse-ovr": {"output": "flat", "node_loss": "binary"},
    "hsm-sparse-plt-huffman": {"output": "tree", "start": "huffman", "node_loss": "binary"},
    "hsm-sparse-plt-kmeans": {"output": "tree", "start": "kmeans", "node_loss": "binary"},
}
#: every setting of ours a record states, with the classifier's default where a method leaves it out
_SPARSE_DEFAULTS = {"start": "huffman", "node_loss": "softmax", "changed_nodes": "keep", "depth": "free"}


#: method -> (importable module, pip package)
TODAY_METHODS: dict[str, tuple[str, str]] = {
    "fasttext-bigrams": ("fasttext", "fasttext-wheel"),
    "omikuji-parabel": ("omikuji", "omikuji"),
    "omikuji-bonsai": ("omikuji", "omikuji"),
    "napkinxc-plt": ("napkinxc", "napkinxc"),
    "napkinxc-hsm": ("napkinxc", "napkinxc"),
    "napkinxc-ovr": ("napkinxc", "napkinxc"),
    "omikuji-parabel-1tree": ("omikuji", "omikuji"),
    **{method: ("hsm.classifiers.sparse_tree", "hsm") for method in SPARSE_METHODS},
}
#: ours that only answer questions about ours: run when named in ``methods``
ABLATIONS: tuple[str, ...] = (
    "hsm-sparse-refit-huffman", "hsm-sparse-refit-kmeans", "hsm-sparse-learned-huffman-fresh-steps",
    "hsm-sparse-learned-kmeans-fresh-steps", "hsm-sparse-learned-huffman-fresh", "hsm-sparse-learned-kmeans-fresh",
    "hsm-sparse-learned-kmeans-fixed-depth", "hsm-sparse-refit-kmeans-fixed-depth", "hsm-sparse-ovr", "hsm-sparse-plt-huffman", "hsm-sparse-plt-kmeans")
#: the methods run when ``methods`` is not given: the comparison
DEFAULT_METHODS: tuple[str, ...] = tuple(m for m in TODAY_METHODS if m not in ABLATIONS)
#: omikuji hyper-parameters changed from its defaults (the defaults are Parabel's)
OMIKUJI_SETTINGS: dict[str, dict[str, Any]] = {
    "omikuji-parabel": {},
    "omikuji-parabel-1tree": {"n_trees": 1},  # Parabel without its ensemble: what the 3 trees buy
    "omikuji-bonsai": {"cluster_balanced": False, "cluster_k": 100, "max_depth": 3},
}
#: the quick scale: a slice small enough for a run of well under a minute, one seed
QUICK_TODAY: dict[str, Any] = {"train_limit": 2000, "test_limit": 500, "seeds": (0,)}
TOP_K = 5


@dataclass
class TodayConfig:
    data: str = "cooking"
    methods: tuple[str, ...] = DEFAULT_METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    threads: int = 2
    train_limit: int | None = None
    test_limit: int | None = None
    validation_fraction: float = 0.1
    dim: int = 50  #: fastText's embedding dimension (the chapter's d = 50)
    lr_grid: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0)  #: fastText's learning rates
    epoch_grid: tuple[int, ...] = (5, 25)  #: fastText's epochs
    min_df: int = 2  #: TF-IDF: features seen in fewer training documents are dropped
    buckets: int = 2_000_000  #: hashed bigram buckets (fastText's default)
    sparse_lr_grid: tuple[float, ...] = (2.0, 4.0)  #: our classifier's rates
    sparse_epochs: int = 3  #: our classifier's epochs
    sparse_multi_label: str = "all"  #: our classifier on multi-label rows: "all" labels or "sample" one
    sparse_pick: str = "each"  #: our rate picked for "each" method, or once on the "first" and shared
    sparse_optimizer: str = "adagrad"  #: our classifier's optimizer: "adagrad" or "sgd" (fastText's)
    single_seed: tuple[str, ...] = ()  #: methods run with the first seed only (to fit a time budget)


_CASTS: dict[str, Callable[[str, Any], Any]] = {
    "data": lambda k, v: option_choice(k, v, STAND_INS),
    "methods": lambda k, v: option_choices(k, v, tuple(TODAY_METHODS)),
    "seeds": lambda k, v: option_ints(k, v, minimum=0),
    "threads": lambda k, v: option_int(k, v, minimum=1),
    "train_limit": lambda k, v: option_int(k, v, minimum=1, allow_none=True),
    "test_limit": lambda k, v: option_int(k, v, minimum=1, allow_none=True),
    "dim": lambda k, v: option_int(k, v, minimum=1),
    "lr_grid": lambda k, v: option_floats(k, v, positive=True),
    "epoch_grid": lambda k, v: option_ints(k, v, minimum=1),
    "min_df": lambda k, v: option_int(k, v, minimum=1),
    "sparse_lr_grid": lambda k, v: option_floats(k, v, positive=True),
    "sparse_epochs": lambda k, v: option_int(k, v, minimum=1),
    "sparse_multi_label": lambda k, v: option_choice(k, v, ("all", "sample")),
    "sparse_pick": lambda k, v: option_choice(k, v, ("each", "first")),
    "sparse_optimizer": lambda k, v: option_choice(k, v, ("adagrad", "sgd")),
    "single_seed": lambda k, v: option_choices(k, v, tuple(TODAY_METHODS)),
}


def _parse_today(scale: str, options: dict[str, Any]) -> TodayConfig:
    """Options (command-line strings or Python values) -> a config; ValueError naming a bad one."""
    config = TodayConfig()
    if check_scale(scale) == "quick":
        config = replace(config, **QUICK_TODAY)
    updates = {}
    for key, value in options.items():
        if key not in _CASTS:
            raise ValueError(f"unknown option {key!r}; known: {sorted(_CASTS)}")
        updates[key] = _CASTS[key](key, value)
    if len(set(updates.get("seeds", ()))) != len(updates.get("seeds", ())):
        raise ValueError(f"option seeds={options['seeds']!r}: names a seed twice")
    config = replace(config, **updates)
    # a method named here but not run would still be reported as run with one seed
    absent = [m for m in config.single_seed if m not in config.methods]
    if absent:
        raise ValueError(f"option single_seed={options['single_seed']!r}: {', '.join(absent)} not in "
                         f"methods={','.join(config.methods)}, so it would not run; add it to methods or drop it "
                         "from single_seed")
    return config


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def method_available(method: str) -> str | None:
    """None if ``method``'s package can be imported here, else why not and what to install."""
    module, package = TODAY_METHODS[method]
    try:
        __import__(module)
    except ImportError as exc:
        return f"{module} is not installed ({exc}); pip install {package} (extra 'baselines')"
    return None


def unavailable_methods(config: TodayConfig) -> dict[str, str]:
    """Method -> why it cannot run here, for the methods of ``config`` whose package is missing
    (an import, no data read). ValueError, in one line naming the packages and how to install
    them, when none of the methods asked for can run: a run of nothing would write a file of
    skipped records only, after loading the data for nothing."""
    missing = {method: why for method in config.methods if (why := method_available(method))}
    if len(missing) == len(config.methods):
        raise ValueError(f"option methods={','.join(config.methods)}: none of them can run here: "
                         + "; ".join(dict.fromkeys(missing.values())))
    return missing


def _check_keeps_finished(out: Path, runs: Sequence[str], missing: dict[str, str], force: bool) -> None:
    """Refuse (ValueError, before any work) to replace the result file ``out`` when it holds
    finished results of a method this run will not write (not asked for, or its package missing
    here), unless ``force``: a run with fewer methods must not silently drop finished results."""
    if force:
        return
    payload = read_json_or_none(out, "result file")
    if not isinstance(payload, dict) or not isinstance(payload.get("records"), list):
        return
    finished = dict.fromkeys(r["method"] for r in payload["records"]
                             if isinstance(r, dict) and isinstance(r.get("method"), str) and not r.get("skipped"))
    lost = [method for method in finished if method not in runs]
    if not lost:
        return
    why = "; ".join(dict.fromkeys(missing[m] for m in lost if m in missing))
    raise ValueError(f"{out} holds finished results of {', '.join(lost)}, which this run would not write"
                     + (f" ({why})" if why else " (not in methods)")
                     + "; write elsewhere with --out PATH, or pass --force / force=True to replace it")


# ====================================================================================== metrics
def precision_at_k(top: Sequence[Sequence[int]], test: EncodedSplit, k: int) -> float:
    """P@k in %: the number of an example's top ``k`` predicted labels that are among its gold
    labels, over ``k``, averaged over examples. A method that returns fewer than ``k`` labels
    scores the missing ones as misses (the denominator stays ``k``), so P@1 is
    :func:`~.evaluation._precision_recall`'s."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    gold = test.gold_sets()
    if len(top) != len(gold):
        raise ValueError(f"{len(top)} predictions for {len(gold)} test examples: predict every example")
    hits = [len(set(np.asarray(row[:k]).tolist()) & set(g.tolist())) for row, g in zip(top, gold)]
    return 100.0 * float(np.mean(hits)) / k


def _scores(top: Sequence[Sequence[int]], test: EncodedSplit) -> dict[str, float]:
    return {"p_at_1": precision_at_k(top, test, 1), "p_at_5": precision_at_k(top, test, TOP_K)}


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# ====================================================================================== data
def _label_split(texts: Any, labels: Any, num_labels: int) -> EncodedSplit:
    """The gold labels of a split, with empty documents: what the scores and fastText's file need."""
    values, offsets = _ragged_labels(labels)
    return EncodedSplit(np.zeros(0, np.int64), np.zeros(len(texts) + 1, np.int64), values, offsets, num_labels)


@dataclass
class _Features:
    """Both splits as TF-IDF rows (the label-tree libraries' input) and their gold labels."""

    x_train: sp.csr_matrix
    x_test: sp.csr_matrix
    train: EncodedSplit
    test: EncodedSplit
    seconds: float


def _tfidf(data: Any, config: TodayConfig) -> _Features:
    """Unigrams and hashed bigrams (:func:`~.data.encode_data`), TF-IDF fitted on train
    (:func:`hsm.classifiers.sparse_features.tfidf_features`); timed once for every method."""
    start = time.perf_counter()
    vocab, train, test = encode_data(data, ngrams=2, buckets=config.buckets)
    weights = tfidf_features(train.values, train.offsets, len(vocab) + config.buckets, min_df=config.min_df)
    x_train = weights.transform(train.values, train.offsets)
    x_test = weights.transform(test.values, test.offsets)
    return _Features(x_train, x_test, train, test, time.perf_counter() - start)


# ====================================================================================== methods
def _predict_rows(x: sp.csr_matrix) -> list[list[tuple[int, float]]]:
    return [list(zip(x.indices[a:b].tolist(), x.data[a:b].tolist())) for a, b in zip(x.indptr[:-1], x.indptr[1:])]


def _run_omikuji(method: str, feats: _Features, config: TodayConfig, workdir: Path) -> dict[str, Any]:
    """omikuji on an Extreme Classification Repository file (written once per run, not timed)."""
    import omikuji

    path = workdir / "omikuji-train.txt"
    if not path.exists():
        _write_xc_file(path, feats.x_train, feats.train)
    hp = omikuji.Model.default_hyper_param()
    for key, value in OMIKUJI_SETTINGS[method].items():
        setattr(hp, key, value)
    log = workdir / "omikuji.log"
    with _library_output_to(log):
        start = time.perf_counter()
        try:
            model = omikuji.Model.train_on_data(str(path), hp, n_threads=config.threads)
        except RuntimeError as exc:  # its reason is in its log, which the exception does not carry
            lines = [line for line in log.read_text(errors="replace").splitlines() if "Examples" not in line]
            raise RuntimeError(f"{method}: {exc}; omikuji said: {' | '.join(lines[-3:])}") from None
        train_seconds = time.perf_counter() - start
        model.save(str(workdir / method))  # as trained (sparse weights): its size on disk
        # dense weight vectors where over 10 % of them are non-zero: what omikuji's own `test`
        # command does before predicting (its --max_sparse_density default), about 30 % faster
        start = time.perf_counter()
        model.densify_weights(0.1, n_threads=config.threads)
        train_seconds += time.perf_counter() - start
        rows = _predict_rows(feats.x_test)
        model.init_prediction_thread_pool(config.threads)
        start = time.perf_counter()
        top = _omikuji_predict(model, rows, config.threads)
        predict_seconds = time.perf_counter() - start
    # the hyper-parameters as omikuji holds them (float32: rounded back to what was meant)
    settings = {k: (round(float(v), 6) if isinstance(v, float) else v) for k in dir(hp) for v in [getattr(hp, k)]}
    settings["linear_loss_type"] = omikuji.LossType(settings["linear_loss_type"]).name.lower()
    return {"top": top, "train_seconds": train_seconds, "predict_seconds": predict_seconds,
            "model_bytes": _folder_bytes(workdir / method),
            "settings": {**settings, "beam_size": 10, "max_sparse_density": 0.1},
            "train_seconds_include": "reading its data file and densifying its weights",
            "version": omikuji.__version__}


def _omikuji_predict(model: Any, rows: list[list[tuple[int, float]]], threads: int) -> list[list[int]]:
    """The top labels of every row. omikuji predicts one example per call; its calls release the
    GIL, so ``threads`` Python threads each predict a contiguous share of the rows (the same
    threads as the other libraries' batch prediction)."""
    from concurrent.futures import ThreadPoolExecutor

    def predict(chunk: list[list[tuple[int, float]]]) -> list[list[int]]:
        return [[label for label, _ in model.predict(row, top_k=TOP_K)] for row in chunk]

    bounds = np.linspace(0, len(rows), threads + 1).astype(int)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        parts = list(pool.map(predict, [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]))
    return [top for part in parts for top in part]


@contextlib.contextmanager
def _library_output_to(path: Path) -> Iterator[None]:
    """Send what compiled code writes to the process' stdout and stderr into ``path``: omikuji
    logs every step and draws progress bars there (its logger cannot be turned down), which
    would bury the run's own progress lines and slow it down."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    try:
        with open(path, "ab") as handle:
            os.dup2(handle.fileno(), 1)
            os.dup2(handle.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _write_xc_file(path: Path, x: sp.csr_matrix, labels: EncodedSplit) -> None:
    """The Extreme Classification Repository format: a ``n_examples n_features n_labels`` header,
    then ``l1,l2 f:v f:v ...`` per example (features 0-based). A document with no feature left
    (all its words rarer than ``min_df``) is its labels alone: omikuji refuses a trailing space."""
    with open(path, "w") as handle:
        handle.write(f"{x.shape[0]} {x.shape[1]} {labels.num_labels}\n")
        for row, gold in enumerate(labels.gold_sets()):
            a, b = x.indptr[row], x.indptr[row + 1]
            feats = " ".join(f"{i}:{v:.6g}" for i, v in zip(x.indices[a:b].tolist(), x.data[a:b].tolist()))
            handle.write(" ".join(filter(None, (",".join(map(str, gold.tolist())), feats))) + "\n")


def _run_napkinxc(method: str, feats: _Features, config: TodayConfig, seed: int, workdir: Path) -> dict[str, Any]:
    """napkinXC's PLT, HSM or OVR with its defaults (LIBLINEAR logistic node classifiers, C = 10)."""
    from napkinxc import models

    kind = method.split("-", 1)[1].upper()
    folder = workdir / f"{method}-seed{seed}"
    kwargs: dict[str, Any] = {"threads": config.threads}
    if kind != "OVR":
        kwargs["seed"] = seed
    if kind == "HSM" and bool((feats.train.label_lengths() > 1).any()):
        # napkinXC's HSM is multi-class: on multi-label data each example's labels are weighted
        # 1/|Y| (its option for this case, the expectation of fastText's one sampled label)
        kwargs["pick_one_label_weighting"] = True
    model = getattr(models, kind)(str(folder), **kwargs)
    labels = [g.tolist() for g in feats.train.gold_sets()]
    start = time.perf_counter()
    model.fit(feats.x_train, labels)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    top = model.predict(feats.x_test, top_k=TOP_K)
    predict_seconds = time.perf_counter() - start
    top = [[int(label) for label in row] for row in top]
    settings = {"model": kind, **kwargs, "defaults": "napkinXC's (hierarchical balanced 2-means tree, "
                "max 100 leaves per node, LIBLINEAR logistic, C = 10, weights pruned below 0.1)"}
    return {"top": top, "train_seconds": train_seconds, "predict_seconds": predict_seconds,
            "model_bytes": _folder_bytes(folder), "settings": settings, "version": _package_version("napkinxc")}


def _run_fasttext_bigrams(data: Any, labels: tuple[EncodedSplit, EncodedSplit], config: TodayConfig, seed: int,
                          workdir: Path) -> dict[str, Any]:
    """fastText softmax with bigrams: lr x epochs picked on a validation split of train (seeded
    by ``seed``), then trained on all of train and tested."""
    valid = data.validation_split(config.validation_fraction, seed=seed)
    valid_train = _label_split(valid.train_texts, valid.train_labels, data.num_labels)
    valid_test = _label_split(valid.test_texts, valid.test_labels, data.num_labels)
    train_lines = _fasttext_lines(valid_train, _doc_tokens(valid.train_texts), np.random.default_rng(seed))
    eval_texts = [_word_text(words) for words in _doc_tokens(valid.test_texts)]
    (workdir / f"valid{seed}").mkdir()
    scores: dict[str, float] = {}
    for epochs in config.epoch_grid:
        for lr in config.lr_grid:
            got = run_fasttext(train_lines, eval_texts, valid_test, "softmax", config.dim, lr, epochs, 2, seed,
                               workdir / f"valid{seed}", config.threads)
            scores[f"lr={lr:g},epoch={epochs}"] = got["p_at_1"]
            _log(f"  fasttext-bigrams seed {seed} lr={lr:g} epoch={epochs}: valid P@1 {got['p_at_1']:.2f}")
    best = max(scores, key=lambda key: scores[key])  # the first (fewer epochs, smaller rate) on a tie
    lr, epochs = (float(best.split(",")[0][3:]), int(best.split(",")[1][6:]))
    train, test = labels
    train_lines = _fasttext_lines(train, _doc_tokens(data.train_texts), np.random.default_rng(seed))
    eval_texts = [_word_text(words) for words in _doc_tokens(data.test_texts)]
    (workdir / f"test{seed}").mkdir()
    got = run_fasttext(train_lines, eval_texts, test, "softmax", config.dim, lr, epochs, 2, seed,
                       workdir / f"test{seed}", config.threads, top_k=TOP_K, model_size=True)
    import fasttext

    return {"top": got["top_labels"], "train_seconds": got["train_seconds"], "predict_seconds": got["test_seconds"],
            "model_bytes": got["model_bytes"], "model_bytes_kind": "its float32 arrays",
            "settings": {"loss": "softmax", "dim": config.dim, "lr": lr, "epoch": epochs, "wordNgrams": 2,
                         "bucket": 2_000_000, "minCount": 1, "thread": config.threads},
            "valid_p_at_1": scores,
            "version": getattr(fasttext, "__version__", None) or _package_version("fasttext-wheel")}


# ====================================================================================== the run
def run_today(config: TodayConfig, log: Callable[[str], None] = _log) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every method of ``config.methods`` at every seed on ``config.data``; returns the records
    and a summary of the data (sizes, feature count, feature seconds). A method whose package is
    missing is a ``skipped`` record; ValueError before the data are read when every one is
    (:func:`unavailable_methods`)."""
    missing = unavailable_methods(config)
    data = load_classification_data(config.data)
    full_sizes = {"full_train_examples": len(data.train_texts), "full_test_examples": len(data.test_texts)}
    data = _subset_rows(data, config.train_limit, "train", 0)
    data = _subset_rows(data, config.test_limit, "test", 1)
    labels = (_label_split(data.train_texts, data.train_labels, data.num_labels),
              _label_split(data.test_texts, data.test_labels, data.num_labels))
    feats = None
    if any(not m.startswith("fasttext") and m not in missing for m in config.methods):
        log(f"{config.data}: TF-IDF features of {len(data.train_texts)} training documents ...")
        feats = _tfidf(data, config)
        log(f"{config.data}: {feats.x_train.shape[1]} features, {feats.x_train.nnz} non-zeros in "
            f"{feats.seconds:.1f}s")
    summary = {"data": config.data, "train_examples": len(data.train_texts), "test_examples": len(data.test_texts),
               "num_labels": data.num_labels, "multilabel": data.multilabel,
               "num_features": None if feats is None else int(feats.x_train.shape[1]),
               "train_nonzeros": None if feats is None else int(feats.x_train.nnz),
               "feature_seconds": None if feats is None else feats.seconds, **full_sizes}
    common = {"data": config.data, "threads": config.threads, "train_examples": summary["train_examples"],
              "test_examples": summary["test_examples"]}
    records: list[dict[str, Any]] = []
    picked: dict[str, tuple[float, dict[str, float]]] = {}  # our classifier's rate, per method
    with tempfile.TemporaryDirectory(prefix="hsm-today-") as tmp:
        workdir = Path(tmp)
        for method in config.methods:
            why = missing.get(method)
            if why:
                log(f"{method}: skipped, {why}")
                records.append({"method": method, **common, "skipped": why})
                continue
            seeds = config.seeds[:1] if method == "napkinxc-ovr" or method in config.single_seed else config.seeds
            for seed in seeds:
                log(f"{method} seed {seed} ...")
                if method.startswith("fasttext"):
                    got = _run_fasttext_bigrams(data, labels, config, seed, workdir)
                elif method.startswith("omikuji"):
                    got = _run_omikuji(method, feats, config, workdir)
                elif method.startswith("hsm-sparse"):
                    if config.sparse_pick == "first" and picked and method not in picked:
                        picked[method] = next(iter(picked.values()))
                    got = _run_sparse_tree(method, feats, config, seed, picked)
                else:
                    got = _run_napkinxc(method, feats, config, seed, workdir)
                top = got.pop("top")
                source = ("words (fastText makes its own bigrams)" if method.startswith("fasttext")
                          else f"TF-IDF of unigrams and hashed bigrams (min_df={config.min_df})")
                chosen = ("lr and epoch picked on validation P@1" if method.startswith("fasttext")
                          else "lr picked on validation P@1 (epochs fixed)" if method.startswith("hsm")
                          else "the library's published settings, not tuned on validation")
                record = {"method": method, **common, "seed": seed, "input": source, "settings_chosen": chosen,
                          **_scores(top, labels[1]),
                          "train_seconds": got.pop("train_seconds"),
                          "predict_ms_per_example": 1000.0 * got.pop("predict_seconds") / len(top), **got}
                if method == "napkinxc-ovr":
                    record["seeds_note"] = "deterministic given its data: one run"
                elif method.startswith("omikuji"):
                    record["seeds_note"] = "omikuji takes no seed (random k-means starts): seeds are repeats"
                if method in config.single_seed:
                    record["seeds_note"] = "run with the first seed only, to fit the time budget"
                log(f"{method} seed {seed}: P@1 {record['p_at_1']:.2f} P@5 {record['p_at_5']:.2f} "
                    f"train {record['train_seconds']:.1f}s predict {record['predict_ms_per_example']:.3f} ms/ex "
                    f"model {record['model_bytes'] / 1e6:.1f} MB")
                records.append(record)
                if method.startswith("omikuji"):  # the saved model, kept only to be measured
                    _remove_tree(workdir / method)
    return records, summary


def _run_sparse_tree(method: str, feats: _Features, config: TodayConfig, seed: int,
                     picked: dict[str, tuple[float, dict[str, float]]]) -> dict[str, Any]:
    """Our classifier (:class:`hsm.classifiers.sparse_tree.SparseTreeClassifier`, ``config.sparse_optimizer``,
    ``config.sparse_epochs`` epochs, arity ceil(sqrt(K))) on the libraries' TF-IDF rows. Its rate is picked once per method
    (on the first seed) by P@1 on a seeded 10 % of the training rows, trained on the other 90 %;
    then it is trained on all of train and tested. ``picked`` carries the choice to later seeds."""
    from hsm.assign import moved_fraction
    from hsm.classifiers.sparse_tree import SparseTreeClassifier

    chosen = {**_SPARSE_DEFAULTS, **SPARSE_METHODS[method]}
    output, start = chosen["output"], chosen["start"]
    gold = feats.train.gold_sets()
    num_labels = feats.train.num_labels

    def make(lr: float, output: str = "learned" if output == "refit" else output,
             start: str | Any = start) -> SparseTreeClassifier:
        return SparseTreeClassifier(output=output, start=start, lr=lr, epochs=config.sparse_epochs,
                                    threads=config.threads, optimizer=config.sparse_optimizer,
                                    multi_label=config.sparse_multi_label, node_loss=chosen["node_loss"],
                                    changed_nodes=chosen["changed_nodes"], depth=chosen["depth"], seed=seed)

    if method not in picked and len(config.sparse_lr_grid) == 1:
        picked[method] = (config.sparse_lr_grid[0], {})  # nothing to choose: no validation fit
    if method not in picked:
        n = feats.x_train.shape[0]
        order = np.random.default_rng(seed).permutation(n)
        held, kept = np.sort(order[: n // 10]), np.sort(order[n // 10:])
        scores: dict[str, float] = {}
        for lr in config.sparse_lr_grid:
            clf = make(lr).fit(feats.x_train[kept], [gold[i] for i in kept], num_labels=num_labels)
            top = clf.predict(feats.x_train[held], k=1).labels[:, 0]
            scores[f"lr={lr:g}"] = 100.0 * float(np.mean([t in gold[i] for t, i in zip(top, held)]))
            _log(f"  {method} lr={lr:g}: valid P@1 {scores[f'lr={lr:g}']:.2f}")
            del clf
        best = max(scores, key=lambda key: scores[key])  # the smaller rate on a tie
        picked[method] = (float(best[3:]), scores)
    lr, scores = picked[method]
    clf = make(lr)
    begin = time.perf_counter()
    clf.fit(feats.x_train, gold, num_labels=num_labels)
    learn_seconds = time.perf_counter() - begin
    if output == "refit":  # the learned tree, fixed, and a model trained from zero on it
        learned_tree, start_tree = clf.tree, clf.start_tree
        del clf
        clf = make(lr, output="tree", start=learned_tree)
        clf.fit(feats.x_train, gold, num_labels=num_labels)
        clf.start_tree = start_tree
    train_seconds = time.perf_counter() - begin
    begin = time.perf_counter()
    top = clf.predict(feats.x_test, k=TOP_K).labels
    predict_seconds = time.perf_counter() - begin
    tree = clf.tree
    nonzero = int(np.count_nonzero(clf.weight))
    return {"top": top.tolist(), "train_seconds": train_seconds, "predict_seconds": predict_seconds,
            "model_bytes": clf.model_bytes(), "model_bytes_kind": "dense float32 arrays",
            "nonzero_weights": nonzero, "sparse_model_bytes": 8 * nonzero + int(clf.bias.nbytes),
            "settings": {"output": output, "start": start, "arity": None if tree is None else tree.arity,
                         "optimizer": config.sparse_optimizer, "lr": lr, "epochs": config.sparse_epochs,
                         "multi_label": config.sparse_multi_label, "threads": config.threads,
                         "rebuilds": clf.rebuilds if output in ("learned", "refit") else 0,
                         "node_loss": chosen["node_loss"], "changed_nodes": chosen["changed_nodes"],
                         "depth": chosen["depth"],
                         "prediction": "exact (every label's log-probability)"},
            "valid_p_at_1": scores,
            "mean_depth": None if tree is None else float(tree.depths[feats.test.label_values].mean()),
            "start_mean_depth": (None if clf.start_tree is None
                                 else float(clf.start_tree.depths[feats.test.label_values].mean())),
            "moved_labels_last_rebuild": (clf.history.rebuilds[-1].moved_labels if clf.history.rebuilds else None),
            # the share of labels whose path (nodes and slots) differs from the start tree's
            "labels_moved_from_start": (None if output not in ("learned", "refit")
                                        else moved_fraction(clf.start_tree, tree)),
            **({"learn_seconds": learn_seconds} if output == "refit" else {})}


#: how each method is named in the book's tables
METHOD_NAMES: dict[str, str] = {
    "omikuji-parabel": "Parabel (omikuji, 3 trees)",
    "omikuji-parabel-1tree": "Parabel, 1 tree (omikuji)",
    "omikuji-bonsai": "Bonsai (omikuji)",
    "napkinxc-plt": "PLT (napkinXC)",
    "napkinxc-hsm": "HSM, k-means tree (napkinXC)",
    "napkinxc-ovr": "one-vs-rest (napkinXC)",
    "fasttext-bigrams": "fastText, bigrams",
    "hsm-sparse-flat": "ours, flat softmax",
    "hsm-sparse-huffman": "ours, Huffman tree",
    "hsm-sparse-kmeans": "ours, k-means tree",
    "hsm-sparse-learned-huffman": "ours, learned from Huffman",
    "hsm-sparse-learned-kmeans": "ours, learned from k-means",
    "hsm-sparse-refit-huffman": "ours, learned from Huffman, refit",
    "hsm-sparse-refit-kmeans": "ours, learned from k-means, refit",
    "hsm-sparse-learned-huffman-fresh-steps": "ours, learned from Huffman, fresh steps",
    "hsm-sparse-learned-kmeans-fresh-steps": "ours, learned from k-means, fresh steps",
    "hsm-sparse-learned-huffman-fresh": "ours, learned from Huffman, fresh nodes",
    "hsm-sparse-learned-kmeans-fresh": "ours, learned from k-means, fresh nodes",
    "hsm-sparse-learned-kmeans-fixed-depth": "ours, learned from k-means, depth kept",
    "hsm-sparse-refit-kmeans-fixed-depth": "ours, learned from k-means, depth kept, refit",
    "hsm-sparse-ovr": "ours, one-vs-rest",
    "hsm-sparse-plt-huffman": "ours, PLT on the Huffman tree",
    "hsm-sparse-plt-kmeans": "ours, PLT on the k-means tree",
}


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method (in the order met): mean P@1 and P@5 over its runs, the spread of P@1 (max -
    min), the number of runs, mean train seconds, mean predict ms per example, mean model MB."""
    out: dict[str, dict[str, Any]] = {}
    for method in dict.fromkeys(r["method"] for r in records if not r.get("skipped")):
        runs = [r for r in records if r["method"] == method and not r.get("skipped")]
        p1 = np.array([r["p_at_1"] for r in runs])
        out[method] = {"p_at_1": float(p1.mean()), "p_at_5": float(np.mean([r["p_at_5"] for r in runs])),
                       "spread": float(p1.max() - p1.min()), "runs": len(runs),
                       "train_seconds": float(np.mean([r["train_seconds"] for r in runs])),
                       "predict_ms": float(np.mean([r["predict_ms_per_example"] for r in runs])),
                       "model_mb": float(np.mean([r["model_bytes"] for r in runs])) / 1e6}
    return out


def today_scale_label(scale: str, config: TodayConfig, full_train: int | None = None,
                      full_test: int | None = None, ran: Sequence[str] | None = None) -> str:
    """``scale`` alone, or ``"full, reduced: ..."`` naming what ran on less than everything: a
    train or test slice (against the split's ``full_train``/``full_test`` sizes where given),
    methods run with one seed, fewer than three seeds, a fastText grid cut down.

    A limit counts only where it cut the split: ``train_limit=10**9`` on a split of 15,000 rows
    ran every row, so it is no reduction (and a limit named is the number of rows used). ``ran``
    (default every method of ``config``) are the methods that ran: one that was skipped is named
    nowhere in the label."""
    def of(n: int | None, what: str) -> str:
        return "" if n is None else f" of {n:,} {what}"

    def cut(limit: int | None, full: int | None) -> bool:
        return limit is not None and (full is None or limit < full)

    ran = tuple(config.methods if ran is None else ran)
    reduced = []
    if cut(config.train_limit, full_train):
        reduced.append(f"train_limit={config.train_limit}{of(full_train, 'training examples')}")
    elif cut(config.test_limit, full_test) and full_train is not None:
        reduced.append(f"all {full_train:,} training examples")
    if cut(config.test_limit, full_test):
        reduced.append(f"test_limit={config.test_limit}{of(full_test, 'test examples')} (a seeded subset)")
    if len(config.seeds) < 3:
        reduced.append(f"seeds={','.join(map(str, config.seeds))}")
    one_seed = [m for m in config.single_seed if m in ran]
    if one_seed and len(config.seeds) > 1:
        reduced.append("one seed for " + ", ".join(one_seed))
    default = TodayConfig()
    cut_grid = (config.lr_grid, config.epoch_grid) != (default.lr_grid, default.epoch_grid)
    if cut_grid and "fasttext-bigrams" in ran:
        reduced.append(f"fastText grid lr={','.join(f'{v:g}' for v in config.lr_grid)} x "
                       f"epoch={','.join(map(str, config.epoch_grid))}")
    return scale if not reduced else f"{scale}, reduced: " + "; ".join(reduced)


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@experiment("today-tools", "Today's label-tree libraries (omikuji Parabel/Bonsai, napkinXC PLT/HSM/OVR) and "
            "fastText with bigrams on the stand-ins: P@1, P@5, train/predict time, model size; "
            "data=cooking|gutenberg-books; a method whose library is missing is skipped, and a result "
            "file holding its finished results is not replaced without --force",
            "results/classification/today-cooking.json")
def today_tools(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                **options: Any) -> Path:
    """Run every method of ``methods`` (default :data:`DEFAULT_METHODS`) for each seed on ``data`` and write
    ``results/classification/today-<data>[-quick].json`` (under ``hsm-results/`` unless ``out``).
    The libraries run on the CPU: ``device`` must be ``cpu``. ValueError for a bad scale,
    device or option, before any work.

    Missing libraries are found before the data are read. When none of the methods asked for can
    run, ValueError names the packages to install and nothing is written. Otherwise the others
    run, and each missing one is a ``skipped`` record saying what to install. A result file at
    ``out`` that holds finished results of a method this run will not write (not in ``methods``,
    or its library missing here) is not replaced: ValueError, before any work, unless ``force``.
    Write elsewhere with ``out``, or install the library and run again."""
    config = _parse_today(scale, options)
    if check_device(device) != "cpu":
        raise ValueError(f"device {device!r}: the libraries compared here run on the CPU only; use --device cpu")
    suffix = "" if scale == "full" else "-quick"
    out = output_path(f"results/classification/today-{config.data}{suffix}.json", out)
    check_replace(out, scale, force)
    missing = unavailable_methods(config)
    _check_keeps_finished(out, [m for m in config.methods if m not in missing], missing, force)
    start = time.perf_counter()
    os.environ.setdefault("OMP_NUM_THREADS", str(config.threads))
    records, summary = run_today(config)
    ran = [m for m in config.methods if m not in missing]
    prov = provenance(config=asdict(config), wall_time_s=time.perf_counter() - start,
                      scale=today_scale_label(scale, config, summary["full_train_examples"],
                                              summary["full_test_examples"], ran))
    prov["data_summary"] = summary  # sizes, TF-IDF feature count and the seconds it took (once for all)
    if missing:
        prov["skipped_methods"] = missing  # what to install to run them
    return write_results(out, records, prov, force=force)
