"""Why our Gutenberg test perplexities sit above the paper's: one random-tree run (the full table's
65-ary depth-3 tree and learning rate, one epoch) on a corpus with one thing varied, and the test
perplexity of every held-out book and of each genre, read from the trained model.

What can vary (``-o`` options, :class:`~hsm_lab.experiments.lm.presets.LMScale` fields, see
:func:`hsm_lab.data.gutenberg.split_pieces`): ``split_seed`` (another draw of the book split),
``split=chunks`` (held-out pieces of 2,000 tokens inside every book instead of whole books) and
``min_count`` (a vocabulary of the training types seen at least that often). Without options the
run is the corpus' own split and vocabulary, the reference the others are read against.

Genres (:func:`book_genres`) are ours, judged from title, author and opening pages for the held-out
books of the corpus' split and of the draw with ``split_seed=1``; other books count as unlabelled.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hsm_lab.data.gutenberg import split_segments
from hsm_lab.data.lm import LMCorpus
from hsm_lab.experiments import check_device, check_scale, experiment
from hsm_lab.results import check_replace, make_record

from hsm_lab.experiments.lm.config import LMRunConfig, LMRunResult
from hsm_lab.experiments.lm.presets import DEFAULT_OUT, LMScale
from hsm_lab.experiments.lm.report import _common_fields, _out_path, _write
from hsm_lab.experiments.lm.tables import _run_dir, run_table
from hsm_lab.experiments.lm.training import RunFiles, load_trained_model

__all__ = ["OFFSET_EXPERIMENT", "book_genres", "kept_learned_run", "kept_random_run", "per_book_perplexity",
           "run_lm_gutenberg_offset", "token_nll"]

#: the experiment whose kept random-tree model the Gutenberg diagnostics read (decoding, Mnih-Hinton, node decisions)
OFFSET_EXPERIMENT = "lm-gutenberg-offset"
#: the genre file's name under ``lab/hsm_lab/data/resources``
GENRES_FILE = "gutenberg-genres.tsv"


def _book_key(path: str) -> str:
    # a few manifest titles hold a carriage return; the genre file is keyed without it
    return path.replace("\r", "")


def book_genres() -> dict[str, str]:
    """``{book path: genre}`` from the genre file (fiction, drama, poetry, non-fiction, mixed)."""
    text = (resources.files("hsm_lab.data") / "resources" / GENRES_FILE).read_text(encoding="utf-8")
    genres = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and not line.startswith("path\t"):
            path, genre = line.split("\t")
            genres[path] = genre
    return genres


def kept_random_run(sc: LMScale, device: str) -> tuple[LMCorpus, LMRunResult, LMRunConfig, RunFiles]:
    """lm-gutenberg-offset's random-tree run at scale ``sc`` (trained, its model kept, when it is
    not in the run folder yet; read when it is): its corpus, run, configuration and files (the kept
    model is ``files.model``)."""
    return _kept_run(sc, "random", device)


def kept_learned_run(sc: LMScale, device: str) -> tuple[LMCorpus, LMRunResult, LMRunConfig, RunFiles]:
    """The learned-tree run of the Gutenberg table (lm-gutenberg-65's: two epochs, the first
    learning the tree from random tree seed 0, statistics decay 1) on the corpus of ``sc``, trained
    with its model kept in lm-gutenberg-offset's run folder when it is not there yet, read when it
    is: its corpus, run, configuration and files (the kept model is ``files.model``)."""
    return _kept_run(replace(sc, epochs=2, learn_epochs=1, decay=1.0), "learned", device)


def _kept_run(sc: LMScale, kind: str, device: str) -> tuple[LMCorpus, LMRunResult, LMRunConfig, RunFiles]:
    """The ``kind`` row of lm-gutenberg-offset's table at ``sc``, its model kept: its corpus, run,
    configuration and files."""
    table = run_table(OFFSET_EXPERIMENT, sc, (kind,), device, keep_models=True)
    corpus, run = table["corpus"], table["runs"][kind]
    cfg = LMRunConfig(**run.config)
    return corpus, run, cfg, RunFiles.in_folder(_run_dir(OFFSET_EXPERIMENT), cfg, corpus)


@torch.no_grad()
def token_nll(model: torch.nn.Module, output: torch.nn.Module, contexts: torch.Tensor, targets: torch.Tensor,
              batch_size: int = 1024) -> np.ndarray:
    """``-log p(w_t | context)`` of every target, in nats (float64, shape ``(len(targets),)``)."""
    out = np.empty(len(targets), dtype=np.float64)
    for start in range(0, len(targets), batch_size):
        logp = output(model(contexts[start:start + batch_size]), targets[start:start + batch_size]).output
        out[start:start + len(logp)] = -logp.double().cpu().numpy()
    return out


def per_book_perplexity(nll: np.ndarray, segments: list[tuple[str, int, int]], unk: np.ndarray,
                        genres: dict[str, str]) -> list[dict[str, Any]]:
    """One row per book: its held-out tokens, perplexity (exp of the mean NLL over its pieces), share
    of ``<unk>`` targets and genre ("unlabelled" if the genre file does not list it); pieces beyond
    ``len(nll)`` (a test split cut short) are cut to fit."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0])
    for path, start, end in segments:
        end = min(end, len(nll))
        if end <= start:
            continue
        row = totals[path]
        row[0] += float(nll[start:end].sum())
        row[1] += end - start
        row[2] += int(unk[start:end].sum())
    return [{"book": _book_key(path), "genre": genres.get(_book_key(path), "unlabelled"), "tokens": n,
             "perplexity": math.exp(total / n), "unk_share": n_unk / n}
            for path, (total, n, n_unk) in totals.items()]


