"""``label-addition``: labels added to a trained classifier without retraining, against retraining.

Two data sets (``data``): ``gutenberg-books`` (the default; one label per passage: its book) and
``cooking`` (multi-label: a question's tags). For each seed a tenth of the labels is held out
(drawn among the labels with at least one training document). The learned-tree classifier
(:class:`hsm.FastBowClassifier`, ``output="learned"``) and the M-ary Huffman-tree one train on the
training documents with the held-out labels removed from their label sets; a document left with
no label is dropped (on ``gutenberg-books``: every passage of a held-out book). Then the held-out
labels are added (:meth:`hsm.FastBowClassifier.add_labels`) from k = 1, 5 or 20 training documents
that carry each (all it has when a label has fewer; a document with two held-out labels may be an
example of both):

* ``objective``: placed by Algorithm 2's pair score in the learned tree (the method);
* ``random``: placed at random in the learned tree (what the objective buys);
* ``huffman``: placed by the pair score in the fixed Huffman tree (what a learned tree buys).

Beside them, what a user could do instead, at the same number of examples per new label:

* ``objective-local``: the objective's placement, then ``local_steps`` gradient steps on the new
  labels' paths, mixed with rehearsal documents of the trained labels (``rehearsal`` of
  :func:`hsm.label_addition.add_labels`; a rehearsal document counts once per trained label it
  carries);
* ``kshot-retrain``: the learned-tree classifier retrained on the base models' training data plus
  the k examples of each new label (the fair ceiling for an addition from k examples): an example
  document carries its trained labels and the new labels it was drawn as an example of;
* ``imprint``: weight imprinting (Qi, Brown & Lowe, CVPR 2018) on the flat softmax trained on the
  trained labels: a new label's row is the normalised mean of its examples' normalised
  representations, scaled to the trained rows' mean norm, with the trained rows' mean bias;
* ``ncm``: the nearest class mean (cosine) of the flat model's representations: the trained labels'
  means over their training documents (a document counts towards each of its labels), a new
  label's over its k examples.

``retrain``, the ceiling, trains the learned-tree classifier on every label of every training
document. The test documents are split in two: *new* ones carry at least one held-out label,
*trained* ones carry none. P@1 counts the top prediction correct when it is any of the document's
gold labels, on the new documents their labels as the final model knows them (trained and added).
Each row gives P@1 on the new and the trained documents, the seconds per added label, and where
the new labels' test documents go: the probability of the path down to the new label's node (set
by the trained nodes) and of its slot there (set by the addition), averaged over (document, held-out
label) pairs.

On multi-label data a new document's other labels are trained ones the models before the
addition already predict, so the rows there also carry ``p_at_1_new_added`` (the top prediction is
one of the document's held-out labels: what the addition serves) and the models before the
addition their P@1 on the new documents; ``examples_mean`` is the mean number of examples a new
label was given (many ``cooking`` tags have fewer than 20 training questions). Every model trains on
one thread, so a seed fixes the run.
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hsm_lab.data import Ragged
from hsm_lab.experiments import check_device, check_scale, experiment, option_choice, option_float, option_int, option_ints
from hsm_lab.results import ResumableParts, check_replace, output_path, provenance, write_results

__all__ = ["DATA", "METHODS", "held_out_labels", "label_addition", "parse_options", "path_and_slot_log_probs",
           "summarise"]

#: the ways labels reach the model: (how, the model trained on the trained labels it starts from)
METHODS = {"objective": ("objective", "learned"), "random": ("random", "learned"), "huffman": ("objective", "huffman"),
           "objective-local": ("objective", "learned"), "kshot-retrain": ("retrain", "learned"),
           "imprint": ("imprint", "flat"), "ncm": ("ncm", "flat")}
#: the methods of the first experiment (placement in a tree only), the default
PLACEMENTS = ("objective", "random", "huffman")
#: the data sets (``data``), the first the default
DATA = ("gutenberg-books", "cooking")
#: the settings of the classifiers (the learned 20-ary tree of ICML Table 1 at d = 50, our best row)
DEFAULTS: dict[str, Any] = {"dim": 50, "arity": 20, "lr": 0.5, "epochs": 5, "held_out": 0.1, "reference": 2000,
                            "local_steps": 20, "local_lr": 0.1}
#: the quick scale: 40 books (or a seeded 3,000 training and 1,000 test questions of cooking), one
#: seed, 1 and 5 examples per new label
QUICK: dict[str, Any] = {"max_books": 40, "train_limit": 3000, "test_limit": 1000, "seeds": (0,), "examples": (1, 5)}
#: what the result file's two thread counts are: the configuration's is the classifiers' training
#: threads, provenance.threads torch's, which the experiment leaves at the machine's default
THREADS_NOTE = ("config.threads is the compiled trainer's Hogwild threads (1: a seed fixes each model); threads is "
                "torch's intra-op threads, left at the machine's default, on which prediction and the probabilities "
                "of the new labels' paths ran")


def held_out_labels(num_labels: int, share: float, seed: int, eligible: np.ndarray | None = None) -> np.ndarray:
    """The labels held out from training (sorted): ``ceil(share * K)`` of them, drawn by ``seed``
    among ``eligible`` (default: every label)."""
    eligible = np.arange(num_labels) if eligible is None else np.asarray(eligible)
    count = max(1, math.ceil(share * num_labels))
    if count > eligible.size:
        raise ValueError(f"held_out={share:g} holds out {count} labels but only {eligible.size} have a training "
                         f"document: lower held_out or use more training data")
    return np.sort(eligible[np.random.default_rng(seed).choice(eligible.size, size=count, replace=False)])


def _rows(split: Any) -> tuple[list[np.ndarray], Ragged]:
    """The documents of an encoded split as a list of word-id arrays, and their label sets."""
    values, offsets = split.values, split.offsets
    docs = [values[offsets[i]:offsets[i + 1]] for i in range(offsets.size - 1)]
    return docs, Ragged(np.asarray(split.label_values, dtype=np.int64), split.label_offsets)


def _owners(sets: Ragged) -> np.ndarray:
    """The document of each entry of ``sets.values``."""
    return np.repeat(np.arange(len(sets)), sets.lengths())


def _kept(sets: Ragged, keep: np.ndarray) -> Ragged:
    """``sets`` with only the entries where ``keep`` (a mask over ``sets.values``) holds; a set may
    become empty."""
    offsets = np.zeros(len(sets) + 1, dtype=np.int64)
    np.cumsum(np.bincount(_owners(sets)[keep], minlength=len(sets)), out=offsets[1:])
    return Ragged(sets.values[keep], offsets)


def _pairs(sets: Ragged, rows: np.ndarray, labels_from: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(document, label) pairs of the documents ``rows`` whose label is at least ``labels_from``:
    the documents' positions in ``rows`` and the labels, in order."""
    subset = sets.subset(rows)
    owners = _owners(subset)
    keep = subset.values >= labels_from
    return owners[keep], subset.values[keep]


