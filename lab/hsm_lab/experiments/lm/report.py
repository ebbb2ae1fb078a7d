"""The language-model results: the records a run writes (:func:`_records`, :func:`_write`) and
what the notebooks read from a result file (tables in markdown, per-epoch and learning plots,
the words under a learned tree's bottom nodes)."""
from __future__ import annotations

import gzip
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hsm.atomic import atomic_write
from hsm_lab.data.lm import LMCorpus
from hsm_lab.results import check_replace, make_record, output_path, provenance, write_results
from hsm.tree import Tree

from hsm_lab.experiments.lm.presets import ABLATION_WHAT, ABLATION_VARIANTS, SCALES, LMScale, _ablation_changes

__all__ = ["ablation_markdown", "ablation_rows", "best_epoch_markdown", "combine_parts", "leaf_table",
           "leaf_table_markdown", "load_tree_file", "plot_ablation", "plot_learning_evidence", "plot_per_epoch",
           "read_runs", "RunRecord", "runs_of", "scale_note", "table_markdown"]


_MODEL_NAMES = {"flat": "Flat soft-max", "random": "Random Tree", "clustering": "Clustering Tree",
                "learned": "Learned Tree", "adaptive": "Adaptive softmax (torch, 2k/20k/100k, div 4; not in the paper)"}
_SLUGS = {"flat": "flat_soft_max", "random": "random_tree", "clustering": "clustering_tree",
          "learned": "learned_tree"}


def scale_note(sc: LMScale, train_tokens: int, vocab_size: int, settings: bool = True) -> str:
    """What a result file's runs trained, in words (the records' ``scale_note``): the data, the
    trees, the epochs and the learned tree's learning epochs, the batch, with ``settings`` the L2
    and a statistics decay other than ours (0.5), and the description. Everything in it comes from
    ``sc``, which the file records as its ``provenance.config``, and the corpus' sizes, so the note
    cannot say other than the configuration; ``settings`` False leaves the L2 and the decay out for
    a file whose runs differ in them (the ablation's variants), where each record says its own."""
    note = (f"{sc.dataset}: {train_tokens:,} training tokens, vocabulary {vocab_size:,}, {sc.arity}-ary depth-3 trees, "
            f"{sc.epochs} epochs (learned tree: {sc.learn_epochs} learning the tree), batch {sc.batch_size}")
    if settings:
        note += (f", L2 {sc.l2:g}" if sc.l2 else ", no L2") + (
            f", learned-tree statistics decay {sc.decay:g}" if sc.decay != 0.5 else "")
    return note + "; " + sc.description


def _common_fields(corpus: LMCorpus, sc: LMScale, scale: str, settings: bool = True) -> dict[str, Any]:
    """The fields every record of one result file shares: the data, the trees, the scale, and a
    note of what was trained (:func:`scale_note`). ``sc`` is what the file records as its
    configuration (:func:`_write`): a file about a model trained at other settings than its
    experiment's preset passes that model's (:func:`~.tables.kept_model_scale`)."""
    return {"dataset": sc.dataset, "vocab_size": corpus.vocab_size, "train_tokens": int(corpus.train.numel()),
            "valid_tokens": int(corpus.valid.numel()), "test_tokens": int(corpus.test.numel()),
            "context": sc.context, "arity": sc.arity, "depth": 3, "scale": scale,
            "scale_note": scale_note(sc, int(corpus.train.numel()), corpus.vocab_size, settings)}


def _records(table: dict[str, Any], sc: LMScale, claim_prefix: str | None, claim_kind: str,
             scale: str, tree_files: dict[str, Any] | None = None, tree_stem: str = "") -> list[dict[str, Any]]:
    """One record per (run, measure); claims only at full scale and only for runs that match the
    paper's setting (the reduced Gutenberg runs carry no claim: see ``scale_note``)."""
    corpus: LMCorpus = table["corpus"]
    records = []
    common = _common_fields(corpus, sc, scale)
    for kind, run in table["runs"].items():
        learn = run.config.get("learn_epochs")
        model = _MODEL_NAMES.get(kind, f"Learned Tree (learn {learn:g} + fine-tune "
                                       f"{run.config['epochs'] - learn:g} epochs)")
        variant = run.config.get("fixed_tree") or ""
        if variant.startswith("clustering:"):
            # e.g. "clustering:groups=random,embeddings=fasttext-ngrams"
            words = {"groups=random": "random top level", "embeddings=fasttext-ngrams": "fastText character n-grams"}
            model += " (" + ", ".join(words.get(part, part) for part in variant[len("clustering:"):].split(",")) + ")"
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
    # the value is the tree's chosen rate; a table part without a tree (the flat row alone) gives
    # its own layer's, and value_is says which
    selection = table["selection"]
    chosen = next((key for key in ("tree_lr", "flat_lr", "adaptive_lr") if key in selection), None)
    records.append(make_record(None, float(selection[chosen]) if chosen else 0.0, measure="selection",
                               value_is=chosen, selection=selection, **common))
    return records


