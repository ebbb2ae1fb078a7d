"""Schuurmans & Frasincar (SAC 2020): BiLSTM with a flat softmax against a two-level hierarchical
softmax over the natural class taxonomy, Tables 1-4 (TREC, 20NG, R8, R52), plus a learned tree.

``python -m hsm run taxonomy-tables -o data=trec|20ng|r8|r52 [--scale quick|full]`` writes
``results/taxonomy/<data>.json``: per seed and model (``flat``, ``hierarchical`` = the taxonomy,
``learned`` = a depth-2 tree learned with Algorithm 1 / Algorithm 3 from a random start), the
test macro-F1 / macro-precision / macro-recall / micro-accuracy of the epoch with the best
validation macro-F1, and for the learned tree the adjusted Rand index between its top-level split
of the classes and the taxonomy's categories.

Departures from the paper, all forced by the hardware the results were produced on (2 CPU cores,
no GPU, no network):

* no GloVe 6B-300d (cannot be downloaded): ``embeddings=fasttext`` (the full preset) initialises
  the embeddings with 300-d fastText skip-gram vectors trained here on the training documents plus
  the first ``gutenberg_tokens`` tokens of the mirror's Gutenberg books (:func:`glove_standin_vectors`),
  stand-ins for GloVe; ``embeddings=random`` is the lower reference (and the quick default, which
  needs no fastText);
* model selection on one stratified 10 % validation split carved from train, not 4-fold CV, and
  no grid over h_dim / bidirectionality: a BiLSTM with the sizes the paper selected (150, R52 100);
* ``max_tokens=auto`` (the full preset for 20NG, R8, R52) truncates every document to the
  smallest length that keeps >= ``token_share`` (95 %) of the training split's tokens
  (:func:`token_cap_for_share`; the kept shares of train and test are in the result file);
  ``max_tokens=all`` keeps whole documents (the full preset for TREC, whose questions are short);
  at most ``max_epochs`` epochs with early stopping on validation macro-F1 (patience ``patience``);
* ``length_buckets=B`` (off by default) forms batches of similar length (:func:`_batches`), which the
  paper does not describe (it removes padding steps; a packed LSTM on the CPU gains little from it);
* the embeddings use SparseAdam (Adam for sparse gradients, same rate 1e-3): dense Adam over a
  20k x d embedding costs more than the LSTM on these CPUs; everything else is Adam, lr 1e-3,
  batch size 10, dropout 0.5, as in the paper.
"""
from __future__ import annotations

import copy
import itertools
import json
import math
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from hsm_lab import paper
from hsm_lab.config import configure_threads, seed_everything
from hsm_lab.experiments import (check_device, check_scale, experiment, option_bool, option_choices, option_float,
                             option_int, option_ints)
from hsm_lab.output_layers import output_layer
from hsm.layers import HierarchicalSoftmax
from hsm_lab.results import (RESTORE_ERRORS, ResumableParts, check_replace, checkpoint_interval, load_checkpoint,
                         make_record, output_path, provenance, restore_error, save_checkpoint, write_progress,
                         write_results)
from hsm.sequence_models import LSTMTextClassifier, TextVocabulary, classification_metrics, encode_texts
from hsm.training import TreeLearner, train_epoch
from hsm.tree import Tree

__all__ = ["DATASETS", "below_token_share", "build_output_layer", "estimate_epoch_seconds", "glove_standin_vectors", "headline_file",
           "kept_token_share", "pretrained_rows", "resolve_max_tokens", "token_cap_for_share", "top_level_groups",
           "train_one", "run_taxonomy_tables", "scale_label"]

#: data option -> (loader name, paper table number, paper key, hidden size the paper selected)
DATASETS = {
    "trec": ("trec-fine", 1, "trec", 150),
    "20ng": ("20ng", 2, "20ng", 150),
    "r8": ("r8", 3, "r8", 150),
    "r52": ("r52", 4, "r52", 100),
}
MODELS = ("flat", "hierarchical", "learned")
EMBEDDINGS = ("random", "fasttext")
#: the loss's class weights: ``none`` (the paper's cross-entropy) or ``balanced`` (each example's
#: negative log-likelihood times N / (C n_c) of its class c, scikit-learn's "balanced" weights)
CLASS_WEIGHTS = ("none", "balanced")
#: ``adam+sparseadam``: Adam for the dense parameters and SparseAdam for the embedding, one rate;
#: ``adam``: one Adam over every parameter, the embedding's gradient dense
OPTIMIZERS = ("adam+sparseadam", "adam")
#: what the result file says about the fastText vectors
GLOVE_STANDIN_NOTE = ("fastText skip-gram vectors trained here (training documents + Gutenberg prefix): "
                      "stand-ins for the paper's GloVe 6B-300d, which cannot be downloaded on this machine")


