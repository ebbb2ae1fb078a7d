"""``lm-new-words``: words added to a trained language model's learned tree without retraining,
against retraining with the same occurrences.

The label-addition experiment (:mod:`hsm_lab.experiments.label_addition`) on a language model: the
labels are the next words. For each seed, 1 % of PTB's vocabulary is held out (drawn among the
words with at least ``min_count`` training occurrences): their occurrences become ``<unk>`` in all
three splits and the learned-tree LM of ``lm-ptb`` (25-ary depth-3 tree, 4 epochs, the tree learned
for 3) trains on that corpus, whose vocabulary lacks them. The held-out words are then added to its
output layer (:meth:`hsm.HierarchicalSoftmax.add_labels`) from the contexts of their first k = 1, 5
or 20 training occurrences (the LM's representations ``r_x`` of the 3 words before each):

* ``objective``: placed by Algorithm 2's pair score (the method), slots calibrated against
  ``reference`` training contexts of the trained words;
* ``random``: placed at random (what the objective buys);
* ``objective-local``: the objective's placement, then ``local_steps`` gradient steps on the new
  words' paths, mixed with the reference contexts as rehearsal;
* ``unk-share``: no tree change; a new word takes a share of ``<unk>``'s probability,
  ``p(w | x) = p(<unk> | x) pi_w`` with ``pi_w = k / U``, ``U`` the ``<unk>`` tokens of the training
  text (``<unk>`` keeps ``1 - sum pi``; the k-shot retrain's counts): the class-based way to add a
  word to a model with an unknown-word class;
* ``kshot-retrain``: the same LM retrained on PTB in which each held-out word keeps its first k
  training occurrences (the later ones stay ``<unk>``), vocabulary complete (the fair ceiling).

``retrain`` trains the same LM on PTB itself (every occurrence; one run serves every seed). The
held-out words keep ``<unk>``'s input embedding in the models of the additions, and their own in
the retrained ones. Test perplexity is read at three sets of positions: where the next word is a
held-out one (``perplexity_new``), where it is not (``perplexity_trained``, compared with the model
before the addition), and all of them (``perplexity_all``, PTB's usual perplexity over the 10k
vocabulary). The additions' rows also give the share of new words whose own examples fall below
their slot's threshold (``below_threshold``: the calibration against the reference contexts put it
past them; :attr:`hsm.label_addition.LabelAddition.margins`). Every model trains on one thread with
the same seed, so a seed fixes the run.
"""
from __future__ import annotations

import copy
import hashlib
import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hsm.tree import Tree
from hsm_lab.data.lm import LMCorpus
from hsm_lab.experiments import check_device, check_scale, experiment, option_choice, option_float, option_int, option_ints
from hsm_lab.experiments.label_addition import held_out_labels, path_and_slot_log_probs
from hsm_lab.experiments.lm.config import LMRunConfig
from hsm_lab.experiments.lm.presets import SCALES
from hsm_lab.experiments.lm.tables import _run_dir, _table_corpus
from hsm_lab.experiments.lm.training import RunFiles, load_trained_model, train_lm
from hsm_lab.results import ResumableParts, check_replace, output_path, provenance, write_results

__all__ = ["METHODS", "first_occurrences_only", "held_out_words", "lm_new_words", "summarise", "without_words"]

#: the ways a held-out word reaches the model (module docstring)
METHODS = ("objective", "random", "objective-local", "unk-share", "kshot-retrain")
#: the settings of the additions; the LM's own are lm-ptb's learned tree (its selected rate, 0.05)
DEFAULTS: dict[str, Any] = {"held_out": 0.01, "min_count": 20, "reference": 2000, "local_steps": 20,
                            "local_lr": 0.1, "lr": 0.05}
#: the quick scale: lm-ptb's quick slice (2,000 words, 150k training tokens), one seed, k = 1 and 5
QUICK: dict[str, Any] = {"seeds": (0,), "examples": (1, 5)}
#: seeds of the additions' random draws (placement, reference contexts), apart from the held-out draw
_DRAW = 1_000


def held_out_words(corpus: LMCorpus, share: float, seed: int, min_count: int) -> np.ndarray:
    """The held-out word ids (sorted): ``ceil(share * V)`` drawn by ``seed`` among the words other
    than ``<unk>`` and ``<eos>`` with at least ``min_count`` training occurrences and one in test."""
    in_test = np.bincount(corpus.test.numpy(), minlength=corpus.vocab_size) > 0
    eligible = np.flatnonzero((np.asarray(corpus.counts) >= min_count) & in_test)
    eligible = eligible[~np.isin(eligible, [corpus.unk_id, corpus.eos_id])]
    return held_out_labels(corpus.vocab_size, share, seed, eligible)