_EMBEDDINGS = {"fasttext": "fastText skip-gram (fasttext-wheel), d=50, hs loss, 5 epochs, whole words",
               "fasttext-ngrams": "fastText skip-gram (fasttext-wheel), d=50, hs loss, 5 epochs, "
                                  "character n-grams of 3-6 characters",
               "lbl": "our log-bilinear LM, d=50, random-tree HSM"}


def _out_path(out: Path | None, default: str) -> Path:
    """``out``, else ``default`` under :func:`hsm_lab.results.output_root` (not the committed results)."""
    return output_path(default, out)


#: LMScale fields where a smaller value than the preset's means less of the paper's run (data,
#: training, seeds or learning-rate trials): such an override is a reduction, any other a setting
_REDUCING_FIELDS = ("epochs", "train_tokens", "eval_tokens", "max_books", "vocab_size", "random_seeds",
                    "lr_grid", "select_steps", "embed_epochs", "select_eval_tokens")


def scale_label(scale: str, overrides: dict[str, Any], preset: LMScale | None) -> str:
    """The scale label of a run: ``scale`` alone, or ``"full, reduced: epochs=2; settings: decay=1"``.

    An override is a *reduction* when it runs less than the preset (fewer epochs, tokens, books,
    words, seeds or learning rates: a field of :data:`_REDUCING_FIELDS` set below the preset's
    value, or a count set where the preset uses everything); every other override (``decay``,
    ``l2``, ``learn_epochs``, ...) is a *setting*, which the label names without calling it a
    reduction."""
    reduced, settings = {}, {}
    for key, value in sorted(overrides.items()):
        base = getattr(preset, key, None) if preset is not None else None
        try:
            given = _option_size(key, value)
            smaller = key in _REDUCING_FIELDS and given is not None and (
                base is None or given < _option_size(key, base))
        except (TypeError, ValueError):
            smaller = False
        (reduced if smaller else settings)[key] = value
    parts = [f"{what}: " + ", ".join(f"{k}={v}" for k, v in group.items())
             for what, group in (("reduced", reduced), ("settings", settings)) if group]
    return scale if not parts else f"{scale}, " + "; ".join(parts)


def _option_size(key: str, value: Any) -> float | None:
    """How much an option asks for: a number, or for ``lr_grid`` how many rates (None: everything)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if key == "lr_grid":
        items = value.split(",") if isinstance(value, str) else list(value)
        return float(len([v for v in items if str(v).strip()]))
    return float(value)


def _write(name: str, out: Path | None, default: str, records, sc: LMScale, scale: str, device: str,
           seconds: float, tree_files: dict[str, Any] | None = None, options: dict[str, Any] | None = None,
           training_seconds: float | None = None, extra_config: dict[str, Any] | None = None,
           force: bool = False, label: str | None = None) -> Path:
    """Write the result file and, beside it, each learned tree with the word counts as
    ``<stem>-<run>-tree.json.gz`` (not a result file: the notebooks draw the tree from it).
    ``label``: the scale label, for an experiment whose preset itself departs from the paper's
    setting (default: :func:`scale_label` of the options against the preset)."""
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
                      wall_time_s=max(seconds, training_seconds or 0.0), scale=scale)
    # a run whose preset was overridden says so in its scale label (the landing page shows it)
    # the overrides are recorded whole, so that `reproduce` passes a run's own description again;
    # the scale label names only those that change what runs
    overrides = dict(options or {})
    changes = {k: v for k, v in overrides.items() if k != "description"}
    prov["hsm_scale"] = label or scale_label(scale, changes, SCALES.get(name, {}).get(scale))
    prov["config"]["overrides"] = overrides
    # wall_time_s covers the runs it rests on; runs finished earlier load from the run folder, so
    # this invocation alone can take seconds
    prov["config"]["training_seconds"] = training_seconds
    prov["config"]["invocation_seconds"] = seconds
    prov["config"].update(extra_config or {})
    return write_results(path, records, prov, force=force)


def _ablation_records(table: dict[str, Any], sc: LMScale, scale: str) -> list[dict[str, Any]]:
    """One ``test_perplexity`` record per run (variant or baseline), with its gain over the random
    tree it started from (seed 0, same learning rate), its rebuild history (moved labels, J_n per
    depth) and, for the learned trees, the mean share of words moved per rebuild in the last
    learning epoch; one ``random_seed_spread`` record."""
    corpus: LMCorpus = table["corpus"]
    common = _common_fields(corpus, sc, scale, settings=False)  # the variants differ in L2 and decay
    records = []
    for name, run in table["runs"].items():
        cfg = run.config
        learned = cfg["output"] == "learned"
        reference = table["runs"][table["reference"][name]]
        history = run.reassignments
        what = ABLATION_WHAT.get(name, f"random tree (seed {cfg['tree_seed']}, lr {cfg['lr']:g}"
                                 + (f", L2 {cfg['l2']:g})" if cfg.get("l2") else ")"))
        if name == "base":  # the run's own schedule, which a slice's options may change
            what = (f"{sc.reassign_per_epoch} rebuilds/epoch, decay {sc.decay:g}, current-child prior, eq. 12, "
                    "learned then fine-tuned")
        fields = dict(common, run=name, variant=name if learned or name == "retrained" else None, what=what,
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


def runs_of(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{run: {measure: record}}`` from a result file's records."""
    out: dict[str, dict[str, Any]] = {}
    for record in payload["records"]:
        if "run" in record:
            out.setdefault(record["run"], {})[record["measure"]] = record
    return out