def scale_label(scale: str, cfg: dict[str, Any], longest_document: int | None = None,
                selection: str | None = None) -> str:
    """The scale label of one table's run: ``quick``, or ``full`` followed by every way the run
    departs from the paper's protocol (GloVe 6B-300d embeddings, 4-fold cross-validation of the
    hidden size, early stopping, whole documents): the embeddings (our stand-ins, or the random-init
    lower reference), the one validation split, the epoch budget, the document cap, length-bucketed
    batches, and fewer seeds, a capped vocabulary or a subset of the models where the settings ask
    for them.

    ``cfg`` is a run's settings with the resolved cap (``max_tokens_used`` and
    ``kept_token_share_train`` from :func:`_prepare`); a cap at or above ``longest_document``, or
    one that keeps every training token, reads "whole documents". ``selection`` replaces the
    words on model selection (one validation split, no cross-validation) when a run does select."""
    if scale != "full":
        return scale
    dim = cfg["embed_dim"]
    if cfg.get("embeddings", "random") == "fasttext":
        parts = [f"GloVe stand-ins: {dim}-d fastText vectors trained on the training documents and "
                 f"{cfg['gutenberg_tokens']:,} Gutenberg tokens"]
    elif dim == 300:  # the paper's width: the full path's lower reference
        parts = [f"lower reference: {dim}-d random-init embeddings, not the paper's GloVe"]
    else:
        parts = [f"reduced: {dim}-d random-init embeddings, not the paper's GloVe"]
    parts.append(selection or f"one {100 * cfg['valid_fraction']:.0f} % validation split, no 4-fold CV")
    if not cfg.get("bidirectional", True):
        parts.append("a one-directional LSTM")
    parts.append(f"at most {cfg['max_epochs']} epochs (patience {cfg['patience']})")
    cap = cfg.get("max_tokens_used", cfg.get("max_tokens"))
    share = cfg.get("kept_token_share_train")
    whole = (not isinstance(cap, int) or (share is not None and share >= 1.0)
             or (longest_document is not None and cap >= longest_document))
    parts.append("whole documents" if whole else f"documents cut at {cap} tokens"
                 + (f" ({100 * share:.0f} % of the training tokens kept)" if share else ""))
    if cfg.get("length_buckets"):
        parts.append(f"batches drawn from {cfg['length_buckets']} buckets of similar length")
    for key, what in (("train_limit", "training"), ("test_limit", "test")):
        if cfg.get(key):
            parts.append(f"first {cfg[key]:,} {what} documents")
    if len(cfg["seeds"]) < 3:
        parts.append(f"{len(cfg['seeds'])} seed" + ("s" if len(cfg["seeds"]) != 1 else ""))
    if cfg.get("max_vocab"):
        parts.append(f"vocabulary capped at {cfg['max_vocab']:,} words")
    if tuple(cfg["models"]) != MODELS:
        parts.append("models: " + ", ".join(cfg["models"]))
    if cfg.get("class_weights", "none") != "none":
        parts.append("class-balanced loss (weights N / (C n_c)), not the paper's")
    if cfg.get("optimizer", OPTIMIZERS[0]) != OPTIMIZERS[0]:
        parts.append("one Adam over every parameter (dense embedding gradients)")
    return "full, " + "; ".join(parts)


def paper_protocol(cfg: dict[str, Any]) -> bool:
    """Whether a run trains as the paper does (plain cross-entropy, Adam): only such runs stand for
    the paper's numbers; the variants are experiments about them."""
    return cfg.get("class_weights", "none") == "none" and cfg.get("optimizer", OPTIMIZERS[0]) == OPTIMIZERS[0]


def kept_token_share(lengths: np.ndarray, cap: int) -> float:
    """Share of all tokens kept when every document is truncated to its first ``cap`` tokens."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    total = int(lengths.sum())
    return 1.0 if total == 0 else float(np.minimum(lengths, cap).sum()) / total


def below_token_share(cfg: dict[str, Any]) -> bool:
    """Whether a run's document cap kept less of the training tokens than its ``token_share`` (the
    95 % rule of the full path): a run at a reduced document length. ``cfg`` is a result file's
    configuration; one without a recorded share (the reduced first runs) is not judged here."""
    share = cfg.get("kept_token_share_train")
    return share is not None and share < cfg.get("token_share", 0.95)


def token_cap_for_share(lengths: np.ndarray, share: float = 0.95) -> int:
    """The smallest cap ``L`` with ``sum(min(len_i, L)) >= share * sum(len_i)``: truncating every
    document to ``L`` tokens keeps at least ``share`` of the tokens (the full preset keeps >= 95 % of the
    tokens of 20NG / R8 / R52, computed on the training split; notebooks/taxonomy_softmax.md). Binary search: the kept count is
    non-decreasing in ``L`` and reaches the total at ``L = max(len_i)``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or lengths.size == 0 or (lengths < 0).any():
        raise ValueError("lengths must be a non-empty 1-d array of non-negative document lengths")
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share}")
    low, high = 1, max(int(lengths.max()), 1)
    while low < high:
        mid = (low + high) // 2
        # the share as kept_token_share computes it (kept / total), not kept >= share * total:
        # the two round differently (7 / 100 == 0.07, but 0.07 * 100 > 7)
        if kept_token_share(lengths, mid) >= share:
            high = mid
        else:
            low = mid + 1
    return low


def resolve_max_tokens(setting: int | str, train_lengths: np.ndarray, share: float) -> int:
    """``max_tokens`` as an int: ``auto`` -> :func:`token_cap_for_share` of the training lengths,
    ``all`` -> the longest training document (whole documents; a longer test document is cut there)."""
    if setting == "auto":
        return token_cap_for_share(train_lengths, share)
    if setting == "all":
        return max(int(np.max(train_lengths)), 1)
    return int(setting)


def glove_standin_vectors(data_name: str, dataset, dim: int = 300, gutenberg_tokens: int = 5_000_000,
                          epochs: int = 5) -> tuple[list[str], np.ndarray]:
    """``(words, vectors)``: ``dim``-d fastText skip-gram vectors (negative sampling, whole words)
    for every type of ``dataset``'s training split, trained on its training documents followed by
    the first ``gutenberg_tokens`` tokens of the mirror's Gutenberg books (lower-cased, in
    :func:`hsm_lab.data.gutenberg.book_order`; 0: the training documents only). Our stand-in for the
    GloVe 6B-300d vectors of Schuurmans & Frasincar, which cannot be downloaded here.

    Reuses :func:`hsm_lab.experiments.lm.embeddings.fasttext_embeddings` (cached under
    ``hsm_lab.config.cache_dir()/derived/fasttext``, atomic writes): the corpus is handed to it as the
    ids of one vocabulary = the training types plus ``<unk>``, to which every Gutenberg word outside
    the training vocabulary maps (it never needs a vector: the model only looks up training types).
    """
    from hsm_lab.experiments.lm.embeddings import fasttext_embeddings

    if gutenberg_tokens < 0:
        raise ValueError(f"gutenberg_tokens must be >= 0, got {gutenberg_tokens}")
    texts = dataset.train_texts
    counts = np.bincount(np.asarray(texts.values, dtype=np.int64), minlength=len(texts.vocab))
    train_types = np.flatnonzero(counts)
    words = [texts.vocab[i] for i in train_types] + ["<unk>"]
    if "<unk>" in words[:-1]:
        raise ValueError("the training vocabulary already contains '<unk>'")
    unk = len(words) - 1
    new_id = np.full(len(texts.vocab), unk, dtype=np.int64)
    new_id[train_types] = np.arange(len(train_types))
    parts = [new_id[np.asarray(texts.values, dtype=np.int64)]]
    if gutenberg_tokens:
        from hsm_lab.data.gutenberg import tokenized_books

        # the first books of the fixed book order until the budget; 10 books (~0.5M tokens) are
        # enough for small budgets, so quick runs tokenize little
        books = tokenized_books(10 if gutenberg_tokens <= 400_000 else None, lowercase=True, progress=False)
        ids = books.ids[:gutenberg_tokens]
        index = {w: i for i, w in enumerate(words[:-1])}
        of_type = np.array([index.get(w, unk) for w in books.types], dtype=np.int64)
        parts.append(of_type[ids])
    corpus_ids = np.concatenate(parts)
    corpus = SimpleNamespace(name=f"taxonomy-{data_name}-g{gutenberg_tokens}", train=torch.from_numpy(corpus_ids),
                             vocab=words, vocab_size=len(words))
    vectors = fasttext_embeddings(corpus, dim=dim, epochs=epochs, loss="ns", threads=torch.get_num_threads())
    return words[:-1], vectors[:-1]


