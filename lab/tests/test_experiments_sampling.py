"""The seed-004 experiments (hsm_lab.experiments.sampling) at a tiny scale: structure and invariants."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hsm_lab.experiments import sampling as E
from hsm_lab.results import load_results

TINY = dict(num_points="120", dim="8", num_classes="30", batch_size="10", num_negatives="5",
            iterations="20", eval_every="10", seeds="0", lr_pick_iterations="10")


def test_problem_is_drawn_from_the_model():
    problem = E.make_problem(num_points=500, dim=5, num_classes=7, score_scale=2.0, seed=3)
    assert problem.x.shape == (500, 5) and problem.y.shape == (500,)
    assert int(problem.y.min()) >= 0 and int(problem.y.max()) < 7
    again = E.make_problem(num_points=500, dim=5, num_classes=7, score_scale=2.0, seed=3)
    assert torch.equal(problem.y, again.y)
    with pytest.raises(ValueError):
        E.make_problem(num_points=0)


@pytest.mark.parametrize("method", ["exact", "importance", "bernoulli", "ranking", "blackout", "nce", "negative_sampling"])
def test_every_method_trains_and_starts_from_the_shared_initialisation(method):
    problem = E.make_problem(num_points=100, dim=6, num_classes=20, seed=0)
    run = E.train_softmax_regression(problem, method, iterations=10, lr=1e-3, batch_size=10, num_negatives=4,
                                     eval_every=5)
    assert run["iteration"] == [0, 5, 10]
    assert run["loglik"][0] == pytest.approx(-math.log(20), abs=1e-5)  # W = 0: uniform predictions
    assert all(math.isfinite(v) for v in run["loglik"])
    assert run["scores_per_batch"] > 0
    if method == "exact":
        assert run["scores_per_batch"] == 10 * 20


def test_exact_and_normalisation_runs_agree_when_negatives_cover_every_class():
    """Bernoulli sampling with K = |complement| has b = 1 (alpha = 0): exactly the exact gradient."""
    problem = E.make_problem(num_points=60, dim=4, num_classes=8, seed=1)
    exact = E.train_softmax_regression(problem, "exact", 12, 1e-2, batch_size=6, eval_every=6)
    full = E.train_softmax_regression(problem, "bernoulli", 12, 1e-2, batch_size=6, eval_every=6, num_negatives=7,
                                      explicit="target", reference=exact["weights"])
    assert full["loglik"] == pytest.approx(exact["loglik"], abs=1e-4)


def test_fig2_result_file(tmp_path):
    path = E.run_fig2(scale="quick", out=tmp_path / "fig2.json", **TINY)
    payload = load_results(path)
    records = payload["records"]
    methods = {r["method"] for r in records}
    assert methods == {"exact", "importance", "bernoulli", "ranking_alpha1", "ranking_alpha_logC", "blackout", "nce",
                       "negative_sampling"}
    for record in records:
        assert len(record["iteration"]) == len(record["loglik"]) or record["diverged"]
        assert record["loglik"][0] == pytest.approx(-math.log(30), abs=1e-4)
        if record["method"] != "exact":
            assert record["bias_vs_exact"][0] <= -29  # same initialisation: no difference at iteration 0
    assert payload["provenance"]["config"]["log_C_minus_1"] == pytest.approx(math.log(29))


def test_fig1_result_file_sweeps_alpha(tmp_path):
    path = E.run_fig1(scale="quick", out=tmp_path / "fig1.json", **TINY)
    records = load_results(path)["records"]
    alphas = sorted(r["alpha"] for r in records if r["method"].startswith("ranking"))
    assert len(alphas) >= 3 and alphas[0] == 1.0
    assert any(r["method"] == "exact" for r in records)


def test_unknown_option_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown option"):
        E.run_fig2(scale="quick", out=tmp_path / "x.json", learning_rate="1")


# ------------------------------------------------------------------------------- lm-ptb-sampling (beyond the paper)

import os  # noqa: E402
from pathlib import Path  # noqa: E402

MIRROR = Path(os.environ.get("HSM_DATA_MIRROR", Path(__file__).resolve().parents[3] / "shared" / "data"))
needs_ptb = pytest.mark.skipif(not (MIRROR / "ptb").exists(), reason="data mirror (PTB) not available")

TINY_LM = dict(vocab_size="300", train_tokens="4000", eval_tokens="1500", dim="16", epochs="1",
               methods="importance,blackout", reference="flat,random", arity="7", bench_steps="3", bench_rounds="1",
               lr_grid="0.1")


@needs_ptb
def test_lm_ptb_sampling_result_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    payload = load_results(E.run_lm_ptb_sampling(scale="quick", out=tmp_path / "lm.json", **TINY_LM))
    rows = E.lm_rows(payload)
    assert {"flat", "random", "importance-K20", "blackout-K20"} <= set(rows)
    for run in ("flat", "random", "importance-K20", "blackout-K20"):
        ppl = rows[run]["test_perplexity"]
        # exact evaluation: a proper perplexity, at most a little above the uniform model's after so short a run
        assert 1.0 < ppl["value"] < 2 * 300 and ppl["vocab_size"] == 300
        assert ppl["lr"] == 0.1 and len(ppl["per_epoch"]) == 1
        assert rows[run]["train_ms_per_batch"]["value"] > 0
    assert rows["importance-K20"]["test_perplexity"]["num_negatives"] == 20
    # the round-robin benchmark has every output, and the dense-gradient variant of the first method
    bench = {key[len("bench:"):]: m["bench_train_ms_per_step"] for key, m in rows.items() if key.startswith("bench:")}
    assert set(bench) == {"flat", "random", "importance-K20", "blackout-K20", "importance-K20-dense"}
    assert bench["importance-K20-dense"]["sparse"] is False and bench["importance-K20"]["sparse"] is True
    assert all(b["steps"] == 3 and b["value"] > 0 for b in bench.values())
    config = payload["provenance"]["config"]
    assert config["complete"] is True and config["learning_rates"]["importance"] == 0.1


def test_lm_ptb_sampling_rejects_bad_options(tmp_path):
    with pytest.raises(ValueError, match="unknown option"):
        E.run_lm_ptb_sampling(scale="quick", out=tmp_path / "x.json", negatives="5")
    with pytest.raises(ValueError, match="unknown sampled output"):
        E.run_lm_ptb_sampling(scale="quick", out=tmp_path / "x.json", methods="importance,hinge")
    with pytest.raises(ValueError, match="reference"):
        E.run_lm_ptb_sampling(scale="quick", out=tmp_path / "x.json", reference="learned")


def test_sparse_sampled_outputs_switch_train_lms_layer_and_restore_it():
    from hsm_lab.experiments import lm
    from hsm.sampling import SampledSoftmax

    original = lm.training._make_output
    counts = np.arange(1, 31, dtype=np.float64)
    cfg = lm.LMRunConfig(output="negative_sampling", dim=4, num_negatives=3)
    with E._SparseSampledOutputs():
        layer = lm.training._make_output(cfg, 30, None, counts)
        assert isinstance(layer, SampledSoftmax) and layer.sparse
        flat = lm.training._make_output(lm.LMRunConfig(output="flat", dim=4), 30, None, counts)
        assert isinstance(flat, torch.nn.Module)
    assert lm.training._make_output is original
    # train_lm now builds sampled outputs with sparse gradients itself (the switch is a no-op for them)
    assert lm.training._make_output(cfg, 30, None, counts).sparse


def test_tree_arity_is_the_smallest_that_holds_the_vocabulary():
    assert E._tree_arity(10_000) == 22 and E._tree_arity(2000) == 13 and E._tree_arity(8) == 2


@needs_ptb
def test_lm_ptb_sampling_selects_the_rate_on_validation_and_extends_an_edge(tmp_path, monkeypatch):
    monkeypatch.setenv("HSM_DATA_MIRROR", str(MIRROR))
    options = dict(TINY_LM, methods="importance", reference="", lr_grid="0.05,0.1", select_steps="3",
                   more_negatives="importance:40",
                   lr_extend="1", bench_steps="1")
    payload = load_results(E.run_lm_ptb_sampling(scale="quick", out=tmp_path / "lm.json", **options))
    config = payload["provenance"]["config"]
    trials = config["lr_selection"]["importance"]
    rates = [t["lr"] for t in trials]
    assert rates[:2] == [0.05, 0.1] and len(rates) == 3  # the best of the two is an edge: one more rate, beyond it
    assert rates[2] in (0.025, 0.2)
    best = min(trials, key=lambda t: t["valid_perplexity"])
    assert config["learning_rates"]["importance"] == best["lr"]
    more = E.lm_rows(payload)["importance-K40"]["test_perplexity"]  # the extra run reuses the selected rate
    assert more["num_negatives"] == 40 and more["lr"] == best["lr"]


def test_lm_ptb_sampling_more_negatives_must_name_a_trained_method(tmp_path):
    with pytest.raises(ValueError, match="more_negatives"):
        E.run_lm_ptb_sampling(scale="quick", out=tmp_path / "x.json", methods="importance", more_negatives="nce:100")
    with pytest.raises(ValueError, match="more_negatives"):
        E.run_lm_ptb_sampling(scale="quick", out=tmp_path / "x.json", methods="importance", more_negatives="importance:x")


def test_presets_are_not_changed_by_options():
    """Options override a copy: the next run starts from the same preset."""
    before = E.config._settings("quick", {})
    E.config._settings("quick", {"seeds": "3,4", "lr_grid": "0.5"})
    assert E.config._settings("quick", {}) == before and E.FIG_SETTINGS["quick"]["seeds"] == [0]
    lm_before = E._lm_settings("quick", {})
    E._lm_settings("quick", {"methods": "nce", "reference": ""})
    assert E._lm_settings("quick", {}) == lm_before and E.LM_SETTINGS["quick"]["methods"] == list(E.LM_METHODS[:4])
