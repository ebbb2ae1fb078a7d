"""The label-addition experiment's baselines: options, the summary's shares and losses, weight imprinting."""
import numpy as np
import pytest

from hsm_lab.experiments.label_addition import PLACEMENTS, _imprinted, parse_options, summarise


def test_the_default_methods_are_the_placements_and_local_settings_appear_only_when_used():
    _, _, methods, _, settings = parse_options("full", {})
    assert tuple(methods) == PLACEMENTS and "local_steps" not in settings
    _, _, methods, _, settings = parse_options("full", {"methods": "objective-local,imprint", "local_steps": "5"})
    assert methods == ["objective-local", "imprint"] and settings["local_steps"] == 5
    with pytest.raises(ValueError, match="methods"):
        parse_options("full", {"methods": "finetune"})


def test_the_summary_measures_each_method_against_its_own_starting_model_and_the_kshot_retrain():
    base = {"seed": 0}
    rows = [dict(base, method="retrain", examples=None, p_at_1_old=60.0, p_at_1_new=50.0),
            dict(base, method="learned-before", examples=0, p_at_1_old=61.0),
            dict(base, method="flat-before", examples=0, p_at_1_old=58.0),
            dict(base, method="ncm-before", examples=0, p_at_1_old=40.0),
            dict(base, method="objective", examples=5, p_at_1_old=60.0, p_at_1_new=5.0, seconds_per_label=0.01),
            dict(base, method="kshot-retrain", examples=5, p_at_1_old=60.5, p_at_1_new=10.0, seconds_per_label=1.0),
            dict(base, method="imprint", examples=5, p_at_1_old=50.0, p_at_1_new=40.0, seconds_per_label=0.001),
            dict(base, method="ncm", examples=5, p_at_1_old=39.0, p_at_1_new=20.0, seconds_per_label=0.001)]
    summary = {r["method"]: r for r in summarise(rows)}
    assert summary["objective"]["old_loss_mean"] == pytest.approx(1.0)
    assert summary["imprint"]["old_loss_mean"] == pytest.approx(8.0)
    assert summary["ncm"]["old_loss_mean"] == pytest.approx(1.0)
    assert summary["objective"]["share_of_kshot_retrain_mean"] == pytest.approx(0.5)
    assert summary["imprint"]["share_of_retrain_mean"] == pytest.approx(0.8)


def test_an_imprinted_row_has_the_trained_rows_mean_norm_and_serves_its_examples():
    from hsm import FastBowClassifier

    rng = np.random.default_rng(0)
    docs = [rng.integers(10 * (i % 3), 10 * (i % 3) + 10, size=6) for i in range(300)]
    labels = np.array([i % 3 for i in range(300)])
    flat = FastBowClassifier(dim=8, output="flat", lr=0.5, epochs=5, threads=1, seed=0)
    flat.fit(docs, labels, num_words=40, num_labels=3)
    new_docs = [rng.integers(30, 40, size=6) for _ in range(5)]
    grown = _imprinted(flat, [new_docs])
    weight = grown.layer.linear.weight.detach()
    assert grown.num_labels == 4 and flat.num_labels == 3
    assert float(weight[3].norm()) == pytest.approx(float(weight[:3].norm(dim=1).mean()), rel=1e-5)
    assert (grown.predict(new_docs).labels[:, 0] == 3).mean() >= 0.8