def pretrained_rows(vocab: TextVocabulary, words: list[str], vectors: np.ndarray, seed: int) -> tuple[torch.Tensor, float]:
    """The embedding matrix of ``vocab`` from ``(words, vectors)`` and the share of the model's
    words found there; rows of words without a vector (and ``<unk>``) are drawn from a normal with
    the vectors' own standard deviation, ``<pad>`` is zero."""
    index = {w: i for i, w in enumerate(words)}
    std = float(vectors.std()) if vectors.size else 1.0
    rows = np.random.default_rng(seed).normal(0.0, std, size=(len(vocab), vectors.shape[1])).astype(np.float32)
    rows[0] = 0.0
    found = 0
    for model_id, word in enumerate(vocab.words[2:], start=2):
        i = index.get(word)
        if i is not None:
            rows[model_id] = vectors[i]
            found += 1
    return torch.from_numpy(rows), found / max(len(vocab) - 2, 1)


def learned_tree_start(num_labels: int, seed: int, label_names: list[str] | None = None) -> Tree:
    """Random depth-2 tree with arity ``ceil(sqrt(K))`` (the start of the learned tree)."""
    arity = max(2, math.ceil(math.sqrt(num_labels)))
    return Tree.random(num_labels, arity, depth=2, seed=seed, label_names=label_names)


def build_output_layer(kind: str, in_features: int, label_names: list[str], taxonomy: dict[str, list[str]] | None,
                       seed: int = 0) -> nn.Module:
    """``flat``: :class:`FlatSoftmax`; ``hierarchical``: :class:`HierarchicalSoftmax` over
    ``Tree.from_taxonomy`` (Schuurmans & Frasincar's two-level softmax); ``learned``: a HierarchicalSoftmax over
    a random depth-2 tree, to be learned with a :class:`TreeLearner`."""
    if kind == "flat":
        return output_layer("flat", in_features, len(label_names))
    if kind == "hierarchical":
        if taxonomy is None:
            raise ValueError("the hierarchical model needs a taxonomy")
        return output_layer("tree", in_features, len(label_names), tree=Tree.from_taxonomy(taxonomy, label_names))
    if kind == "learned":
        return output_layer("tree", in_features, len(label_names),
                            tree=learned_tree_start(len(label_names), seed, label_names))
    raise ValueError(f"unknown model {kind!r}; known: {MODELS}")


def top_level_groups(tree: Tree) -> np.ndarray:
    """For each label, the root's child its path goes through (the tree's top-level split)."""
    return np.array([tree.path(label)[0][1] for label in range(tree.num_labels)])


def category_ids(label_names: list[str], taxonomy: dict[str, list[str]]) -> np.ndarray:
    names = list(taxonomy)
    of = {label: names.index(cat) for cat, labels in taxonomy.items() for label in labels}
    return np.array([of[name] for name in label_names])


def _batches(tokens: torch.Tensor, labels: torch.Tensor, batch_size: int, gen: torch.Generator | None,
             bucket: int = 0):
    """Batches of ``batch_size`` documents in random order (``gen``; None: in order), each trimmed to
    its longest document. ``bucket`` > 0: the shuffled documents are cut into pools of ``bucket``
    batches, each pool sorted by length before it is cut into batches, and the batches shuffled
    again, so a batch holds documents of similar length: a batch-10 LSTM step costs about as many
    time steps as its longest document, and on 20NG (lengths up to 12k tokens, mean 269) random
    batches pay several times the tokens they hold. Every document is still seen once per epoch."""
    n = len(labels)
    order = torch.randperm(n, generator=gen) if gen is not None else torch.arange(n)
    if bucket > 0:
        lengths = (tokens != 0).sum(1)
        pool = bucket * batch_size
        pieces = []
        for start in range(0, n, pool):
            chunk = order[start:start + pool]
            chunk = chunk[torch.argsort(lengths[chunk], stable=True)]
            pieces += list(chunk.split(batch_size))
        shuffle = torch.randperm(len(pieces), generator=gen) if gen is not None else torch.arange(len(pieces))
        index_batches = [pieces[i] for i in shuffle.tolist()]
    else:
        index_batches = list(order.split(batch_size))
    for idx in index_batches:
        x = tokens[idx]
        width = int((x != 0).sum(1).max().clamp_min(1))  # trim the padding of this batch
        yield x[:, :width], labels[idx]


@torch.no_grad()
def _predict(model: nn.Module, layer: nn.Module, tokens: torch.Tensor, batch_size: int = 256,
             device: torch.device | str = "cpu") -> np.ndarray:
    model.eval()
    layer.eval()
    preds = [layer.log_prob(model(x.to(device))).argmax(1).cpu()
             for x, _ in _batches(tokens, torch.zeros(len(tokens), dtype=torch.long), batch_size, None)]
    return torch.cat(preds).numpy()


