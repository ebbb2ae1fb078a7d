"""The seed-004 experiments (hsm.experiments.sampling) at a tiny scale: structure and invariants."""
from __future__ import annotations

import math

import pytest
import torch

from hsm.experiments import sampling as E
from hsm.results import load_results

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