def _words_tag(words: np.ndarray) -> str:
    """A short name of a set of held-out words, for the run files of the models trained without them."""
    return hashlib.sha1(np.asarray(words, dtype=np.int64).tobytes()).hexdigest()[:8]


def without_words(corpus: LMCorpus, words: np.ndarray) -> tuple[LMCorpus, np.ndarray]:
    """``corpus`` with ``words`` removed from the vocabulary and their occurrences mapped to
    ``<unk>`` in every split; and the map from the old ids to the new (the kept ids keep their order)."""
    keep = np.ones(corpus.vocab_size, dtype=bool)
    keep[words] = False
    mapping = np.cumsum(keep) - 1
    mapping[words] = mapping[corpus.unk_id]
    table = torch.from_numpy(mapping.astype(np.int64))
    counts = np.bincount(mapping, weights=corpus.counts, minlength=int(keep.sum())).astype(np.int64)
    reduced = LMCorpus(name=f"{corpus.name}-without{len(words)}-{_words_tag(words)}",
                       vocab=[w for w, k in zip(corpus.vocab, keep) if k], train=table[corpus.train],
                       valid=table[corpus.valid], test=table[corpus.test], counts=counts, context=corpus.context,
                       stats=dict(corpus.stats, held_out_words=len(words)))
    return reduced, mapping


def first_occurrences_only(corpus: LMCorpus, words: np.ndarray, k: int) -> LMCorpus:
    """``corpus`` with every training occurrence of ``words`` after its ``k``-th mapped to ``<unk>``
    (validation and test unchanged; the vocabulary complete)."""
    train = corpus.train.clone()
    for w in words:
        train[torch.nonzero(train == int(w)).flatten()[k:]] = corpus.unk_id
    counts = np.bincount(train.numpy(), minlength=corpus.vocab_size).astype(np.int64)
    return LMCorpus(name=f"{corpus.name}-first{k}of{len(words)}-{_words_tag(words)}", vocab=corpus.vocab, train=train,
                    valid=corpus.valid, test=corpus.test, counts=counts, context=corpus.context,
                    stats=dict(corpus.stats, held_out_words=len(words), kept_occurrences=k))


def _trained(corpus: LMCorpus, cfg: LMRunConfig, run_dir: Path, log: Callable[[str], None]) -> tuple[Any, Any, float]:
    """(LM, output layer, training seconds) of the learned-tree run ``cfg`` on ``corpus`` (trained
    once, kept in the run folder and read back)."""
    tree = Tree.random(corpus.vocab_size, cfg.arity, cfg.depth, seed=cfg.tree_seed, label_names=corpus.vocab)
    result = train_lm(corpus, cfg, tree=tree, checkpoint_dir=run_dir, log=log, keep_model=True)
    model, output, _ = load_trained_model(RunFiles.in_folder(run_dir, cfg, corpus).model)
    return model, output, result.seconds


@torch.no_grad()
def _log_probs(model: Any, output: Any, contexts: torch.Tensor, targets: torch.Tensor,
               batch_size: int = 4096) -> torch.Tensor:
    """``log p(target | context)`` of every row, float64."""
    return torch.cat([output(model(contexts[i:i + batch_size]), targets[i:i + batch_size]).output.double()
                      for i in range(0, len(targets), batch_size)])


def _perplexities(log_p: torch.Tensor, is_new: torch.Tensor) -> dict[str, float]:
    ppl = lambda lp: math.exp(-float(lp.mean()))  # noqa: E731
    return {"perplexity_new": ppl(log_p[is_new]), "perplexity_trained": ppl(log_p[~is_new]),
            "perplexity_all": ppl(log_p)}


def _split(log_path: np.ndarray, log_slot: np.ndarray) -> dict[str, float]:
    """The new words' perplexity as the product of two: reaching the word's node (the path) and its
    slot there."""
    return {"perplexity_new_path": math.exp(-float(np.mean(log_path))),
            "perplexity_new_slot": math.exp(-float(np.mean(log_slot)))}