class _TwoOptimizers:
    """Adam for the dense parameters and SparseAdam for the (sparse) embedding, stepped together,
    so :func:`hsm.training.train_epoch` can drive them as one optimiser; with no sparse parameter
    (``optimizer=adam``: the embedding's gradient dense) it holds the one Adam alone."""

    def __init__(self, dense: list[nn.Parameter], sparse: list[nn.Parameter], lr: float) -> None:
        self.optimizers = [torch.optim.Adam(dense, lr=lr)] + ([torch.optim.SparseAdam(sparse, lr=lr)] if sparse else [])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()


class _ClassWeightedLoss(nn.Module):
    """The output layer with its training loss weighted per class: the mean of each example's
    negative log-likelihood times its class's weight, over the weights (``weight`` of
    ``nn.CrossEntropyLoss``). Wraps the layer for training only; the layer's statistics (Algorithm
    1) and its parameters are the layer's own."""

    def __init__(self, layer: nn.Module, weights: torch.Tensor) -> None:
        super().__init__()
        self.layer = layer
        self.register_buffer("weights", weights)

    def forward(self, input: torch.Tensor, target: torch.Tensor):
        out = self.layer(input, target)
        w = self.weights[target]
        return out._replace(loss=-(w * out.output).sum() / w.sum())


def balanced_class_weights(labels: torch.Tensor, num_labels: int) -> torch.Tensor:
    """N / (C n_c) for each class c with n_c training examples (0 for a class with none)."""
    counts = torch.bincount(labels, minlength=num_labels).double()
    weights = torch.where(counts > 0, len(labels) / (num_labels * counts.clamp(min=1)), torch.zeros_like(counts))
    return weights.float()


