"""Every row of ICML Table 1 / supplement Table 3: each output layer and peer at each ``d``, its
learning rate picked on a validation split carved from train, then trained on all of train and
tested (:func:`run_table`); a stopped table resumes from its finished rows
(:class:`hsm_lab.results.ResumableParts`)."""
from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm.layers import NonFiniteInputError
from hsm_lab.results import ResumableParts

from hsm_lab.experiments.classification.config import TableConfig, _config_json
from hsm_lab.experiments.classification.data import _data_slug, _label_counts, encode_data, load_table_data
from hsm_lab.experiments.classification.evaluation import evaluate_bow
from hsm_lab.experiments.classification.peers import (_doc_tokens, _fasttext_lines, _package_version, _word_text, peer_available, run_fasttext,
                    run_vw)
from hsm_lab.experiments.classification.presets import STAND_INS
from hsm_lab.experiments.classification.report import _gains, _record
from hsm_lab.experiments.classification.training import train_bow
from hsm_lab.experiments.classification.trees import _save_trees, author_grouping

__all__ = ["run_table"]


def run_table(config: TableConfig, table: str, device: str = "cpu", out: Path | None = None,
              log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every output layer and peer at every ``d``: LR picked on a validation split carved from
    train, then trained on all of train and tested; one record per row of the table.

    With ``out``, completed rows are kept in ``.<out name>.partial.json`` beside it
    (:class:`hsm_lab.results.ResumableParts`, under this config) so that a stopped run resumes where
    it was; the file is removed once every row is done."""
    torch.set_num_threads(1)  # one core: the same budget as fastText's -thread 1
    data = load_table_data(config)
    valid_data = data.validation_split(config.validation_fraction, seed=config.seed)
    encoded = {}
    for name, source in (("valid", valid_data), ("test", data)):
        vocab, train_split, eval_split = encode_data(source, ngrams=config.ngrams)
        encoded[name] = (vocab, train_split, eval_split, source)
    parts = None if out is None else ResumableParts(out, _config_json(config), "partial-table file", log=log)
    done: dict[str, dict[str, Any]] = {}  # without out: rows kept in memory (VW's one row serves every d)

    def row(key: str, compute: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """The row ``key``: the finished one, or ``compute(*args)`` (kept, and saved with ``out``)."""
        if parts is not None:
            return parts.run(key, lambda: compute(*args))
        if key not in done:
            done[key] = compute(*args)
        return done[key]

    common = {"data": config.data, "stand_in": config.data in STAND_INS, "train_examples": len(data.train_texts),
              "test_examples": len(data.test_texts), "num_labels": data.num_labels, "multilabel": data.multilabel,
              "epochs": config.epochs, "reduce": config.reduce, "ngrams": config.ngrams}
    records: list[dict[str, Any]] = []
    # the learned trees are written to a hidden folder beside the result file while the table runs
    # and moved to trees/ when it is complete: an interrupted re-run leaves the previous result's trees
    tree_dir = None if out is None else out.parent / f".{out.name}.trees"
    tree_prefix = None if out is None else tree_prefix_of(out)
    category = None
    if data.taxonomy is not None:
        cat = data.category_of()
        category = [cat[name] for name in data.label_names]

    for dim in config.dims:
        for output in config.outputs:
            done_row = row(f"d{dim}/{output}", _run_ours, config, encoded, output, dim, device, tree_dir, category,
                           log, tree_prefix)
            records.append(_record(table, dim, done_row, common))
        for peer in config.peers:
            # VW has no embedding dimension: one run, shown in every d block
            key = "vw-log_multi" if peer == "vw-log_multi" else f"d{dim}/{peer}"
            done_row = row(key, _peer_row, config, encoded, peer, dim, log)
            records.append(_record(table, dim, done_row, common))
    records.extend(_gains(table, records, common))
    if tree_dir is not None:
        _publish_trees(tree_dir, out.parent / "trees")
    if parts is not None:
        parts.finish()
    return records


def tree_prefix_of(out: Path) -> str:
    """The name the learned-tree files of the result file ``out`` start with: its stem, less a
    leading ``table1-`` / ``table3-`` (``table1-cooking.json`` -> ``trees/cooking-d50-learned5.json``),
    so that a Table 1 file and the Table 3 file of the same run share their trees on purpose
    (Table 3 re-issues Table 1's rows), while any other two result files never share one
    (``seed0-cooking.json`` and ``seed1-cooking.json`` in one folder get their own)."""
    stem = Path(out).stem
    for table in ("table1-", "table3-"):
        if stem.startswith(table) and len(stem) > len(table):
            return stem[len(table):]
    return stem


def _publish_trees(staging: Path, trees: Path) -> None:
    """Move the tree files of a finished table from ``staging`` into ``trees`` (each an atomic rename)."""
    if not staging.is_dir():
        return
    trees.mkdir(parents=True, exist_ok=True)
    for path in sorted(staging.iterdir()):
        path.replace(trees / path.name)
    staging.rmdir()


def _peer_row(config: TableConfig, encoded: dict, peer: str, dim: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The peer's row, or a row saying why it was skipped (its package is missing)."""
    why = peer_available(peer)
    if why:
        return {"output": peer, "skipped": why}
    try:
        return _run_peer(config, encoded, peer, dim, log)
    except FloatingPointError as exc:  # recorded, not fatal: the other rows of the table still run
        log(f"d={dim} {peer}: {exc}")
        return {"output": peer, "skipped": f"diverged: {exc}; try smaller rates"}


def _select(scores: dict[float, float | None]) -> float:
    """The rate of the best validation P@1 (the smaller rate on a tie); FloatingPointError when all diverged."""
    finite = {lr: s for lr, s in scores.items() if s is not None}
    if not finite:
        raise FloatingPointError(f"every learning rate diverged: {scores}")
    return max(finite, key=lambda lr: (finite[lr], -lr))


def _run_ours(config: TableConfig, encoded: dict, output: str, dim: int, device: str, tree_dir: Path | None,
              category: list[str] | None, log: Callable[[str], None], tree_prefix: str | None = None) -> dict[str, Any]:
    """Our row ``output`` at ``d = dim``: the rate picked on the validation split (``encoded["valid"]``),
    retrained on all of train and tested (``encoded["test"]``); with a tree, its size and depth, and
    for a learned tree its rebuilds, author grouping (``category``) and saved tree files."""
    kwargs = dict(epochs=config.epochs, batch_size=config.batch_size, reduce=config.reduce, ngrams=config.ngrams,
                  seed=config.seed, device=device, reassigns=config.reassigns, tree_prior=config.tree_prior,
                  tree_decay=config.tree_decay, reset_moved_nodes=config.reset_moved_nodes, trainer=config.trainer,
                  statistics=config.statistics, schedule=config.schedule, threads=config.threads)
    vocab, train_split, valid_split, _ = encoded["valid"]
    scores: dict[float, float | None] = {}
    for lr in config.lr_grid:
        try:
            trained = train_bow(train_split, output, dim, lr, vocab_size=len(vocab), **kwargs)
            scores[lr] = evaluate_bow(trained, valid_split, device=device)["p_at_1"]
        except (FloatingPointError, NonFiniteInputError):  # diverged in training or in its last steps
            scores[lr] = None
        log(f"  d={dim} {output} lr={lr}: valid P@1 {scores[lr]}")
    vocab, train_split, test_split, source = encoded["test"]
    # retrain on all of train at the best rate; should that run diverge (SGD on more data at a rate at the
    # edge of stability), fall back to the next best rate and say so
    diverged = []
    for best in sorted((lr for lr, v in scores.items() if v is not None), key=lambda lr: (-scores[lr], lr)):
        try:
            trained = train_bow(train_split, output, dim, best, vocab_size=len(vocab), **kwargs)
            break
        except FloatingPointError:
            diverged.append(best)
            log(f"  d={dim} {output} lr={best}: diverged on the full training set, next best rate")
    else:
        # recorded, not fatal (the other rows of the table still run): a skipped row says why
        why = (f"diverged at every learning rate of lr_grid {list(scores)}"
               + (f" and on the full training set at {diverged}" if diverged else "")
               + f" (reduce={config.reduce}); try smaller rates"
               + (" or reduce=mean" if config.reduce != "mean" else ""))
        log(f"d={dim} {output}: {why}")
        return {"output": output, "skipped": why, "valid_p_at_1": {str(k): v for k, v in scores.items()},
                "diverged_on_full_train": diverged}
    result = evaluate_bow(trained, test_split, device=device, timing_passes=config.timing_passes)
    row: dict[str, Any] = {"output": output, "lr": best, "valid_p_at_1": {str(k): v for k, v in scores.items()},
                           "diverged_on_full_train": diverged, "train_seconds": trained.train_seconds, **result}
    if trained.start_tree is not None:
        tree = trained.layer.tree
        row["tree_nodes"] = tree.num_nodes
        row["tree_max_depth"] = tree.max_depth
        counts = _label_counts(train_split) + 1.0
        row["expected_depth_train_counts"] = tree.expected_depth(counts[: tree.num_labels])
        row["start_expected_depth_train_counts"] = trained.start_tree.expected_depth(counts[: tree.num_labels])
    if trained.learner is not None:
        row["reassigns"] = len(trained.learner.history)
        row["moved_labels_first"] = trained.reassign_moved[0] if trained.reassign_moved else None
        row["moved_labels_last"] = trained.reassign_moved[-1] if trained.reassign_moved else None
        row["reassign_seconds"] = float(sum(r.seconds for r in trained.learner.history))
    if category is not None and trained.start_tree is not None:
        row["author_grouping"] = author_grouping(trained.layer.tree, category)
        row["start_author_grouping"] = author_grouping(trained.start_tree, category)
    if tree_dir is not None and config.save_trees and trained.learner is not None:
        stem = f"{tree_prefix or _data_slug(config.data)}-d{dim}-{output}"
        _save_trees(trained.layer.tree, trained.start_tree, source.label_names, tree_dir, stem)
        # recorded where run_table moves them once the table is complete
        row["tree_file"], row["start_tree_file"] = f"trees/{stem}.json", f"trees/{stem}-start.json"
    log(f"d={dim} {output}: lr={best} P@1={result['p_at_1']:.2f} train {trained.train_seconds:.1f}s "
        f"test {result['test_seconds']:.2f}s visited {result['nodes_visited']:.1f}")
    return row


def _run_peer(config: TableConfig, encoded: dict, peer: str, dim: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The peer's row: fastText (on our rows' threads) over ``lr_grid``, or VW over ``vw_lr_grid``,
    picked on validation, retrained on all of train and tested; with the package's version."""
    results = {}
    for name in ("valid", "test"):
        _, train_split, eval_split, source = encoded[name]
        results[name] = (train_split, eval_split, _doc_tokens(source.train_texts), _doc_tokens(source.test_texts))
    if peer.startswith("fasttext"):
        loss = peer.split("-", 1)[1]
        # the same threads as our rows: one for the PyTorch trainer, the Hogwild threads of the compiled one
        threads = (config.threads or torch.get_num_threads()) if config.trainer == "fast" else 1
        scores: dict[float, float | None] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("valid", "test"):
                (Path(tmp) / name).mkdir()
            train_split, eval_split, train_tokens, eval_tokens = results["valid"]
            train_lines = _fasttext_lines(train_split, train_tokens, np.random.default_rng(config.seed))
            eval_texts = [_word_text(words) for words in eval_tokens]
            for lr in config.lr_grid:
                got = run_fasttext(train_lines, eval_texts, eval_split, loss, dim, lr, config.epochs, config.ngrams,
                                   config.seed, Path(tmp) / "valid", threads)
                scores[lr] = got["p_at_1"] if math.isfinite(got["p_at_1"]) else None
                log(f"  d={dim} {peer} lr={lr}: valid P@1 {scores[lr]}")
            best = _select(scores)
            train_split, eval_split, train_tokens, eval_tokens = results["test"]
            train_lines = _fasttext_lines(train_split, train_tokens, np.random.default_rng(config.seed))
            eval_texts = [_word_text(words) for words in eval_tokens]
            result = run_fasttext(train_lines, eval_texts, eval_split, loss, dim, best, config.epochs, config.ngrams,
                                  config.seed, Path(tmp) / "test", threads)
            result["threads"] = threads
        import fasttext

        version = getattr(fasttext, "__version__", None) or _package_version("fasttext-wheel")
    else:
        scores = {}
        train_split, eval_split, train_tokens, eval_tokens = results["valid"]
        for lr in config.vw_lr_grid:
            scores[lr] = run_vw(train_split, train_tokens, eval_split, eval_tokens, lr, config.epochs,
                                config.seed)["p_at_1"]
            log(f"  d={dim} {peer} -l {lr}: valid P@1 {scores[lr]}")
        best = _select(scores)
        train_split, eval_split, train_tokens, eval_tokens = results["test"]
        result = run_vw(train_split, train_tokens, eval_split, eval_tokens, best, config.epochs, config.seed)
        version = _package_version("vowpalwabbit")
    log(f"d={dim} {peer}: lr={best} P@1={result['p_at_1']:.2f} train {result['train_seconds']:.1f}s")
    return {"output": peer, "lr": best, "valid_p_at_1": {str(k): v for k, v in scores.items()},
            "version": version, **result}