@torch.no_grad()
def _path_and_slot(model: Any, layer: Any, contexts: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    return _split(*path_and_slot_log_probs(layer, model(contexts.contiguous()), targets.numpy()))


def _unk_share(reduced: LMCorpus, k: int) -> float:
    """pi_w = k / U, the same for every held-out word: its share of the ``U`` ``<unk>`` tokens of the
    reduced training text if it had occurred there ``k`` times (the counts the k-shot retrain trains on)."""
    return k / int((reduced.train == reduced.unk_id).sum())


def _seed_rows(full: LMCorpus, cfg: LMRunConfig, seed: int, examples: tuple[int, ...], methods: list[str],
               settings: dict[str, Any], run_dir: Path, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every row of one seed: the model before the addition, each method at each k."""
    words = held_out_words(full, settings["held_out"], seed, settings["min_count"])
    reduced, mapping = without_words(full, words)
    old_k = reduced.vocab_size
    new_id = np.full(full.vocab_size, -1, dtype=np.int64)
    new_id[words] = np.arange(old_k, old_k + len(words))
    log(f"seed {seed}: {len(words)} held-out words, e.g. {', '.join(full.vocab[w] for w in words[:6])}")
    model, before, seconds = _trained(reduced, cfg, run_dir, log)
    x_test, _ = reduced.windows("test", cfg.context)
    x_full, y_full = full.windows("test", cfg.context)
    is_new = torch.from_numpy(np.isin(y_full.numpy(), words))
    new_rows = torch.nonzero(is_new).flatten()
    # the targets of the grown layer: held-out words at their new ids, the rest as the reduced corpus has them
    y_grown = torch.from_numpy(np.where(new_id[y_full.numpy()] >= 0, new_id[y_full.numpy()], mapping[y_full.numpy()]))
    log_p_before = _log_probs(model, before, x_test, torch.from_numpy(mapping[y_full.numpy()]))
    base = {"seed": seed, "held_out": len(words), "trained_words": old_k, "test_new_tokens": int(is_new.sum()),
            "test_tokens": len(y_full)}
    rows = [dict(base, method="before", examples=0, train_seconds=seconds,
                 perplexity_trained=_perplexities(log_p_before, is_new)["perplexity_trained"])]
    # log p(<unk> | x) of the model before the addition, for the share of <unk> at every k
    log_unk = (_log_probs(model, before, x_test, torch.full_like(y_full, reduced.unk_id))
               if "unk-share" in methods else None)
    x_train, y_train = reduced.windows("train", cfg.context)
    rng = np.random.default_rng(_DRAW + seed)
    reference_at = torch.from_numpy(np.sort(rng.choice(len(y_train), settings["reference"], replace=False)))
    with torch.no_grad():
        reference = model(x_train[reference_at].contiguous())
    rehearsal = (reference, y_train[reference_at])
    positions = [torch.nonzero(full.train == int(w)).flatten() for w in words]
    for k in examples:
        with torch.no_grad():
            word_examples = [model(x_train[at[:k]].contiguous()) for at in positions]
        for method in methods:
            row = dict(base, method=method, examples=k)
            if method in ("objective", "random", "objective-local"):
                layer = copy.deepcopy(before)
                added = layer.add_labels(word_examples, label_names=[full.vocab[w] for w in words],
                                         placement="random" if method == "random" else "objective", seed=_DRAW + seed,
                                         local_steps=settings["local_steps"] if method == "objective-local" else 0,
                                         local_lr=settings["local_lr"], reference=reference,
                                         rehearsal=rehearsal if method == "objective-local" else None)
                row.update(**_perplexities(_log_probs(model, layer, x_test, y_grown), is_new),
                           **_path_and_slot(model, layer, x_test[new_rows], y_grown[new_rows]),
                           seconds_per_word=added.seconds / len(words),
                           # where the reference put the threshold past the word's own examples
                           below_threshold=float((added.margins < 0).mean()))
            elif method == "unk-share":
                start = time.perf_counter()
                share = _unk_share(reduced, k)
                log_p = log_p_before.clone()
                log_p[new_rows] = log_unk[new_rows] + math.log(share)
                row.update(_split(log_unk[new_rows].numpy(), np.full(len(new_rows), math.log(share))))
                own_unk = y_full == full.unk_id
                log_p[own_unk] = log_unk[own_unk] + math.log1p(-share * len(words))
                row.update(_perplexities(log_p, is_new), seconds_per_word=(time.perf_counter() - start) / len(words))
            else:  # kshot-retrain
                kshot_model, kshot_output, seconds = _trained(first_occurrences_only(full, words, k), cfg, run_dir, log)
                row.update(**_perplexities(_log_probs(kshot_model, kshot_output, x_full, y_full), is_new),
                           **_path_and_slot(kshot_model, kshot_output, x_full[new_rows], y_full[new_rows]),
                           train_seconds=seconds, seconds_per_word=seconds / len(words))
            log(f"seed {seed}, k={k}, {method}: perplexity on the new words {row['perplexity_new']:.0f}, "
                f"on the others {row['perplexity_trained']:.1f} (before {rows[0]['perplexity_trained']:.1f})")
            rows.append(row)
    return rows


def _retrain_row(full: LMCorpus, cfg: LMRunConfig, words_of_seed: dict[int, np.ndarray], run_dir: Path,
                 log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The LM trained on every occurrence of every word, read at each seed's held-out positions."""
    model, output, seconds = _trained(full, cfg, run_dir, log)
    x_test, y_test = full.windows("test", cfg.context)
    log_p = _log_probs(model, output, x_test, y_test)
    rows = []
    for seed, words in words_of_seed.items():
        is_new = torch.from_numpy(np.isin(y_test.numpy(), words))
        new_rows = torch.nonzero(is_new).flatten()
        rows.append({"seed": seed, "held_out": len(words), "trained_words": full.vocab_size - len(words),
                     "test_new_tokens": int(is_new.sum()), "test_tokens": len(y_test), "method": "retrain",
                     "examples": 0, "train_seconds": seconds, **_perplexities(log_p, is_new),
                     **_path_and_slot(model, output, x_test[new_rows], y_test[new_rows])})
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (method, k): means over seeds of the three perplexities; the change of the trained words'
    perplexity from the model before the addition (``trained_change_mean``, in perplexity points); and
    the new words' perplexity over the k-shot retrain's at the same k and over the full retrain's."""
    by_seed = {(r["seed"], r["method"], r["examples"]): r for r in rows}
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r["examples"]:
            groups.setdefault((r["method"], r["examples"]), []).append(r)
    out = []
    for (method, k), members in sorted(groups.items(), key=lambda item: (item[0][1], METHODS.index(item[0][0]))):
        mean = lambda key: float(np.mean([r[key] for r in members]))  # noqa: E731
        new = np.array([r["perplexity_new"] for r in members])
        summary = {"kind": "summary", "method": method, "examples": k, "seeds": len(members),
                   "perplexity_new_mean": float(new.mean()),
                   "perplexity_new_sd": float(new.std(ddof=1)) if new.size > 1 else None,
                   "perplexity_trained_mean": mean("perplexity_trained"), "perplexity_all_mean": mean("perplexity_all"),
                   "perplexity_new_path_mean": mean("perplexity_new_path"),
                   "perplexity_new_slot_mean": mean("perplexity_new_slot"),
                   "trained_change_mean": float(np.mean([r["perplexity_trained"]
                                                         - by_seed[(r["seed"], "before", 0)]["perplexity_trained"]
                                                         for r in members])),
                   "seconds_per_word_max": float(max(r["seconds_per_word"] for r in members))}
        if all("below_threshold" in r for r in members):
            summary["below_threshold_mean"] = mean("below_threshold")
        if all((r["seed"], "kshot-retrain", k) in by_seed for r in members):
            summary["new_over_kshot_mean"] = float(np.mean(
                [r["perplexity_new"] / by_seed[(r["seed"], "kshot-retrain", k)]["perplexity_new"] for r in members]))
        if all((r["seed"], "retrain", 0) in by_seed for r in members):
            summary["new_over_retrain_mean"] = float(np.mean(
                [r["perplexity_new"] / by_seed[(r["seed"], "retrain", 0)]["perplexity_new"] for r in members]))
        out.append(summary)
    return out


def parse_options(scale: str, options: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], list[str],
                                                                 dict[str, Any]]:
    """(seeds, examples, methods, settings) from ``-o KEY=VALUE`` options at ``scale``; ValueError
    naming a bad or unknown option."""
    quick = check_scale(scale) == "quick"
    options = dict(options)
    seeds = option_ints("seeds", options.pop("seeds", QUICK["seeds"] if quick else (0, 1, 2)), minimum=0)
    examples = option_ints("examples", options.pop("examples", QUICK["examples"] if quick else (1, 5, 20)), minimum=1)
    methods = [option_choice("methods", m, METHODS) for m in str(options.pop("methods", ",".join(METHODS))).split(",")
               if m]
    settings = {"held_out": option_float("held_out", options.pop("held_out", DEFAULTS["held_out"]), minimum=1e-9,
                                         maximum=0.5),
                "min_count": option_int("min_count", options.pop("min_count", DEFAULTS["min_count"]), minimum=1),
                "reference": option_int("reference", options.pop("reference", DEFAULTS["reference"]), minimum=1),
                "local_steps": option_int("local_steps", options.pop("local_steps", DEFAULTS["local_steps"]), minimum=1),
                "local_lr": option_float("local_lr", options.pop("local_lr", DEFAULTS["local_lr"]), minimum=1e-9),
                "lr": option_float("lr", options.pop("lr", DEFAULTS["lr"]), minimum=1e-9)}
    if options:
        raise ValueError(f"unknown option(s) for lm-new-words: {', '.join(sorted(options))}")
    if max(examples) > settings["min_count"]:
        raise ValueError(f"examples={max(examples)} exceeds min_count={settings['min_count']}: a held-out word "
                         f"must have that many training occurrences; raise min_count or lower examples")
    return seeds, examples, methods, settings


@experiment("lm-new-words", "Words added to a trained PTB language model's learned tree without retraining "
            "(J_n placement, random, local steps, <unk> share) against retraining",
            "results/lm/ptb-new-words.json")
def lm_new_words(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                 **options: Any) -> Path:
    """The held-out-word experiment (module docstring). Options: ``seeds`` (default 0,1,2; quick 0),
    ``examples`` (first occurrences per new word, default 1,5,20; quick 1,5), ``methods`` (any of
    :data:`METHODS`, default all), ``held_out`` (share of the vocabulary, default 0.01),
    ``min_count`` (training occurrences a held-out word needs, default 20), ``reference``
    (training contexts the new slots are calibrated against and ``objective-local`` rehearses, default
    2,000), ``local_steps`` and ``local_lr`` (default 20 and 0.1), ``lr`` (the LM's Adagrad rate,
    default lm-ptb's selected 0.05). Trained models are kept in the run folder and a stopped run
    resumes from its partial file."""
    check_device(device)
    if device != "cpu":
        raise ValueError(f"lm-new-words runs on the CPU (the additions are host-side), got device={device!r}")
    seeds, examples, methods, settings = parse_options(scale, options)
    quick = scale == "quick"
    out = Path(out) if out is not None else output_path(f"results/lm/ptb-new-words{'-quick' if quick else ''}.json")
    check_replace(out, scale, force)
    log = lambda message: print(message, flush=True)  # noqa: E731
    start = time.perf_counter()
    sc = SCALES["lm-ptb"][scale]
    full = _table_corpus(sc, device)
    cfg = LMRunConfig(output="learned", context=sc.context, arity=sc.arity, depth=3, batch_size=sc.batch_size,
                      epochs=sc.epochs, learn_epochs=sc.learn_epochs, reassign_per_epoch=sc.reassign_per_epoch,
                      lr=settings["lr"], l2=sc.l2, decay=sc.decay, tree_seed=0, seed=0)
    config = {"experiment": "lm-new-words", "dataset": "ptb", "scale_description": sc.description,
              "vocab_size": full.vocab_size, "train_tokens": int(full.train.numel()),
              "test_tokens": int(full.test.numel()), "seeds": list(seeds), "examples": list(examples),
              "methods": methods, **settings, "lm": {key: value for key, value in vars(cfg).items()
                                                      if key not in ("output", "max_steps_per_epoch")},
              "threads": 1}
    run_dir = _run_dir("lm-new-words")
    parts = ResumableParts(out, config, "partial lm-new-words file", log=log)
    rows = []
    for seed in seeds:
        rows += parts.run(f"seed{seed}", lambda seed=seed: _seed_rows(full, cfg, seed, examples, methods, settings,
                                                                       run_dir, log))
    words_of_seed = {seed: held_out_words(full, settings["held_out"], seed, settings["min_count"]) for seed in seeds}
    rows += parts.run("retrain", lambda: _retrain_row(full, cfg, words_of_seed, run_dir, log))
    records = [dict(r, kind="run") for r in rows] + summarise(rows)
    # the training time of every model the file rests on (models trained earlier are read from the run
    # folder, so this invocation's wall time can be much shorter); the full retrain serves every seed
    trained = [r["train_seconds"] for r in rows if r["method"] in ("before", "kshot-retrain")]
    training_seconds = sum(trained) + next(r["train_seconds"] for r in rows if r["method"] == "retrain")
    prov = provenance(config={**config, "training_seconds": training_seconds},
                      wall_time_s=time.perf_counter() - start, scale=scale, threads=1)
    path = write_results(out, records, prov, force=force)
    parts.finish()
    return path