def _hits(predicted: np.ndarray, sets: Ragged, labels_from: int = 0) -> np.ndarray:
    """Per document: whether its prediction is one of its gold labels that is at least ``labels_from``."""
    owners = _owners(sets)
    right = (sets.values == predicted[owners]) & (sets.values >= labels_from)
    return np.bincount(owners[right], minlength=len(sets)) > 0


def _p_at_1(predicted: np.ndarray | None, sets: Ragged, labels_from: int = 0) -> float:
    """P@1 (%): the share of documents whose top prediction is one of their gold labels (of those
    that are at least ``labels_from``); NaN for no documents."""
    if predicted is None or not len(sets):
        return float("nan")
    return 100.0 * float(_hits(predicted, sets, labels_from).mean())


def _top(clf: Any, docs: list[np.ndarray]) -> np.ndarray | None:
    """The top label ``clf`` predicts for each document (None for no documents)."""
    return clf.predict(docs).labels[:, 0] if docs else None


def path_and_slot_log_probs(layer: Any, h: Any, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``h`` [n, d] with its label ``labels[i]`` in the tree layer ``layer``: the log
    probability of the path down to the label's node (the nodes above its slot) and of its slot at
    that node; their sum is ``log p(label | h)``, float64."""
    import torch

    tree = layer.tree
    labels = np.asarray(labels)
    with torch.no_grad():
        log_p = layer(h, torch.as_tensor(labels)).output.double().numpy()
        last = tree.path_mask[labels].sum(axis=1) - 1  # the step to each label's leaf
        node = torch.as_tensor(tree.path_nodes[labels, last])
        slot = torch.as_tensor(tree.path_children[labels, last])
        logits = layer.node_logits(h, node[:, None])[:, 0]  # [n, M], unusable slots at -inf
        final = torch.log_softmax(logits.double(), dim=1).gather(1, slot[:, None])[:, 0].numpy()
    return log_p - final, final


def _reach(clf: Any, docs: list[np.ndarray], labels: np.ndarray) -> tuple[float, float]:
    """Where the new labels' test documents go, per (document, gold label) pair (``docs[i]`` with
    ``labels[i]``): the mean probability of the path down to the label's node (the trained nodes'
    routing), and the mean probability of the label's slot at that node (its own parameters);
    their product is p(label | document)."""
    log_path, log_slot = path_and_slot_log_probs(clf.layer, clf.representations(docs), labels)
    return float(np.exp(log_path).mean()), float(np.exp(log_slot).mean())


def _train(kind: str, docs: list[np.ndarray], labels: Any, num_words: int, num_labels: int, seed: int,
           settings: dict[str, Any]) -> tuple[Any, float]:
    from hsm import FastBowClassifier

    clf = FastBowClassifier(dim=settings["dim"], output=kind, arity=settings["arity"], lr=settings["lr"],
                            epochs=settings["epochs"], threads=1, seed=seed)
    start = time.perf_counter()
    clf.fit(docs, labels, num_words=num_words, num_labels=num_labels)
    return clf, time.perf_counter() - start


def _with_examples(trained: Ragged, old_rows: np.ndarray, picks: dict[int, np.ndarray]) -> tuple[np.ndarray, Ragged]:
    """The k-shot retrain's training documents and label sets: the base models' documents
    ``old_rows`` (their trained labels), then the example documents not among them in the order
    they were drawn, each example also carrying the new labels it was drawn for (``picks``: new
    label -> its example documents)."""
    drawn = np.concatenate([np.asarray(rows, dtype=np.int64) for rows in picks.values()])
    drawn_labels = np.concatenate([np.full(len(rows), label, dtype=np.int64) for label, rows in picks.items()])
    outside = drawn[~np.isin(drawn, old_rows)]
    rows = np.concatenate([old_rows, outside[np.sort(np.unique(outside, return_index=True)[1])]])
    position = np.full(len(trained), -1, dtype=np.int64)
    position[rows] = np.arange(rows.size)
    kept = trained.subset(rows)
    owners = np.concatenate([_owners(kept), position[drawn]])
    order = np.argsort(owners, kind="stable")
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(owners, minlength=rows.size), out=offsets[1:])
    return rows, Ragged(np.concatenate([kept.values, drawn_labels])[order], offsets)


def _seed_rows(train: Any, test: Any, num_words: int, seed: int, examples: tuple[int, ...], methods: list[str],
               settings: dict[str, Any], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every row of one held-out draw: the ceiling, then each method at each number of examples."""
    train_docs, train_sets = _rows(train)
    test_docs, test_sets = _rows(test)
    num_labels = train.num_labels
    multi_label = bool((train_sets.lengths() > 1).any() or (test_sets.lengths() > 1).any())
    eligible = np.flatnonzero(np.bincount(train_sets.values, minlength=num_labels) > 0)
    held = held_out_labels(num_labels, settings["held_out"], seed, eligible)
    # trained labels keep their order as ids 0 .. K_old - 1; the held-out ones follow, in order
    is_new = np.zeros(num_labels, dtype=bool)
    is_new[held] = True
    order = np.concatenate([np.flatnonzero(~is_new), held])
    new_id = np.empty(num_labels, dtype=np.int64)
    new_id[order] = np.arange(num_labels)
    old_count = num_labels - held.size
    y_train = Ragged(new_id[train_sets.values], train_sets.offsets)
    y_test = Ragged(new_id[test_sets.values], test_sets.offsets)
    trained_sets = _kept(y_train, y_train.values < old_count)  # what the models before the addition see
    old_rows = np.flatnonzero(trained_sets.lengths() > 0)
    old_docs, old_labels = [train_docs[i] for i in old_rows], trained_sets.subset(old_rows)
    is_new_doc = np.bincount(_owners(y_test)[y_test.values >= old_count], minlength=len(y_test)) > 0
    test_old = [test_docs[i] for i in np.flatnonzero(~is_new_doc)], y_test.subset(np.flatnonzero(~is_new_doc))
    test_new = [test_docs[i] for i in np.flatnonzero(is_new_doc)], y_test.subset(np.flatnonzero(is_new_doc))
    reach_rows, reach_labels = _pairs(test_new[1], np.arange(len(test_new[1])), old_count)
    reach_docs = [test_new[0][i] for i in reach_rows]

    def scores(top: Callable[[list[np.ndarray]], np.ndarray | None], new: bool = True) -> dict[str, Any]:
        """P@1 on the trained and the new test documents of a model whose top labels ``top`` gives."""
        out = {"p_at_1_old": _p_at_1(top(test_old[0]), test_old[1])}
        if new or multi_label:  # a model without the new labels scores on new documents only by their trained labels
            predicted = top(test_new[0])
            out["p_at_1_new"] = _p_at_1(predicted, test_new[1])
            if multi_label and new:
                out["p_at_1_new_added"] = _p_at_1(predicted, test_new[1], old_count)
        return out

    base = {"seed": seed, "held_out": int(held.size), "trained_labels": old_count,
            "test_old": len(test_old[0]), "test_new": len(test_new[0])}
    rows = []
    ceiling, seconds = _train("learned", train_docs, y_train, num_words, num_labels, seed, settings)
    rows.append({**base, "method": "retrain", "examples": None, "train_seconds": seconds,
                 **scores(lambda docs: _top(ceiling, docs))})
    log(f"seed {seed}: retrain on all {num_labels} labels: P@1 old {rows[-1]['p_at_1_old']:.1f}, "
        f"new {rows[-1]['p_at_1_new']:.1f} ({seconds:.0f} s)")
    trained = {}
    for kind in sorted({METHODS[m][1] for m in methods}):
        clf, seconds = _train(kind, old_docs, old_labels, num_words, old_count, seed, settings)
        trained[kind] = clf
        before = scores(lambda docs, clf=clf: _top(clf, docs), new=False)
        rows.append({**base, "method": f"{kind}-before", "examples": 0, "train_seconds": seconds,
                     "p_at_1_old": before["p_at_1_old"], "p_at_1_new": before.get("p_at_1_new")})
        name = "flat softmax" if kind == "flat" else f"{kind} tree"
        log(f"seed {seed}: {name} on {old_count} labels: P@1 old {rows[-1]['p_at_1_old']:.1f} ({seconds:.0f} s)")
    if "ncm" in methods:
        trained_means = _class_sums(trained["flat"], old_docs, old_labels, num_labels)
        rows.append({**base, "method": "ncm-before", "examples": 0,
                     **scores(lambda docs: _ncm_top(trained["flat"], trained_means[:old_count], docs), new=False)})
    draw = np.random.default_rng(seed + 1000)
    # a sample of the training documents the model already serves, which new slots are calibrated against
    sample = np.sort(draw.choice(old_rows, size=min(settings["reference"], old_rows.size), replace=False))
    reference = [train_docs[i] for i in sample] if settings["reference"] else None
    rehearsal_rows, rehearsal_labels = _pairs(trained_sets, sample)  # a document once per trained label
    owners = _owners(y_train)
    shuffled = {label: draw.permutation(owners[y_train.values == label]) for label in range(old_count, num_labels)}
    for count in examples:
        picks = {label: shuffled[label][:count] for label in range(old_count, num_labels)}
        docs_per_label = [[train_docs[i] for i in rows_of] for rows_of in picks.values()]
        given = {"examples_mean": float(np.mean([len(d) for d in docs_per_label]))} if multi_label else {}
        for method in methods:
            how, kind = METHODS[method]
            row = {**base, "method": method, "examples": count}
            start = time.perf_counter()
            if how == "retrain":
                picked, labels = _with_examples(trained_sets, old_rows, picks)
                clf, _ = _train(kind, [train_docs[i] for i in picked], labels, num_words, num_labels, seed, settings)
            elif how == "imprint":
                clf = _imprinted(trained[kind], docs_per_label)
            elif how == "ncm":
                means = trained_means.clone()
                for label, docs in zip(range(old_count, num_labels), docs_per_label):
                    means[label] = _class_sums(trained[kind], docs, _one_label(len(docs)), 1)[0]
                seconds = time.perf_counter() - start
                row.update(seconds_per_label=seconds / held.size,
                           **scores(lambda docs, means=means: _ncm_top(trained[kind], means, docs)), **given)
                rows.append(row)
                log(f"seed {seed}: ncm, {count} example(s) per new label: P@1 old {row['p_at_1_old']:.1f}, "
                    f"new {row['p_at_1_new']:.1f}")
                continue
            else:
                clf = copy.deepcopy(trained[kind])
                local = {}
                if method == "objective-local" and sample.size:
                    local = {"local_steps": settings["local_steps"], "local_lr": settings["local_lr"],
                             "rehearsal": ([train_docs[sample[i]] for i in rehearsal_rows], rehearsal_labels)}
                clf.add_labels(docs_per_label, placement=how, seed=seed, reference_docs=reference, **local)
            seconds = time.perf_counter() - start
            row.update(seconds_per_label=seconds / held.size, **scores(lambda docs, clf=clf: _top(clf, docs)))
            if how in ("objective", "random"):
                row["path_to_node_probability"], row["slot_probability"] = _reach(clf, reach_docs, reach_labels)
            row.update(given)
            rows.append(row)
            log(f"seed {seed}: {method}, {count} example(s) per new label: P@1 old {row['p_at_1_old']:.1f}, "
                f"new {row['p_at_1_new']:.1f}; {1000 * seconds / held.size:.1f} ms per label")
    return rows