def _build(kind: str, data, valid, cfg: dict[str, Any], seed: int, pretrained, device: torch.device):
    """Vocabulary, encoded splits, model, output layer, optimiser and (learned tree) learner of one run."""
    seed_everything(seed)
    cap = cfg["max_tokens_used"]
    vocab = TextVocabulary.from_texts(valid.train_texts, min_count=cfg["min_count"], max_size=cfg["max_vocab"])
    train_x = encode_texts(valid.train_texts, vocab, cap)
    train_y = torch.as_tensor(np.asarray(valid.train_labels), dtype=torch.long)
    if cfg["train_limit"]:
        keep = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(seed))[: cfg["train_limit"]]
        train_x, train_y = train_x[keep], train_y[keep]
    rows, coverage = (None, None) if pretrained is None else pretrained_rows(vocab, *pretrained, seed=seed)
    model = LSTMTextClassifier(len(vocab), cfg["embed_dim"], cfg["hidden_size"],
                               bidirectional=cfg.get("bidirectional", True),
                               dropout=cfg["dropout"], pretrained=rows)
    one_adam = cfg.get("optimizer", OPTIMIZERS[0]) == "adam"
    model.embedding.sparse = not one_adam
    layer = build_output_layer(kind, model.output_size, data.label_names, data.taxonomy, seed=seed)
    model.to(device)
    layer.to(device)
    if one_adam:
        optimizer = _TwoOptimizers(list(model.parameters()) + list(layer.parameters()), [], cfg["lr"])
    else:
        dense = [p for n, p in model.named_parameters() if not n.startswith("embedding")] + list(layer.parameters())
        optimizer = _TwoOptimizers(dense, [model.embedding.weight], cfg["lr"])
    steps_per_epoch = math.ceil(len(train_y) / cfg["batch_size"])
    learner = None
    if kind == "learned":
        learner = TreeLearner(layer, reassign_every=max(steps_per_epoch // cfg["reassign_per_epoch"], 1), algorithm="depth",
                              decay=0.5)  # the committed runs used the statistics decay of 0.5
    return vocab, train_x, train_y, model, layer, optimizer, learner, coverage


def _run_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """What one (seed, model) run depends on: every setting but the lists of seeds and models, so that
    adding a seed or a model reuses the finished runs and the epoch checkpoint of the one going."""
    return {k: v for k, v in cfg.items() if k not in ("seeds", "models")}


def train_one(kind: str, data, valid, cfg: dict[str, Any], seed: int,
              pretrained: tuple[list[str], np.ndarray] | None = None, device: torch.device | str = "cpu",
              checkpoint: Path | str | None = None, checkpoint_seconds: float | None = None) -> dict[str, Any]:
    """Train one model with early stopping on validation macro-F1; test metrics of the best epoch.

    ``cfg["max_tokens_used"]`` is the document cap (an int, see :func:`resolve_max_tokens`);
    ``pretrained`` = ``(words, vectors)`` initialises the embeddings (:func:`pretrained_rows`),
    None leaves them random. ``checkpoint``: a file the run is saved to after every epoch, and within
    an epoch every ``checkpoint_seconds`` of training (default ``HSM_CHECKPOINT_SECONDS``, else 300:
    :func:`hsm_lab.results.checkpoint_interval`), and resumed from (when it was saved by the same
    kind, seed and ``cfg``), so a run stopped mid-way (a time limit, a killed job) loses at most
    those seconds; a resumed run redraws the interrupted epoch's order, goes on at the next batch
    and gives the same model as a run never stopped. The file is removed when the run finishes."""
    device = torch.device(device)
    vocab, train_x, train_y, model, layer, optimizer, learner, coverage = _build(kind, data, valid, cfg, seed,
                                                                                 pretrained, device)
    cap = cfg["max_tokens_used"]
    valid_x = encode_texts(valid.test_texts, vocab, cap)
    valid_y = np.asarray(valid.test_labels)
    test_x = encode_texts(data.test_texts, vocab, cap)
    test_y = np.asarray(data.test_labels)
    initial_tree = layer.tree if kind == "learned" else None
    gen = torch.Generator().manual_seed(seed)
    best: dict[str, Any] = {"valid_f1": -1.0}
    history = []
    bad_epochs = 0
    first_epoch, seconds_before = 1, 0.0
    # within an interrupted epoch: the batches done, their loss sum and count, the order's generator
    step_in_epoch, epoch_loss_sum, epoch_count, epoch_generator = 0, 0.0, 0, None
    interval = checkpoint_interval(checkpoint_seconds) if checkpoint is not None else None
    run_id = {"kind": kind, "seed": seed, "cfg": json.loads(json.dumps(_run_settings(cfg), default=str))}
    saved = None if checkpoint is None else load_checkpoint(checkpoint)
    if saved is not None and saved.get("run") != run_id:
        warnings.warn(f"ignoring checkpoint {checkpoint}: it was saved by another run (kind, seed or settings "
                      "differ); this run starts over", stacklevel=2)
        saved = None
    if saved is not None:
        try:
            model.load_state_dict(saved["model"])
            layer.load_state_dict(saved["layer"])  # installs the saved tree too (a learned tree moves)
            for opt, state in zip(optimizer.optimizers, saved["optimizers"]):
                opt.load_state_dict(state)
            if learner is not None:
                learner.load_state_dict(saved["learner"])
                initial_tree = Tree.from_dict(saved["initial_tree"])
            gen.set_state(saved["generator"])
            torch.set_rng_state(saved["torch_rng"])  # dropout masks continue as if never stopped
            if device.type == "cuda" and saved.get("cuda_rng") is not None:
                torch.cuda.set_rng_state(saved["cuda_rng"], device)
            best, history, bad_epochs = saved["best"], saved["history"], saved["bad_epochs"]
            first_epoch, seconds_before = saved["epoch"] + 1, saved["seconds"]
            if saved.get("step_in_epoch"):  # saved within epoch first_epoch
                step_in_epoch, epoch_generator = saved["step_in_epoch"], saved["epoch_generator"]
                epoch_loss_sum, epoch_count = saved["epoch_loss_sum"], saved["epoch_count"]
        except RESTORE_ERRORS as exc:
            # the model is half loaded by now, so the run stops, naming the file and the fix,
            # rather than training from a mixture
            raise ValueError(f"checkpoint {checkpoint} cannot be resumed ({restore_error(exc)}): delete it and this "
                             f"run starts over") from None
        where = (f"in epoch {first_epoch} after {step_in_epoch} batches" if step_in_epoch
                 else f"after epoch {saved['epoch']}")
        print(f"[{cfg['data']}] {kind} seed {seed}: resuming {where} from {checkpoint}", file=sys.stderr, flush=True)
    trained_layer = layer
    if cfg.get("class_weights", "none") == "balanced":
        trained_layer = _ClassWeightedLoss(layer, balanced_class_weights(train_y, len(data.label_names)).to(device))
    start = time.perf_counter() - seconds_before

    def state(epoch_done: int, **within: Any) -> dict[str, Any]:
        """The checkpoint after ``epoch_done`` whole epochs (and ``within`` the next one, if given)."""
        return {"run": run_id, "epoch": epoch_done, "seconds": time.perf_counter() - start,
                "model": model.state_dict(), "layer": layer.state_dict(),
                "optimizers": [opt.state_dict() for opt in optimizer.optimizers],
                "learner": learner.state_dict() if learner is not None else None,
                "initial_tree": initial_tree.to_dict() if initial_tree is not None else None,
                "generator": gen.get_state(), "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                "best": best, "history": history, "bad_epochs": bad_epochs, **within}

    for epoch in range(first_epoch, cfg["max_epochs"] + 1):
        if learner is not None and epoch > cfg["learn_tree_epochs"]:
            learner.freeze()
        if epoch_generator is not None:  # the interrupted epoch: its order is drawn again
            gen.set_state(epoch_generator)
        order_state = gen.get_state()
        sizes: list[int] = []  # targets per batch of this sitting (each document has its label)
        losses: list[float] = []
        last_save = time.perf_counter()

        def counted(batches):
            for x, y in batches:
                sizes.append(len(y))
                yield x, y

        def on_step(step: int, batch_loss: float, epoch: int = epoch) -> None:
            nonlocal last_save
            losses.append(batch_loss)
            if interval is not None and time.perf_counter() - last_save >= interval:
                done = len(losses)
                save_checkpoint(state(epoch - 1, step_in_epoch=step_in_epoch + done, epoch_generator=order_state,
                                      epoch_loss_sum=epoch_loss_sum + sum(l * n for l, n in zip(losses, sizes)),
                                      epoch_count=epoch_count + sum(sizes[:done])), checkpoint)
                last_save = time.perf_counter()

        batches = _batches(train_x, train_y, cfg["batch_size"], gen, cfg["length_buckets"])
        loss = train_epoch(model, trained_layer, counted(itertools.islice(batches, step_in_epoch, None)),
                           optimizer, learner=learner, device=device, on_step=on_step)
        if step_in_epoch:  # this epoch's first batches ran before the interruption
            loss = (epoch_loss_sum + loss * sum(sizes)) / (epoch_count + sum(sizes))
        step_in_epoch, epoch_loss_sum, epoch_count, epoch_generator = 0, 0.0, 0, None
        valid_metrics = classification_metrics(valid_y, _predict(model, layer, valid_x, device=device))
        history.append({"epoch": epoch, "train_loss": loss, "valid_f1": valid_metrics["f1"],
                        "seconds": time.perf_counter() - start})
        print(f"[{cfg['data']}] {kind} seed {seed} epoch {epoch}: loss {loss:.3f}, valid macro-F1 {valid_metrics['f1']:.1f} "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        if valid_metrics["f1"] > best["valid_f1"]:
            best = {"valid_f1": valid_metrics["f1"], "epoch": epoch,
                    "state": (copy.deepcopy(model.state_dict()), copy.deepcopy(layer.state_dict()),
                              layer.tree if isinstance(layer, HierarchicalSoftmax) else None)}
            bad_epochs = 0
        else:
            bad_epochs += 1
            if bad_epochs >= cfg["patience"]:
                break  # no checkpoint after the last epoch: a checkpoint always has epochs left to run
        if checkpoint is not None and epoch < cfg["max_epochs"]:
            save_checkpoint(state(epoch), checkpoint)
    model.load_state_dict(best["state"][0])
    if best["state"][2] is not None:
        layer.set_tree(best["state"][2])
    layer.load_state_dict(best["state"][1])
    test_pred = _predict(model, layer, test_x, device=device)
    test = classification_metrics(test_y, test_pred)
    out = {"test": test, "best_epoch": best["epoch"], "valid_f1": best["valid_f1"], "history": history,
           "train_seconds": time.perf_counter() - start, "vocab_size": len(vocab), "train_examples": int(len(train_y)),
           "test_f1_per_class": per_class_f1(test_y, test_pred, len(data.label_names)),
           "train_class_counts": torch.bincount(train_y, minlength=len(data.label_names)).tolist()}
    if coverage is not None:
        out["pretrained_coverage"] = coverage
    if kind == "learned" and data.taxonomy is not None:
        from sklearn.metrics import adjusted_rand_score

        cats = category_ids(data.label_names, data.taxonomy)
        out["ari_top_level"] = float(adjusted_rand_score(cats, top_level_groups(layer.tree)))
        out["ari_top_level_initial"] = float(adjusted_rand_score(cats, top_level_groups(initial_tree)))
        out["arity"] = layer.tree.arity
        out["moved_labels"] = [rec.moved_labels for rec in learner.history]
        out["top_level_split"] = {str(g): [data.label_names[i] for i in np.flatnonzero(top_level_groups(layer.tree) == g)]
                                  for g in np.unique(top_level_groups(layer.tree))}
    if checkpoint is not None:
        Path(checkpoint).unlink(missing_ok=True)  # finished: the result is the caller's to keep
    return out


def per_class_f1(y_true: np.ndarray, y_pred: np.ndarray, num_labels: int) -> list[float | None]:
    """F1 (%) of every class id; None for a class absent from both ``y_true`` and ``y_pred`` (macro-F1
    leaves it out, as :func:`hsm.sequence_models.classification_metrics` does)."""
    out: list[float | None] = []
    for c in range(num_labels):
        tp = int(np.sum((y_true == c) & (y_pred == c)))
        true, pred = int(np.sum(y_true == c)), int(np.sum(y_pred == c))
        out.append(None if true == 0 and pred == 0 else 200.0 * tp / (true + pred))
    return out


def _one_choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    picked = option_choices(key, value, choices)
    if len(picked) != 1:
        raise ValueError(f"option {key}={value!r}: name exactly one of {', '.join(choices)}")
    return picked[0]


def _max_tokens_option(key: str, value: Any) -> int | str:
    if value in ("auto", "all"):
        return value
    return option_int(key, value, minimum=1)


#: how each option is parsed and range-checked (ValueError naming the option and its value)
_OPTION_CHECKS = {
    "seeds": lambda k, v: list(option_ints(k, v, minimum=0)),
    "models": lambda k, v: list(option_choices(k, v, MODELS)),
    "embed_dim": lambda k, v: option_int(k, v, minimum=1), "hidden_size": lambda k, v: option_int(k, v, minimum=1),
    "bidirectional": option_bool,
    "max_tokens": _max_tokens_option,  # an int, ``auto`` (keeps >= token_share of the tokens) or ``all``
    "token_share": lambda k, v: option_float(k, v, positive=True, maximum=1.0),
    "max_vocab": lambda k, v: option_int(k, v, minimum=0),  # 0: every training type
    "min_count": lambda k, v: option_int(k, v, minimum=1),
    "embeddings": lambda k, v: _one_choice(k, v, EMBEDDINGS),
    "gutenberg_tokens": lambda k, v: option_int(k, v, minimum=0),
    "embedding_epochs": lambda k, v: option_int(k, v, minimum=1),
    "dropout": lambda k, v: option_float(k, v, minimum=0.0, below=1.0),
    "lr": lambda k, v: option_float(k, v, positive=True), "batch_size": lambda k, v: option_int(k, v, minimum=1),
    "max_epochs": lambda k, v: option_int(k, v, minimum=1), "patience": lambda k, v: option_int(k, v, minimum=1),
    "valid_fraction": lambda k, v: option_float(k, v, positive=True, below=1.0),
    "train_limit": lambda k, v: option_int(k, v, minimum=0),  # 0: no limit
    "test_limit": lambda k, v: option_int(k, v, minimum=0),
    "reassign_per_epoch": lambda k, v: option_int(k, v, minimum=1),
    "length_buckets": lambda k, v: option_int(k, v, minimum=0),  # 0: plain random batches
    "learn_tree_epochs": lambda k, v: option_int(k, v, minimum=0),
    "class_weights": lambda k, v: _one_choice(k, v, CLASS_WEIGHTS),
    "optimizer": lambda k, v: _one_choice(k, v, OPTIMIZERS),
}


def _settings(scale: str, data: str, options: dict[str, Any]) -> dict[str, Any]:
    """The preset of ``scale`` with ``options`` applied; ValueError naming an unknown option or a
    bad value (counts >= 1, rates finite and > 0, fractions in (0, 1), known models).

    The full preset is the paper's setting as far as 2 CPU cores allow: 300-d embeddings
    initialised with our GloVe stand-ins, h_dim 150 (R52 100), dropout 0.5, Adam 1e-3, batch 10,
    every training type in the vocabulary, whole TREC questions and the 95 % token cap elsewhere,
    three seeds, early stopping on validation macro-F1."""
    quick = check_scale(scale) == "quick"
    cfg: dict[str, Any] = {
        "data": data, "seeds": [0] if quick else [0, 1, 2], "models": list(MODELS),
        "embed_dim": 16 if quick else 300, "hidden_size": 16 if quick else DATASETS[data][3], "bidirectional": True,
        "max_tokens": 20 if quick else ("all" if data == "trec" else "auto"), "token_share": 0.95,
        "max_vocab": 2000 if quick else 0, "min_count": 1,
        "embeddings": "random" if quick else "fasttext", "gutenberg_tokens": 20_000 if quick else 5_000_000,
        "embedding_epochs": 1 if quick else 5,
        "dropout": 0.5, "lr": 1e-3, "batch_size": 10, "max_epochs": 1 if quick else 10, "patience": 2 if quick else 3,
        "valid_fraction": 0.1, "train_limit": 200 if quick else 0, "test_limit": 200 if quick else 0,
        "reassign_per_epoch": 10, "learn_tree_epochs": 1 if quick else 3, "length_buckets": 0,
        "class_weights": "none", "optimizer": "adam+sparseadam",
    }
    for key, value in options.items():
        if key == "data":
            continue
        if key not in cfg:
            raise ValueError(f"unknown option {key!r}; known: {sorted(cfg)}")
        cfg[key] = _OPTION_CHECKS[key](key, value)
    for model in cfg["models"]:
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; known: {MODELS}")
    return cfg


def _prepare(scale: str, data: str, options: dict[str, Any]):
    """Settings, the (test-limited) data set, the resolved document cap with its kept token shares,
    and the pretrained vectors (None for random embeddings)."""
    from hsm_lab.data import load_text_classification

    if data not in DATASETS:
        raise ValueError(f"data must be one of {sorted(DATASETS)}, got {data!r}")
    cfg = _settings(scale, data, options)
    dataset = load_text_classification(DATASETS[data][0])
    if cfg["test_limit"] and len(dataset.test_texts) > cfg["test_limit"]:
        from dataclasses import replace

        keep = np.arange(cfg["test_limit"])
        dataset = replace(dataset, test_texts=dataset.test_texts.subset(keep),
                          test_labels=np.asarray(dataset.test_labels)[keep])
    train_lengths = dataset.train_texts.lengths()
    cap = resolve_max_tokens(cfg["max_tokens"], train_lengths, cfg["token_share"])
    info = {"max_tokens_used": cap, "kept_token_share_train": kept_token_share(train_lengths, cap),
            "kept_token_share_test": kept_token_share(dataset.test_texts.lengths(), cap)}
    pretrained = None
    if cfg["embeddings"] == "fasttext":
        pretrained = glove_standin_vectors(data, dataset, cfg["embed_dim"], cfg["gutenberg_tokens"],
                                           cfg["embedding_epochs"])
    if cfg["max_vocab"] == 0:
        cfg["max_vocab"] = None
    cfg.update(info)
    return cfg, dataset, pretrained


def estimate_epoch_seconds(data: str, model: str = "flat", batches: int = 50, scale: str = "full", seed: int = 0,
                           device: str = "cpu", **options: Any) -> dict[str, Any]:
    """Time ``batches`` training steps of ``model`` at the preset of ``scale`` (+ ``options``) and
    extrapolate to one epoch: the sizing of the full tables (notebooks/taxonomy_softmax.md). Both wall time and this
    process's CPU time are given (on a shared machine the CPU time is what the steps cost a free
    core). The fastText vectors are not timed (built, or read from the cache, before the clock)."""
    if batches < 1:
        raise ValueError(f"batches must be >= 1, got {batches}")
    device = torch.device(check_device(device))
    cfg, dataset, pretrained = _prepare(scale, data, dict(options, models=model))
    valid = dataset.validation_split(cfg["valid_fraction"], seed=seed)
    _, train_x, train_y, net, layer, optimizer, learner, _ = _build(model, dataset, valid, cfg, seed, pretrained, device)
    gen = torch.Generator().manual_seed(seed)
    steps_per_epoch = math.ceil(len(train_y) / cfg["batch_size"])
    steps = min(batches, steps_per_epoch)
    timed_tokens = 0

    def counted(batches):
        nonlocal timed_tokens
        for x, y in batches:
            timed_tokens += int((x != 0).sum())
            yield x, y

    wall, cpu = time.perf_counter(), time.process_time()
    train_epoch(net, layer, counted(_batches(train_x, train_y, cfg["batch_size"], gen, cfg["length_buckets"])),
                optimizer, learner=learner, device=device, max_steps=steps)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # two extrapolations: by steps, and by tokens (a packed LSTM computes on the real tokens only, so
    # the cost follows the tokens; a few long documents make the per-step sample noisy)
    epoch_tokens = int((train_x != 0).sum())
    return {"data": data, "model": model, "steps_timed": steps, "steps_per_epoch": steps_per_epoch,
            "tokens_timed": timed_tokens, "tokens_per_epoch": epoch_tokens,
            "epoch_wall_seconds": wall / steps * steps_per_epoch, "epoch_cpu_seconds": cpu / steps * steps_per_epoch,
            "epoch_cpu_seconds_by_tokens": cpu / max(timed_tokens, 1) * epoch_tokens,
            "max_tokens_used": cfg["max_tokens_used"], "kept_token_share_train": cfg["kept_token_share_train"],
            "embed_dim": cfg["embed_dim"], "hidden_size": cfg["hidden_size"], "threads": torch.get_num_threads()}


@experiment("taxonomy-tables", "Schuurmans & Frasincar Tables 1-4: BiLSTM, flat vs taxonomy HSM (+ learned tree)",
            "results/taxonomy/trec.json")
def run_taxonomy_tables(scale: str = "quick", device: str = "cpu", out: Path | str | None = None,
                        data: str = "trec", force: bool = False, **options: Any) -> Path:
    """One table of Schuurmans & Frasincar (``data`` = trec, 20ng, r8 or r52) at the configured scale.

    ``out`` None: ``hsm-results/taxonomy/<data>.json`` (:func:`hsm_lab.results.output_path`); a
    full-scale file at ``out`` is not replaced by a quick run unless ``force``. ValueError for a
    bad scale, data, device or option, before any training. ``device="cuda"`` moves the models
    and batches to the GPU (the batch stays 10, as in the paper)."""
    if data not in DATASETS:
        raise ValueError(f"data must be one of {sorted(DATASETS)}, got {data!r}")
    _settings(scale, data, options)  # bad options fail here, before any data is read
    device = torch.device(check_device(device))
    path = output_path(f"results/taxonomy/{data}.json", out)
    check_replace(path, scale, force)
    start = time.perf_counter()
    configure_threads(default=1)  # batch-10 LSTM steps are too small to gain from threads on a shared machine
    loader, table, key, _ = DATASETS[data]
    cfg, dataset, pretrained = _prepare(scale, data, options)
    # a full-scale label names every way the run departs from the paper's protocol (embeddings,
    # model selection, epochs, document cap); the random-init one reads "lower reference"
    scale = scale_label(scale, cfg)
    run_records: list[dict[str, Any]] = []
    per_model: dict[tuple[str, str], list[float]] = {}
    embeddings_note = (f"{cfg['embed_dim']}-d {GLOVE_STANDIN_NOTE}, {cfg['gutenberg_tokens']} Gutenberg tokens, "
                       f"{cfg['embedding_epochs']} fastText epochs" if pretrained is not None
                       else f"{cfg['embed_dim']}-d random-init embeddings (no GloVe)")
    info = dict(device=str(device), loader=loader, test_examples=len(dataset.test_texts),
                threads=torch.get_num_threads(), embeddings_note=embeddings_note,
                note=f"{embeddings_note}; one 10% stratified validation split from train (no 4-fold CV; the paper's "
                     f"selected h_dim); documents cut at {cfg['max_tokens_used']} tokens "
                     f"({100 * cfg['kept_token_share_train']:.1f}% of the training tokens kept)")
    # a stopped run (cut at a time limit) resumes from its finished (seed, model) runs
    parts = ResumableParts(path, _run_settings(cfg) | {"device": str(device)},
                           what="partial taxonomy-table file", log=lambda m: print(m, file=sys.stderr, flush=True))
    # within a (seed, model) run, an epoch-level checkpoint (train_one), removed as each run finishes
    checkpoints = path.parent / f".{path.name}.checkpoints"
    for seed in cfg["seeds"]:
        valid = None
        for kind in cfg["models"]:
            if f"seed{seed}/{kind}" not in parts:
                valid = valid or dataset.validation_split(cfg["valid_fraction"], seed=seed)
            result = parts.run(f"seed{seed}/{kind}", lambda: train_one(kind, dataset, valid, cfg, seed,
                                                                       pretrained=pretrained, device=device,
                                                                       checkpoint=checkpoints / f"seed{seed}-{kind}.pt"))
            extra = {k: v for k, v in result.items() if k != "test"}
            run_records.append(make_record(None, result["test"]["f1"], kind_of_record="run", dataset=data, model=kind,
                                           seed=seed, scale=scale, test=result["test"], **extra))
            for measure, value in result["test"].items():
                per_model.setdefault((kind, measure), []).append(value)
            # after every run, the finished part (marked incomplete) is shown in the result file, but
            # only where no complete result exists: an interrupted re-run keeps the previous table
            done = len(run_records) == len(cfg["seeds"]) * len(cfg["models"])
            records = run_records + _mean_records(per_model, table, key, data, scale, cfg["seeds"],
                                                  claims=paper_protocol(cfg))
            # wall_time_s is this invocation's; a run resumed from its partial file trained most of
            # its parts in earlier invocations, whose seconds each part's train_seconds keeps
            training_seconds = sum(r["train_seconds"] for r in run_records)
            prov = provenance(dict(cfg, **info, complete=done, training_seconds=training_seconds),
                              time.perf_counter() - start, scale=scale)
            path = (write_results if done else write_progress)(path, records, prov, force=force)
    parts.finish()
    if checkpoints.is_dir() and not any(checkpoints.iterdir()):
        checkpoints.rmdir()
    return path


def headline_file(data: str, root: Path | str | None = None, embeddings: str = "fasttext") -> Path | None:
    """The result file that stands for ``data``'s table at the paper's scale: among the complete
    full-path files with the GloVe stand-ins (``<root>/taxonomy/<data>-full-ft*.json``), the one with
    the largest epoch budget; None when there is none yet. ``embeddings="random"`` gives the
    random-init lower reference the same way (``<data>-full-random*.json``). ``root``: the results
    folder (default :func:`hsm_lab.results.default_results_root`)."""
    from hsm_lab.results import default_results_root, load_results

    if data not in DATASETS:
        raise ValueError(f"data must be one of {sorted(DATASETS)}, got {data!r}")
    patterns = {"fasttext": "ft", "random": "random"}
    if embeddings not in patterns:
        raise ValueError(f"embeddings must be one of {sorted(patterns)}, got {embeddings!r}")
    folder = (default_results_root() if root is None else Path(root)) / "taxonomy"
    best: tuple[int, Path] | None = None
    for path in sorted(folder.glob(f"{data}-full-{patterns[embeddings]}*.json")):
        cfg = load_results(path)["provenance"]["config"]
        if cfg.get("complete", True) and (best is None or cfg["max_epochs"] > best[0]):
            best = (cfg["max_epochs"], path)
    return None if best is None else best[1]


def _mean_records(per_model: dict[tuple[str, str], list[float]], table: int, key: str, data: str, scale: str,
                  seeds: list[int], claims: bool = True) -> list[dict[str, Any]]:
    """One record per (model, measure): the mean over the seeds run so far, named after the paper's
    number (``claims``; a variant of the paper's training names none)."""
    records = []
    for (kind, measure), values in per_model.items():
        claim = f"sf2020.table{table}.{key}.{kind}.{measure}" if claims else ""
        records.append(make_record(claim if claim in paper.NUMBERS else None, float(np.mean(values)),
                                   kind_of_record="mean_over_seeds", dataset=data, model=kind, measure=measure,
                                   std=float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                                   min=float(np.min(values)), max=float(np.max(values)),
                                   values=values, seeds=seeds[: len(values)], scale=scale,
                                   paper_value=paper.NUMBERS[claim].value if claim in paper.NUMBERS else None))
    return records
