"""Training every row of a table (:func:`run_table`: flat, random, clustering, learned trees and
the schedules) or of the ablation (:func:`run_ablation`), each row a resumable
:func:`~hsm_lab.experiments.lm.training.train_lm` run in the experiment's run folder under
``hsm_lab.config.runs_dir()`` (``HSM_RUNS``, else ``lm-runs/`` in the cache)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from hsm_lab import config as hsm_config
from hsm.clustering import clustering_tree
from hsm_lab.data.lm import LMCorpus
from hsm.tree import Tree

from hsm_lab.experiments.lm.config import LMRunConfig, LMRunResult
from hsm_lab.experiments.lm.data import load_lm_corpus
from hsm_lab.experiments.lm.embeddings import fasttext_embeddings, learn_embeddings
from hsm_lab.experiments.lm.presets import ABLATION_VARIANTS, RUN_FOLDER, LMScale, _ablation_changes
from hsm_lab.experiments.lm.training import _select_lr, train_lm

__all__ = ["clustering_variant", "kept_model_scale", "run_ablation", "run_table", "table_clustering_tree"]


def _run_dir(experiment_name: str) -> Path:
    return hsm_config.runs_dir(experiment_name)


def _table_corpus(sc: LMScale, device: str) -> LMCorpus:
    """The corpus of a table or ablation at scale ``sc``, after checking that a depth-3 tree of
    ``sc.arity`` holds its vocabulary; on CPU, torch gets one intra-op thread (on a shared 2-core
    machine torch's default, one thread per core, spin-waits for the busy core and runs about 10x
    slower; HSM_THREADS overrides)."""
    if torch.device(device).type == "cpu":
        hsm_config.configure_threads(default=1)
    corpus = load_lm_corpus(sc.dataset, max_books=sc.max_books, vocab_size=sc.vocab_size,
                            train_tokens=sc.train_tokens, eval_tokens=sc.eval_tokens, **split_options(sc))
    if sc.arity**3 < corpus.vocab_size:
        raise ValueError(f"a {sc.arity}-ary depth-3 tree holds {sc.arity**3} words < vocabulary {corpus.vocab_size}")
    return corpus


def split_options(sc: LMScale) -> dict[str, Any]:
    """The Gutenberg split and vocabulary fields of ``sc`` (for :func:`load_lm_corpus`)."""
    return {"split": sc.split, "split_seed": sc.split_seed, "chunk_tokens": sc.chunk_tokens,
            "min_count": sc.min_count}


def kept_model_scale(sc: LMScale, cfg: LMRunConfig, scale: str) -> LMScale:
    """``sc`` with the training settings of the kept run ``cfg`` whose model a diagnostic scored.

    A diagnostic that loads a kept model (decoding, node decisions) reads it at its experiment's
    preset, but the model may have been trained at other settings (the learned-tree model: two
    epochs, the first learning the tree, statistics never decayed); its result file must describe
    the model that was scored, not the preset. ``sc`` itself when the run was trained at ``sc``."""
    learned = cfg.output == "learned"
    kept = replace(sc, context=cfg.context, arity=cfg.arity, batch_size=cfg.batch_size, epochs=cfg.epochs,
                   reassign_per_epoch=cfg.reassign_per_epoch, l2=cfg.l2,
                   lr_grid=sc.lr_grid if tuple(sc.lr_grid) == (cfg.lr,) else (cfg.lr,),
                   # a fixed tree is not learned: the preset's learned-tree fields do not describe it
                   learn_epochs=cfg.learn_epochs if learned else sc.learn_epochs,
                   decay=cfg.decay if learned else sc.decay)
    if kept == sc:
        return sc
    data = ", ".join(part for part in (
        "all books" if sc.max_books is None else f"{sc.max_books} books",
        "the corpus' vocabulary" if sc.vocab_size is None else f"vocabulary {sc.vocab_size:,} (at most)",
        None if sc.train_tokens is None else f"first {sc.train_tokens:,} training tokens") if part)
    if learned:
        then = ", then fine-tuned" if cfg.learn_epochs < cfg.epochs else ""
        model = (f"{cfg.arity}-ary depth-{cfg.depth} tree learned from random tree seed {cfg.tree_seed} during the "
                 f"first {cfg.learn_epochs:g} of {cfg.epochs} epochs (statistics decay {cfg.decay:g}, "
                 f"{cfg.reassign_per_epoch} rebuilds per epoch){then}")
    else:
        model = f"{cfg.arity}-ary depth-{cfg.depth} {cfg.output} tree, {cfg.epochs} epochs"
    return replace(kept, description=f"{scale}: the kept {cfg.output}-tree model it scored ({data}): {model}; "
                                     f"rate {cfg.lr:g}, batch {cfg.batch_size}")


def table_clustering_tree(corpus: LMCorpus, sc: LMScale, cfg: LMRunConfig, device) -> Tree:
    """The clustering row's tree at scale ``sc``: 50-dimensional word vectors (fastText, on whole
    words or with character n-grams, or our log-bilinear model trained with ``cfg``'s settings for
    ``sc.embed_epochs``) grouped by
    :func:`hsm.clustering.clustering_tree` into an ``sc.arity``-ary depth-3 tree."""
    if sc.clustering_embeddings in ("fasttext", "fasttext-ngrams"):
        ngrams = (3, 6) if sc.clustering_embeddings == "fasttext-ngrams" else None
        vectors = fasttext_embeddings(corpus, dim=50, epochs=5, loss="hs", char_ngrams=ngrams)
    else:
        vectors = learn_embeddings(corpus, cfg, dim=50, epochs=sc.embed_epochs, device=device)
    return clustering_tree(vectors, sc.arity, 3, seed=0, label_names=corpus.vocab, groups=sc.clustering_groups)


def clustering_variant(sc: LMScale) -> str | None:
    """The run key's tree variant of the clustering row (``LMRunConfig.fixed_tree``): None for the
    table's own tree (k-means groups of fastText whole-word vectors), else what differs, e.g.
    ``"clustering:groups=random"``, so that another tree never loads the table's finished run."""
    parts = [f"groups={sc.clustering_groups}"] if sc.clustering_groups != "kmeans" else []
    if sc.clustering_embeddings not in ("fasttext", "lbl"):
        parts.append(f"embeddings={sc.clustering_embeddings}")
    return "clustering:" + ",".join(parts) if parts else None