def _imprinted(flat: Any, docs_per_label: list[list[np.ndarray]]) -> Any:
    """A copy of the flat classifier with a row imprinted for each new label (module docstring)."""
    import torch

    from hsm import FlatSoftmax

    clf = copy.deepcopy(flat)
    trained = clf.layer.linear
    rows = []
    for docs in docs_per_label:
        h = torch.nn.functional.normalize(clf.representations(docs), dim=1).mean(0)
        rows.append(torch.nn.functional.normalize(h, dim=0))
    grown = FlatSoftmax(trained.in_features, trained.out_features + len(rows), bias=trained.bias is not None)
    with torch.no_grad():
        scale = trained.weight.norm(dim=1).mean()
        grown.linear.weight.copy_(torch.cat([trained.weight, scale * torch.stack(rows)]))
        if trained.bias is not None:
            grown.linear.bias.copy_(torch.cat([trained.bias, trained.bias.mean().repeat(len(rows))]))
    clf.layer = grown
    return clf


def _one_label(count: int) -> Ragged:
    """``count`` documents of the one label 0."""
    return Ragged(np.zeros(count, dtype=np.int64), np.arange(count + 1, dtype=np.int64))


def _class_sums(flat: Any, docs: list[np.ndarray], labels: Ragged, count: int) -> Any:
    """[count, d]: per label, the sum of the normalised representations (the flat model's) of the
    documents that carry it (``labels``: their label sets)."""
    import torch

    h = torch.nn.functional.normalize(flat.representations(docs), dim=1)
    return torch.zeros(count, h.shape[1]).index_add_(0, torch.as_tensor(labels.values),
                                                      h[torch.as_tensor(_owners(labels))])


