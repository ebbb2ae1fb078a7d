"""The table's result records (one per row, the learned-minus-Huffman gains) and the markdown
tables the classification chapter shows: ours laid out like ICML Table 1 / supplement Table 3,
and the paper's YFCC100M rows as printed."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hsm_lab.results import make_record

from hsm_lab.experiments.classification.presets import OUTPUTS

__all__ = ["DEPTH_LIMIT_OUTPUTS", "depth_limit_markdown", "depth_limit_runs", "fast_runs", "paper_table_markdown",
           "table_markdown"]

_MODEL_NAMES = {"flat": "Flat softmax", "huffman": "Huffman tree", "learned": "Learned tree",
                "learned_fixed_depth": "Learned tree, fixed depth"}


def _paper_key(table: str, dim: int, model: str, arity: int | None) -> str | None:
    from hsm_lab import paper

    slug = {"Huffman tree": "huffman_tree", "Learned tree": "learned_tree", "fastText": "fasttext"}.get(model)
    if slug is None or dim not in (50, 200):
        return None
    key = f"icml2017.{table}.d{dim}.{slug}" + (f".arity{arity}" if arity else "")
    return key if f"{key}.p_at_1" in paper.NUMBERS else None


def _describe(output: str) -> tuple[str, str, int | None]:
    """(model name as in the paper's table, implementation, arity)."""
    if output in OUTPUTS:
        kind, arity = OUTPUTS[output]
        return _MODEL_NAMES[kind], "hsm", arity
    if output == "fasttext-hs":
        return "fastText", "fastText", 2
    if output == "fasttext-softmax":
        return "fastText softmax", "fastText", None
    return "VW log_multi", "Vowpal Wabbit", 2


def _record(table: str, dim: int, row: dict[str, Any], common: dict[str, Any]) -> dict[str, Any]:
    model, implementation, arity = _describe(row["output"])
    # the paper's "FastText" row is the binary Huffman tree (fastText -loss hs): ours and fastText's map to it
    paper_model = "fastText" if (row["output"] in ("huffman2", "fasttext-hs")) else model
    key = _paper_key(table, dim, paper_model, arity)
    fields = {"table": table, "d": dim, "model": model, "implementation": implementation, "arity": arity,
              "paper_row": key, **common, **row}
    if row.get("skipped"):
        return {"claim": None, "metric": "skipped", **fields}  # no value: nothing was measured
    # Not a `claim`: the stand-ins are not YFCC100M, so these numbers must not sit beside the paper's on
    # the landing page as if they reproduced it. With the real YFCC100M file they would (claim=paper_row).
    claim = f"{key}.p_at_1" if (key and not common["stand_in"]) else None
    return make_record(claim, row["p_at_1"], metric="P@1 (%)", **fields)


def _gains(table: str, records: list[dict[str, Any]], common: dict[str, Any]) -> list[dict[str, Any]]:
    """Learned minus Huffman P@1 at each (d, arity): the paper's "up to 3.3 points" claim."""
    by = {(r["d"], r["output"]): r for r in records if not r.get("skipped")}
    gains = []
    for (dim, output), row in sorted(by.items()):
        if OUTPUTS.get(output, (None,))[0] != "learned":  # the paper's rows only
            continue
        base = by.get((dim, output.replace("learned", "huffman")))
        if base is None:
            continue
        gains.append(make_record(None, row["p_at_1"] - base["p_at_1"], metric="P@1 gain, learned - Huffman (points)",
                                 table=table, d=dim, arity=row["arity"], model="gain", output=f"gain{row['arity']}",
                                 **common))
    return gains


_ROW_ORDER = ["fasttext-softmax", "vw-log_multi", "flat", "fasttext-hs", "huffman2", "huffman5", "huffman20",
              "learned5", "learned20", "huffman28", "learned20-fixed-depth", "learned28-fixed-depth"]


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def table_markdown(records: Sequence[dict[str, Any]], recall: bool = False) -> str:
    """Our rows laid out like the paper's Table 1 (``recall=False``) or Table 3 (with R@1)."""
    head = ["d", "Model", "Implementation", "Arity", "P@1"] + (["R@1"] if recall else []) + \
        ["Train", "Test", "Nodes visited", "Expected depth", "LR"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = [r for r in records if r.get("model") != "gain"]
    rows.sort(key=lambda r: (r["d"], _ROW_ORDER.index(r["output"]) if r["output"] in _ROW_ORDER else 99))
    for r in rows:
        arity = "-" if r.get("arity") is None else str(r["arity"])
        if r.get("skipped"):
            cells = [str(r["d"]), r["model"], r["implementation"], arity, f"skipped: {r['skipped']}"] + \
                [""] * (len(head) - 5)
        else:
            visited = r.get("nodes_visited")
            cells = [str(r["d"]), r["model"], r["implementation"], arity, f"{r['p_at_1']:.1f}"]
            cells += [f"{r['r_at_1']:.2f}"] if recall else []
            cells += [_seconds(r.get("train_seconds")), _seconds(r.get("test_seconds")),
                      "-" if visited is None else f"{visited:.1f}",
                      "-" if r.get("expected_depth") is None else f"{r['expected_depth']:.2f}",
                      f"{r['lr']:g}"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def paper_table_markdown(table: str = "table1") -> str:
    """The paper's YFCC100M rows (ICML Table 1, or supplement Table 3 with recall), as printed."""
    from hsm_lab import paper

    recall = table == "table3"
    head = ["d", "Model", "Arity", "P@1"] + (["Recall"] if recall else []) + ["Train", "Test"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for number in paper.table(f"icml2017.{table}"):
        if not number.key.endswith(".p_at_1"):
            continue
        base = number.key[: -len(".p_at_1")]
        s = number.setting
        rec = paper.NUMBERS.get(f"{base}.recall")
        cells = [str(s["d"]), s["model"], "-" if s["arity"] is None else str(s["arity"]), f"{number.value:g}"]
        cells += [("-" if rec is None else f"{rec.value:g}")] if recall else []
        cells += [paper.get(f"{base}.train_time").printed, paper.get(f"{base}.test_time").printed]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def fast_runs(data: str, d: int, epochs: int = 5, root: str | Path | None = None) -> dict[str, dict[int, dict]]:
    """The compiled trainer's table runs of one stand-in at dimension ``d``: ``{output: {seed:
    record}}`` from ``classification/table1-<data>-fast-*.json`` under ``root`` (default: the
    committed results) trained for ``epochs`` epochs. The timing runs (``-peers-`` files) repeat
    two tree rows of seed 0: only their fastText rows are taken; the depth-limit runs (one thread,
    :func:`depth_limit_runs`) are not among them. The classification chapter's table and the
    landing page's learned-minus-Huffman verdicts both read these runs."""
    def keep(path: Path, config: dict, record: dict) -> bool:
        return (DEPTH_LIMIT_TAG not in path.stem and config["epochs"] == epochs and record.get("d") == d
                and ("-peers-" not in path.stem or record["output"].startswith("fasttext")))

    return _runs_by_output_and_seed(root, f"table1-{data}-fast-*.json", keep)


def _runs_by_output_and_seed(root: str | Path | None, pattern: str, keep) -> dict[str, dict[int, dict]]:
    """``{output: {seed: record}}`` of the table runs in the result files ``classification/<pattern>``
    under ``root`` (default: the committed results): every trained row (not the gain rows nor the
    skipped ones) for which ``keep(path, config, record)`` holds."""
    from hsm_lab.results import default_results_root, load_results

    folder = Path(root if root is not None else default_results_root()) / "classification"
    out: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob(pattern)):
        payload = load_results(path)
        config = payload["provenance"]["config"]
        for record in payload["records"]:
            if record.get("model") != "gain" and not record.get("skipped") and keep(path, config, record):
                out.setdefault(record["output"], {})[config["seed"]] = record
    return out


#: the file-name part of the depth-limit runs: ``table1-<data>-fast-d50-depth-limit-seed<k>.json``
DEPTH_LIMIT_TAG = "-depth-limit-"
#: their rows, in the order the appendix shows them
DEPTH_LIMIT_OUTPUTS = ("huffman20", "learned20", "learned20-fixed-depth", "huffman28", "learned28-fixed-depth")


def depth_limit_runs(data: str, root: str | Path | None = None) -> dict[str, dict[int, dict]]:
    """``{output: {seed: record}}`` of the depth-limit runs of one stand-in (the Huffman trees, the
    learned 20-ary tree and the learned trees of fixed depth, Algorithm 3, in one single-thread run
    per seed, so that their test times compare)."""
    return _runs_by_output_and_seed(root, f"table1-{data}-fast-d50{DEPTH_LIMIT_TAG}seed*.json",
                                    lambda path, config, record: True)


def depth_limit_markdown(runs: dict[str, dict[str, dict[int, dict]]]) -> str:
    """The depth-limit table: per stand-in and tree, P@1 over the seeds, the mean depth of the test
    labels and the largest depth of the tree (over the seeds), the node softmaxes per test example
    (greedy descent, then all of the exact search) and the test time over the same seed's 20-ary
    Huffman tree (lowest to highest over the seeds)."""
    lines = ["| data | tree | M | P@1 mean (sd) | depth: test labels (tree's largest) "
             "| node softmaxes: greedy / exact | test time / Huffman M=20 |", "|---|---|---|---|---|---|---|"]
    for data, by_output in runs.items():
        for output in DEPTH_LIMIT_OUTPUTS:
            seeds = by_output.get(output, {})
            if not seeds:
                continue
            rows = list(seeds.values())
            p = np.array([r["p_at_1"] for r in rows])
            ratio = np.array([r["test_seconds"] / by_output["huffman20"][s]["test_seconds"] for s, r in seeds.items()])
            kind, arity = OUTPUTS[output]
            name = {"huffman": "Huffman", "learned": "learned, Alg. 2", "learned_fixed_depth": "fixed depth, Alg. 3"}[kind]
            mean = lambda key: float(np.mean([r[key] for r in rows]))  # noqa: E731
            lines.append(f"| {data} | {name} | {arity} | {p.mean():.1f} ({p.std(ddof=1):.2f}) "
                         f"| {mean('expected_depth'):.2f} ({max(r['tree_max_depth'] for r in rows)}) "
                         f"| {mean('nodes_visited_greedy'):.1f} / "
                         f"{mean('nodes_visited'):.1f} | {ratio.min():.2f} - {ratio.max():.2f} |")
    return "\n".join(lines)