def by_genre(books: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Perplexity of each genre's books together (token-weighted: exp of their mean NLL)."""
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0])
    for row in books:
        group = groups[row["genre"]]
        group[0] += math.log(row["perplexity"]) * row["tokens"]
        group[1] += row["tokens"]
        group[2] += 1
    return {genre: {"perplexity": math.exp(total / n), "tokens": n, "books": count}
            for genre, (total, n, count) in sorted(groups.items())}


def _variant_words(sc) -> str:
    parts = []
    if sc.split == "chunks":
        parts.append(f"held-out pieces of {sc.chunk_tokens:,} tokens inside every book")
    if sc.split_seed is not None:
        parts.append(f"another draw of the split (seed {sc.split_seed})")
    if sc.min_count > 1:
        parts.append(f"vocabulary of the training types seen at least {sc.min_count} times")
    return "; ".join(parts) or "the corpus' own split and vocabulary"


def _records(corpus: LMCorpus, run, books: list[dict[str, Any]], sc, scale: str, seconds: float
             ) -> list[dict[str, Any]]:
    stats = corpus.stats
    common = dict(_common_fields(corpus, sc, scale), model="Random Tree", run="random",
                  varied=_variant_words(sc), split=sc.split, split_seed=sc.split_seed, min_count=sc.min_count,
                  lr=run.config["lr"], epochs=run.config["epochs"], per_epoch=run.epochs, wall_time_s=run.seconds,
                  trained_on=run.device, valid_oov_rate=stats.get("valid_oov_rate"),
                  test_oov_rate=stats.get("test_oov_rate"), train_types=stats.get("train_types"),
                  test_books=stats.get("test_books"))
    genres = by_genre(books)
    records = [
        make_record(None, run.test_perplexity, measure="test_perplexity", valid_perplexity=run.valid_perplexity,
                    **common),
        make_record(None, float(len(genres)), measure="test_perplexity_by_genre", by_genre=genres, **common),
        make_record(None, float(len(books)), measure="test_perplexity_by_book", books=books,
                    evaluation_seconds=seconds, **common),
    ]
    if "fiction" in genres:
        records.append(make_record(None, genres["fiction"]["perplexity"], measure="test_perplexity_fiction",
                                   **common))
    return records


@experiment("lm-gutenberg-offset", "Why the Gutenberg test perplexities sit above the paper's: one random tree "
            "(65-ary, 1 epoch) on another draw of the book split, a split inside books or a min-count vocabulary, "
            "with the test perplexity of every held-out book", DEFAULT_OUT["lm-gutenberg-offset"])