def _ncm_top(flat: Any, sums: Any, docs: list[np.ndarray]) -> np.ndarray | None:
    """The nearest class mean (cosine) of each document on the flat model's representations, from
    the class sums of :func:`_class_sums` (a row per label); None for no documents."""
    import torch

    if not docs:
        return None
    normalize = torch.nn.functional.normalize
    scores = normalize(flat.representations(docs), dim=1) @ normalize(sums, dim=1).T
    return scores.argmax(1).numpy()


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (method, examples): the mean and spread over seeds of P@1 on new and trained documents,
    the loss of the trained ones (P@1 of the model the method starts from, trained without the new
    labels, minus after), and the new documents' P@1 as a share of the full retrain's and (where it
    ran) of the k-shot retrain's at the same k. On multi-label data also the means of P@1 on the
    new documents counting their held-out labels only (``p_at_1_new_added_mean``), of the starting
    model's P@1 on them (``p_at_1_new_before_mean``) and of the examples per new label."""
    by_seed = {(r["seed"], r["method"]): r for r in rows if r.get("examples") in (None, 0)}
    kshot = {(r["seed"], r["examples"]): r for r in rows if r["method"] == "kshot-retrain"}
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("examples"):
            groups.setdefault((r["method"], r["examples"]), []).append(r)
    out = []
    for (method, count), members in sorted(groups.items(), key=lambda item: (item[0][1], list(METHODS).index(item[0][0]))):
        before = "ncm-before" if method == "ncm" else f"{METHODS[method][1]}-before"
        new = np.array([r["p_at_1_new"] for r in members])
        loss = np.array([by_seed[(r["seed"], before)]["p_at_1_old"] - r["p_at_1_old"] for r in members])
        share = np.array([r["p_at_1_new"] / by_seed[(r["seed"], "retrain")]["p_at_1_new"] for r in members])
        sd = lambda a: float(a.std(ddof=1)) if a.size > 1 else None  # noqa: E731
        summary = {"kind": "summary", "method": method, "examples": count, "seeds": len(members),
                   "p_at_1_new_mean": float(new.mean()), "p_at_1_new_sd": sd(new),
                   "old_loss_mean": float(loss.mean()), "old_loss_max": float(loss.max()),
                   "share_of_retrain_mean": float(share.mean()),
                   "seconds_per_label_max": float(max(r["seconds_per_label"] for r in members))}
        if all((r["seed"], count) in kshot and kshot[(r["seed"], count)]["p_at_1_new"] > 0 for r in members):
            summary["share_of_kshot_retrain_mean"] = float(np.mean(
                [r["p_at_1_new"] / kshot[(r["seed"], count)]["p_at_1_new"] for r in members]))
        if all("path_to_node_probability" in r for r in members):
            summary["path_to_node_probability_mean"] = float(np.mean([r["path_to_node_probability"] for r in members]))
            summary["slot_probability_mean"] = float(np.mean([r["slot_probability"] for r in members]))
        if all("p_at_1_new_added" in r for r in members):  # multi-label data
            added = np.array([r["p_at_1_new_added"] for r in members])
            summary.update(p_at_1_new_added_mean=float(added.mean()), p_at_1_new_added_sd=sd(added),
                           p_at_1_new_before_mean=float(np.mean(
                               [by_seed[(r["seed"], before)]["p_at_1_new"] for r in members])),
                           examples_mean=float(np.mean([r["examples_mean"] for r in members])))
        out.append(summary)
    return out


