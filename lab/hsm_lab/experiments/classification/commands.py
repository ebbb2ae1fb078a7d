"""The registered experiments ``icml-table1`` and ``icml-table3`` (``python -m hsm run icml-table1
-o data=cooking ...``): each checks its scale, device and options before training, runs the table
(:func:`~.table.run_table`) and writes its result file."""
from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch

from hsm_lab.experiments import check_device, experiment
from hsm_lab.results import check_replace, load_results, output_path, provenance, write_results

from hsm_lab.experiments.classification.config import TableConfig, _config_json, _parse_options
from hsm_lab.experiments.classification.data import _data_slug
from hsm_lab.experiments.classification.table import run_table

__all__ = ["icml_table1", "icml_table3", "scale_label", "threads_note"]


def _default_out(table: str, scale: str, data: str) -> Path:
    """Where a table goes without ``out``: under :func:`hsm_lab.results.output_root` (not the committed
    ``results/``), ``classification/<table>-<data>[-quick].json``."""
    suffix = "" if scale == "full" else "-quick"
    return output_path(f"results/classification/{table}-{_data_slug(data)}{suffix}.json")


def _run_command(table: str, scale: str, device: str, out: Path | str | None, options: dict[str, Any],
                 force: bool = False) -> Path:
    """Check everything (scale, options, device, no larger-scale result at ``out`` unless
    ``force``: ValueError), then run the table and write its result file."""
    config = _parse_options(scale, options)
    device = check_device(device)
    name = "table1" if table == "table1" else "table3"
    out = Path(out) if out is not None else _default_out(name, scale, config.data)
    check_replace(out, scale, force)
    start = time.perf_counter()
    records = run_table(config, table, device=device, out=out)
    prov = provenance(config={**_config_json(config), "table": table, "device": device,
                              "torch_threads": torch.get_num_threads()},
                      wall_time_s=time.perf_counter() - start, scale=scale_label(scale, config),
                      threads_note=threads_note(config))
    return write_results(out, records, prov, force=force)


def threads_note(config: TableConfig) -> str:
    """What a table's ``threads`` option counts beside torch's threads (``provenance.threads``),
    which :func:`~.table.run_table` sets to 1: the file records both, and says why they differ."""
    if config.trainer == "fast":
        return ("config.threads is the compiled trainer's Hogwild threads, on which fastText's rows train too "
                "(None: torch's count); threads is torch's intra-op threads, which the table sets to 1 for testing")
    return ("config.threads is the compiled trainer's Hogwild threads, unused by the PyTorch trainer (None); the "
            "rows train and test on torch's threads (threads, which the table sets to 1), fastText's rows on 1")


def scale_label(scale: str, config: TableConfig) -> str:
    """The result file's scale label: ``scale``, or at full scale on a subset of the rows
    (``train_limit``, ``test_limit``) ``"full, reduced: train_limit=..., test_limit=... (of N
    training passages)"`` with the data set's full training size N, so that a slice is never
    labelled plain ``full``."""
    limits = [f"{key}={getattr(config, key)}" for key in ("train_limit", "test_limit") if getattr(config, key)]
    if scale != "full" or not limits:
        return scale
    from hsm_lab.experiments.classification.data import load_classification_data

    data = load_classification_data(config.data, config.test, config.max_books, config.min_label_count)
    unit = "passages" if config.data == "gutenberg-books" else "examples"
    return f"full, reduced: {', '.join(limits)} (of {len(data.train_texts):,} training {unit})"


@experiment("icml-table1", "ICML Table 1: P@1, train/test time; flat, Huffman (2, 5, 20), learned (5, 20), "
            "fastText, VW; data=cooking|gutenberg-books|<fastText file>",
            "results/classification/table1-cooking.json")
def icml_table1(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                **options: Any) -> Path:
    """ICML Table 1 on ``data`` (a stand-in, or a YFCC100M-style fastText file). ``out`` None:
    ``hsm-results/classification/table1-<data>[-quick].json``; a full-scale file at ``out`` is not
    replaced by a quick run unless ``force``. ValueError for a bad scale, device or option."""
    return _run_command("table1", scale, device, out, options, force)


@experiment("icml-table3", "ICML supplement Table 3: Table 1 with recall at 1",
            "results/classification/table3-cooking.json")
def icml_table3(scale: str = "quick", device: str = "cpu", out: Path | str | None = None, force: bool = False,
                **options: Any) -> Path:
    """ICML supplement Table 3 (Table 1 with R@1). Every Table 1 run records recall too, so when
    the Table 1 result file of the same data, scale and options exists (``reuse=auto``, default)
    its rows are re-issued as Table 3 rows instead of training everything again; ``reuse=no``
    re-runs."""
    options = dict(options)
    reuse = str(options.pop("reuse", "auto")).lower()
    if reuse not in ("auto", "no"):
        raise ValueError(f"option reuse: reuse must be 'auto' or 'no', got {reuse!r}")
    config = _parse_options(scale, options)
    check_device(device)
    if out is not None and Path(out).name.startswith("table3"):
        source = Path(out).with_name(Path(out).name.replace("table3", "table1", 1))
    else:
        source = _default_out("table1", scale, config.data)
    if reuse == "auto":
        reissued = _reissue_table1(source, config, out, force)
        if reissued is not None:
            return reissued
    return _run_command("table3", scale, device, out, options, force)


def _reissue_table1(source: Path, config: TableConfig, out: Path | str | None, force: bool) -> Path | None:
    """The Table 1 result file ``source`` written again as Table 3 (every Table 1 row records R@1
    too) when it was run with ``config``; None when it is missing, unreadable (a warning names
    it) or from other options, so that Table 3 is trained instead."""
    if not source.exists():
        return None
    try:
        payload = load_results(source)
    except ValueError as exc:  # unreadable: warn by name and train instead
        warnings.warn(f"ignoring unreadable Table 1 file {source} ({exc}); training Table 3 instead", stacklevel=3)
        return None
    cfg = {k: v for k, v in payload["provenance"]["config"].items() if k not in ("table", "device", "torch_threads")}
    if cfg != _config_json(config):
        return None
    records = []
    for record in payload["records"]:
        record = dict(record, table="table3")
        if record.get("paper_row"):
            record["paper_row"] = record["paper_row"].replace(".table1.", ".table3.")
        if record.get("claim"):
            record["claim"] = record["claim"].replace(".table1.", ".table3.")
        records.append(record)
    out = Path(out) if out is not None else source.with_name(source.name.replace("table1", "table3"))
    prov = dict(payload["provenance"], config={**payload["provenance"]["config"], "table": "table3",
                                               "derived_from": str(source)})
    return write_results(out, records, prov, force=force)