@dataclass(frozen=True)
class RunRecord:
    """One run (output layer) of a result file, read by name: its perplexities per epoch, the
    epoch an early stop on **validation** would pick, and its times."""

    model: str  # the layer, as the tables name it
    final: float  # test perplexity after the last epoch, as the tables report it
    final_valid: float  # validation perplexity after the last epoch
    valid: list[float]  # validation perplexity after epoch 1, 2, ...
    test: list[float]  # test perplexity after epoch 1, 2, ...
    best_epoch: int  # the epoch (1 = the first) with the lowest validation perplexity
    best_test: float  # the test perplexity at that epoch (chosen on validation only)
    train_ms: float  # wall time per training step
    test_ms: float  # wall time per test batch
    epochs: int  # epochs trained
    learn_epochs: float  # learned tree: epochs during which the tree was rebuilt (0 for the others)
    train_tokens: int  # training tokens per epoch
    batch_size: int
    # learned tree only: one record per rebuild (J_n per depth, share of words moved, seconds)
    rebuilds: list[dict[str, Any]] = field(default_factory=list)


def read_runs(payload: dict[str, Any]) -> dict[str, RunRecord]:
    """``{run name: RunRecord}`` for every run of a result file (or of :func:`combine_parts`)."""
    out = {}
    for run, measures in runs_of(payload).items():
        rec = measures["test_perplexity"]
        epochs = rec["per_epoch"]
        best = min(epochs, key=lambda e: e["valid_perplexity"])
        out[run] = RunRecord(
            model=rec["model"], final=rec["value"], final_valid=epochs[-1]["valid_perplexity"],
            valid=[e["valid_perplexity"] for e in epochs], test=[e["test_perplexity"] for e in epochs],
            best_epoch=best["epoch"], best_test=best["test_perplexity"],
            train_ms=measures["train_ms_per_batch"]["value"], test_ms=measures["test_ms_per_batch"]["value"],
            epochs=rec.get("epochs", len(epochs)), learn_epochs=rec.get("learn_epochs", 0),
            train_tokens=rec.get("train_tokens", 0), batch_size=rec.get("batch_size", 0),
            rebuilds=measures.get("mean_moved_labels", {}).get("reassignments", []))
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
    from hsm_lab import paper

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
    ax.legend(fontsize=9)
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
    axes[0].legend(fontsize=9)
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


def _markdown_word(word: str) -> str:
    """A corpus token as literal markdown text: ``<eos>`` would be read as an HTML tag and
    ``s_`` or ``*`` as emphasis, so those characters are escaped."""
    word = word.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for char in "\\`*_|[]":
        word = word.replace(char, "\\" + char)
    return word


def leaf_table_markdown(table: dict[str, list[str]]) -> str:
    """A markdown table with one column per node and its words down the column."""
    names = list(table)
    rows = max(len(v) for v in table.values())
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for i in range(rows):
        cells = (_markdown_word(table[n][i]) if i < len(table[n]) else "" for n in names)
        lines.append("| " + " | ".join(cells) + " |")
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
    # legends under the panels: inside they would hide the curves
    axes[0].legend(fontsize=9, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    for run in moved_runs:
        history = rows.get(run, {}).get("reassignments") or []
        if history:
            axes[1].plot([h["epoch"] for h in history], [h["moved_labels"] for h in history], marker=".", label=run)
    axes[1].set_xlabel("epoch")
    axes[1].set_ylabel("share of words moved per rebuild")
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=9, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    variants = [(name, rec) for name, rec in rows.items() if rec.get("variant")]
    axes[2].barh([name for name, _ in variants], [rec["gain_vs_random"] for _, rec in variants])
    spread = next((r for r in payload["records"] if r.get("measure") == "random_seed_spread"), None)
    if spread is not None:
        axes[2].axvspan(-2 * spread["value"], 2 * spread["value"], color="grey", alpha=0.25,
                        label="random seeds: ±2 s.d.")
        axes[2].legend(fontsize=9)
    axes[2].axvline(0, color="black", lw=0.8)
    # a bar or two far off the scale (learning the tree in every epoch) would hide the others:
    # clip the axis and write those values at its edge
    limit = 10.0
    axes[2].set_xlim(-limit, limit)
    for y, (_, rec) in enumerate(variants):
        if abs(rec["gain_vs_random"]) > limit:
            edge = math.copysign(limit, rec["gain_vs_random"])
            axes[2].text(edge * 0.97, y, f"{rec['gain_vs_random']:+.1f}", va="center", fontsize=9,
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
    from hsm_lab import paper

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