def parse_options(scale: str, options: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], list[str],
                                                                 dict[str, Any], dict[str, Any]]:
    """(seeds, examples, methods, data, settings) from ``-o KEY=VALUE`` options at ``scale``;
    ``data`` names the data set and its slice (``max_books`` of ``gutenberg-books``; ``train_limit``
    and ``test_limit`` of ``cooking``). ValueError naming a bad or unknown option."""
    quick = check_scale(scale) == "quick"
    options = dict(options)
    seeds = option_ints("seeds", options.pop("seeds", QUICK["seeds"] if quick else (0, 1, 2)), minimum=0)
    examples = option_ints("examples", options.pop("examples", QUICK["examples"] if quick else (1, 5, 20)), minimum=1)
    method_names = options.pop("methods", ",".join(PLACEMENTS))
    methods = [option_choice("methods", m, tuple(METHODS)) for m in str(method_names).split(",") if m]
    name = option_choice("data", options.pop("data", DATA[0]), DATA)
    slices = ("max_books",) if name == "gutenberg-books" else ("train_limit", "test_limit")
    misplaced = sorted(set(options) & ({"max_books", "train_limit", "test_limit"} - set(slices)))
    if misplaced:
        raise ValueError(f"option(s) {', '.join(misplaced)} do not apply to data={name}: use "
                         f"{' and '.join(slices)} to cut {name}")
    data: dict[str, Any] = {"data": name}
    for key in slices:
        data[key] = option_int(key, options.pop(key, QUICK[key] if quick else None), minimum=2, allow_none=True)
    settings = {"dim": option_int("dim", options.pop("dim", DEFAULTS["dim"]), minimum=1),
                "arity": option_int("arity", options.pop("arity", DEFAULTS["arity"]), minimum=2),
                "lr": option_float("lr", options.pop("lr", DEFAULTS["lr"]), minimum=0.0),
                "epochs": option_int("epochs", options.pop("epochs", DEFAULTS["epochs"]), minimum=1),
                "held_out": option_float("held_out", options.pop("held_out", DEFAULTS["held_out"]), minimum=0.0,
                                         maximum=0.5),
                "reference": option_int("reference", options.pop("reference", DEFAULTS["reference"]), minimum=0),
                "local_steps": option_int("local_steps", options.pop("local_steps", DEFAULTS["local_steps"]), minimum=1),
                "local_lr": option_float("local_lr", options.pop("local_lr", DEFAULTS["local_lr"]), minimum=1e-9)}
    if options:
        raise ValueError(f"unknown option(s) for label-addition: {', '.join(sorted(options))}")
    if "objective-local" not in methods:  # settings no run uses stay out of the file's configuration
        del settings["local_steps"], settings["local_lr"]
    return seeds, examples, methods, data, settings