def run_table(
    name: str,
    sc: LMScale,
    outputs: Sequence[str],
    device: str,
    log: Callable[[str], None] | None = None,
    schedules: Sequence[tuple[str, int]] | None = None,
    keep_models: bool = False,
    checkpoint_seconds: float | None = None,
) -> dict[str, Any]:
    """Train every output layer of a table at scale ``sc``; return the runs and selections.

    ``schedules`` adds learned-tree runs ``(label, learn_epochs)`` (arXiv Fig. 3). ``keep_models``:
    the random-tree and learned-tree runs keep their trained model in the run folder
    (``RunFiles.model``). ``checkpoint_seconds``: training time between two checkpoints within an
    epoch (:func:`~hsm_lab.experiments.lm.training.train_lm`'s default when None). The tree's learning
    rate is searched only when a tree is trained (or ``outputs`` is empty: the selection alone), so
    that the flat row alone costs only its own trials."""
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
    # the learned tree's start: the first random tree unless the scale names another seed
    learned_seed = sc.learned_tree_seed
    learned_start = first_tree if learned_seed == 0 else Tree.random(V, sc.arity, 3, seed=learned_seed,
                                                                       label_names=corpus.vocab)
    runs: dict[str, Any] = {}
    selection: dict[str, Any] = {}
    if not outputs or schedules or any(kind in outputs for kind in ("random", "clustering", "learned")):
        tree_lr, trials = _select_lr(corpus, base, first_tree, sc, device, run_dir, log)
        selection["tree_lr"], selection["tree_trials"] = tree_lr, trials
    if "flat" in outputs:
        flat_lr, trials = _select_lr(corpus, replace(base, output="flat"), None, sc, device, run_dir, log)
        selection["flat_lr"], selection["flat_trials"] = flat_lr, trials
        runs["flat"] = train_lm(corpus, replace(base, output="flat", lr=flat_lr), device=device,
                                checkpoint_dir=run_dir, log=log, checkpoint_seconds=checkpoint_seconds)
    if "adaptive" in outputs:
        adaptive_lr, trials = _select_lr(corpus, replace(base, output="adaptive"), None, sc, device, run_dir, log)
        selection["adaptive_lr"], selection["adaptive_trials"] = adaptive_lr, trials
        runs["adaptive"] = train_lm(corpus, replace(base, output="adaptive", lr=adaptive_lr), device=device,
                                    checkpoint_dir=run_dir, log=log, checkpoint_seconds=checkpoint_seconds)
    if "random" in outputs:
        candidates = [train_lm(corpus, replace(base, output="random", lr=tree_lr, tree_seed=s), tree=t, device=device,
                               checkpoint_dir=run_dir, log=log,
                               checkpoint_seconds=checkpoint_seconds, keep_model=keep_models)
                      for s, t in random_trees.items()]
        best = min(range(len(candidates)), key=lambda i: candidates[i].valid_perplexity)
        runs["random"] = candidates[best]
        selection["random_seed_valid"] = [c.valid_perplexity for c in candidates]
        selection["random_seed_test"] = [c.test_perplexity for c in candidates]
        selection["random_best_seed"] = list(seeds)[best]
        selection["random_seeds"] = list(seeds)
        selection["random_seed_seconds"] = [c.seconds for c in candidates]
    if "clustering" in outputs:
        tree = table_clustering_tree(corpus, sc, replace(base, lr=tree_lr), device)
        # another tree from the same configuration needs its own run key
        variant = clustering_variant(sc)
        runs["clustering"] = train_lm(corpus, replace(base, output="clustering", lr=tree_lr, fixed_tree=variant),
                                      tree=tree,
                                      device=device, checkpoint_dir=run_dir, log=log,
                                      checkpoint_seconds=checkpoint_seconds)
    if "learned" in outputs:
        runs["learned"] = train_lm(corpus, replace(base, output="learned", lr=tree_lr, decay=sc.decay,
                                                   tree_seed=learned_seed),
                                   tree=learned_start, device=device, checkpoint_dir=run_dir, log=log,
                                   checkpoint_seconds=checkpoint_seconds,
                                   keep_model=keep_models)
    for label, learn_epochs in schedules or ():
        runs[label] = train_lm(corpus, replace(base, output="learned", lr=tree_lr, learn_epochs=learn_epochs,
                                               decay=sc.decay, tree_seed=learned_seed),
                               tree=learned_start, device=device, checkpoint_dir=run_dir, log=log,
                               checkpoint_seconds=checkpoint_seconds)
    return {"corpus": corpus, "runs": runs, "selection": selection}


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