def run_lm_gutenberg_offset(scale: str = "quick", device: str = "cpu", out: Path | None = None,
                            force: bool = False, **options: Any) -> Path:
    """One random-tree run on the (varied) corpus, its model kept in the run folder, and the
    perplexity of each held-out book and genre from that model (see the module docstring)."""
    from hsm_lab.experiments.lm.commands import _scale_for

    start = time.perf_counter()
    name = OFFSET_EXPERIMENT
    sc = _scale_for(name, check_scale(scale), options)
    device = check_device(device)
    path = _out_path(out, DEFAULT_OUT[name])
    check_replace(path, scale, force)
    corpus, run, cfg, files = kept_random_run(sc, device)
    model, output, _ = load_trained_model(files.model, device)
    t0 = time.perf_counter()
    contexts, targets = (t.to(device) for t in corpus.windows("test", cfg.context))
    nll = token_nll(model, output, contexts, targets)
    if not math.isclose(math.exp(nll.mean()), run.test_perplexity, rel_tol=1e-4):
        raise RuntimeError(f"the kept model gives test perplexity {math.exp(nll.mean()):.4f}, the run recorded "
                           f"{run.test_perplexity:.4f}: {files.model} is not this run's model. Fix: delete it and "
                           f"{files.finished.name}, then run again")
    segments = split_segments(sc.max_books, split=sc.split, split_seed=sc.split_seed,
                              chunk_tokens=sc.chunk_tokens)["test"]
    unk = (corpus.test == corpus.index("<unk>")).numpy()
    books = per_book_perplexity(nll, segments, unk, book_genres())
    records = _records(corpus, run, books, sc, scale, time.perf_counter() - t0)
    return _write(name, out, DEFAULT_OUT[name], records, sc, scale, device, time.perf_counter() - start, None,
                  options, run.seconds, extra_config={"runs": ["random"], "varied": _variant_words(sc)},
                  force=force)


# ------------------------------------------------------------------------------------------- reading the results

#: the offset runs, by the end of their file name, in the order the chapter shows them
OFFSET_RUNS = ("reference", "split-draw1", "split-chunks2000", "vocab-min3")
#: genres in the order the figure colours them
GENRE_ORDER = ("fiction", "drama", "poetry", "non-fiction", "mixed", "unlabelled")


def offset_file(results_dir: Path, name: str) -> Path:
    """The committed result file of offset run ``name`` (a key of :data:`OFFSET_RUNS`)."""
    return Path(results_dir) / f"gutenberg-678books-65ary-1ep-random-{name}.json"


def offset_rows(payloads: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per offset run: what varied, vocabulary, test OOV rate, valid and test perplexity,
    their ratio, and the fiction books' test perplexity (None when the test text is not whole
    labelled books)."""
    rows = []
    for name, payload in payloads.items():
        records = {r["measure"]: r for r in payload["records"]}
        main = records["test_perplexity"]
        genres = records["test_perplexity_by_genre"]["by_genre"]
        labelled = "unlabelled" not in genres
        rows.append({"run": name, "varied": main["varied"], "vocab": main["vocab_size"],
                     "test_oov": main["test_oov_rate"], "valid": main["valid_perplexity"],
                     "test": main["value"], "ratio": main["value"] / main["valid_perplexity"],
                     "fiction": genres["fiction"]["perplexity"] if labelled and "fiction" in genres else None,
                     "test_books": main["test_books"]})
    return rows


def offset_markdown(rows: list[dict[str, Any]]) -> str:
    """The offset runs as a markdown table."""
    lines = ["| what varied | vocabulary | test `<unk>` | valid | test | test / valid | test, fiction books |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        fiction = f"{r['fiction']:.1f}" if r["fiction"] is not None else "–"
        lines.append(f"| {r['varied']} | {r['vocab']:,} | {100 * r['test_oov']:.2f} % | {r['valid']:.1f} "
                     f"| {r['test']:.1f} | {r['ratio']:.3f} | {fiction} |")
    return "\n".join(lines)


def books_of(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-book rows of an offset result file, highest perplexity first."""
    records = {r["measure"]: r for r in payload["records"]}
    return sorted(records["test_perplexity_by_book"]["books"], key=lambda b: -b["perplexity"])
