"""The result records of the sampled-softmax experiments and how to read them back: one record per
method and seed of Figs. 1 and 2 (:func:`_fig_record`), the test-perplexity and ms/batch records of
each ``lm-ptb-sampling`` run and of its step benchmark, and :func:`lm_rows`, the layout the
sampled-softmax chapter (``notebooks/sampling_softmax.md``) reads them in."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hsm_lab.results import make_record, output_path

from hsm_lab.experiments.sampling.presets import LM_METHOD_NAMES

__all__ = ["lm_rows"]


def _default_path(out: Path | str | None, default: str) -> Path:
    """``out``, else ``default`` under :func:`hsm_lab.results.output_root` (not the committed results)."""
    return output_path(default, out)


def _fig_record(run: dict[str, Any], figure: str, label: str, spec: dict[str, Any], seed: int, lr: float,
                true_ll: float) -> dict[str, Any]:
    """The record of one Fig. 1 / Fig. 2 run (:func:`~.training.train_softmax_regression`'s output):
    its final exact log-likelihood as the value, the curves of panels (a) and (b) per evaluation
    point; the exact run has no bias against itself (``None``)."""
    return make_record(
        None, run["loglik"][-1] if run["loglik"] else float("nan"), figure=figure, method=label, seed=seed,
        alpha=spec.get("alpha"), lr=lr, final_loglik=run["loglik"][-1] if run["loglik"] else None,
        true_model_loglik=true_ll, diverged=run["diverged"], scores_per_batch=run["scores_per_batch"],
        iteration=run["iteration"], loglik=run["loglik"], bias_vs_true=run["bias_vs_true"],
        bias_vs_exact=run["bias_vs_exact"] if label != "exact" else None,
        param_diff_vs_exact=run["param_diff_vs_exact"] if label != "exact" else None,
    )


def _lm_common(corpus, cfg: dict[str, Any], scale: str) -> dict[str, Any]:
    """The fields every ``lm-ptb-sampling`` record shares: data, model and scale."""
    return {"dataset": "ptb", "vocab_size": corpus.vocab_size, "train_tokens": int(corpus.train.numel()),
            "valid_tokens": int(corpus.valid.numel()), "test_tokens": int(corpus.test.numel()),
            "context": cfg["context"], "dim": cfg["dim"], "batch_size": cfg["batch_size"], "scale": scale,
            "beyond_paper": True}


def _run_model_name(kind: str, k: int) -> str:
    return LM_METHOD_NAMES[kind] + (f", K = {k}" if k else "")


def _diverged_record(label: str, kind: str, k: int, lr: float, cfg: dict[str, Any], common: dict[str, Any],
                     why: str) -> dict[str, Any]:
    """The record of an ``lm-ptb-sampling`` run that diverged: NaN perplexity and why."""
    return make_record(None, math.nan, measure="test_perplexity", diverged=why,
                       **dict(common, model=_run_model_name(kind, k), run=label, method=kind,
                              num_negatives=k or None, lr=lr, epochs=cfg["epochs"]))


def _sampling_run_records(run, label: str, kind: str, k: int, lr: float, arity: int, cfg: dict[str, Any],
                          common: dict[str, Any]) -> list[dict[str, Any]]:
    """The test-perplexity and ms/batch records of one finished lm-ptb-sampling run."""
    fields = dict(common, model=_run_model_name(kind, k), run=label, method=kind,
                  num_negatives=k or None, lr=lr, epochs=cfg["epochs"], per_epoch=run.epochs, wall_time_s=run.seconds,
                  trained_on=run.device, arity=arity if kind == "random" else None, diverged=None)
    return [make_record(None, run.test_perplexity, measure="test_perplexity", valid_perplexity=run.valid_perplexity,
                        **fields),
            make_record(None, run.train_ms_per_batch, measure="train_ms_per_batch", **fields),
            make_record(None, run.test_ms_per_batch, measure="test_ms_per_batch", **fields)]



def _bench_records(bench: dict[str, dict[str, Any]] | None, common: dict[str, Any]) -> list[dict[str, Any]]:
    return [make_record(None, spec["ms_per_step"], measure="bench_train_ms_per_step", run=label, model=spec["model"],
                        method=spec["output"], num_negatives=spec.get("num_negatives"), sparse=spec.get("sparse"),
                        ms_per_step_mean=spec["ms_per_step_mean"], steps=spec["steps"], **common)
            for label, spec in (bench or {}).items()]



def lm_rows(payload: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{run: {measure: record}}`` of an ``lm-ptb-sampling`` result file (benchmark records under
    ``bench:<run>``)."""
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for record in payload["records"]:
        key = ("bench:" if record["measure"] == "bench_train_ms_per_step" else "") + record["run"]
        rows.setdefault(key, {})[record["measure"]] = record
    return rows