def _load(data: dict[str, Any]) -> Any:
    """The data set ``data`` names (:func:`parse_options`), cut to its slice: ``max_books`` books, or
    seeded subsets of ``train_limit`` training and ``test_limit`` test documents (the classification
    tables' subsets)."""
    from hsm_lab.experiments.classification import load_classification_data
    from hsm_lab.experiments.classification.data import _subset_rows

    loaded = load_classification_data(data["data"], max_books=data.get("max_books"))
    loaded = _subset_rows(loaded, data.get("train_limit"), "train", 0)
    return _subset_rows(loaded, data.get("test_limit"), "test", 1)


@experiment("label-addition", "Labels added to a trained classifier without retraining (J_n placement, random, "
            "Huffman) against retraining; gutenberg-books or cooking",
            "results/classification/label-addition-gutenberg-books.json")
def label_addition(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                   **options: Any) -> Path:
    """The held-out-label experiment (module docstring). Options: ``data`` (``gutenberg-books``, the
    default, or ``cooking``), ``seeds`` (default 0,1,2; quick 0), ``examples`` (per new label,
    default 1,5,20; quick 1,5), ``methods`` (any of :data:`METHODS`; default the three placements,
    :data:`PLACEMENTS`), ``max_books`` (``gutenberg-books``; quick 40), ``train_limit`` and
    ``test_limit`` (``cooking``'s seeded subsets; quick 3,000 and 1,000), ``dim``, ``arity``, ``lr``,
    ``epochs`` and ``held_out`` (the share of labels, default 0.1), ``reference`` (trained labels'
    training documents the new slots are calibrated against and ``objective-local`` rehearses,
    default 2,000; 0 for none), ``local_steps`` and ``local_lr`` (``objective-local``'s, default 20 and
    0.1). A stopped run resumes from its partial file."""
    from hsm_lab.experiments.classification import encode_data

    quick = check_scale(scale) == "quick"
    check_device(device)
    if device != "cpu":
        raise ValueError(f"the compiled classifier runs on the CPU, got device={device!r}")
    seeds, examples, methods, data_options, settings = parse_options(scale, options)
    suffix = "" if not quick else "-quick"
    out = Path(out) if out is not None else output_path(f"results/classification/label-addition-"
                                                        f"{data_options['data']}{suffix}.json")
    check_replace(out, scale, force)
    log = lambda message: print(message, flush=True)  # noqa: E731
    start = time.perf_counter()
    data = _load(data_options)
    vocab, train, test = encode_data(data)
    config = {"experiment": "label-addition", "data": data.name,
              **{key: value for key, value in data_options.items() if key != "data"}, "seeds": list(seeds),
              "examples": list(examples), "methods": methods, **settings, "threads": 1,
              "train_passages": len(train), "test_passages": len(test), "labels": train.num_labels}
    parts = ResumableParts(out, config, "partial label-addition file", log=log)
    rows = []
    for seed in seeds:
        rows += parts.run(f"seed{seed}", lambda seed=seed: _seed_rows(train, test, len(vocab), seed, examples, methods,
                                                                       settings, log))
    records = [dict(r, kind="run") for r in rows] + summarise(rows)
    prov = provenance(config=config, wall_time_s=time.perf_counter() - start, scale=scale, threads_note=THREADS_NOTE)
    path = write_results(out, records, prov, force=force)
    parts.finish()
    return path
