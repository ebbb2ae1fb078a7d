"""Tests for hsm.sampling: the softmax-likelihood approximations of Barber & Botev (seed 004)."""
from __future__ import annotations


import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm import sampling as S


@pytest.fixture(autouse=True)
def _double_precision():
    """Float64 for these tests only (the default dtype is process-wide: restore it)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _frequencies(num_classes: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return S.class_frequencies(torch.randint(0, num_classes, (5 * num_classes,), generator=gen), num_classes)


# ------------------------------------------------------------------------------- estimators of Z


def test_importance_and_bernoulli_estimates_of_z_are_unbiased_with_variances_18_and_21():
    gen = torch.Generator().manual_seed(0)
    num_classes, num_samples = 30, 5
    z = torch.rand(num_classes, generator=gen) * 3
    q = torch.rand(num_classes, generator=gen) + 0.2
    q = q / q.sum()
    b = torch.rand(num_classes, generator=gen) * 0.8 + 0.1
    trials = 200_000
    draws = torch.multinomial(q, num_samples * trials, replacement=True, generator=gen).view(trials, num_samples)
    is_est = (z[draws] / q[draws]).mean(1)
    s = torch.rand(trials, num_classes, generator=gen) < b
    be_est = (s * z / b).sum(1)
    assert is_est.mean().item() == pytest.approx(z.sum().item(), rel=5e-3)
    assert be_est.mean().item() == pytest.approx(z.sum().item(), rel=5e-3)
    assert is_est.var().item() == pytest.approx(S.importance_variance(z, q, num_samples).item(), rel=3e-2)
    assert be_est.var().item() == pytest.approx(S.bernoulli_variance(z, b).item(), rel=3e-2)


def test_footnote2_expected_variances_corrected_importance_formula_matches_monte_carlo():
    """The printed IS expectation is off (it subtracts mu^2 where E[Z^2] belongs); with mu != 0 the
    IS variance is the smaller one, reversing the footnote's conclusion."""
    gen = torch.Generator().manual_seed(1)
    num_classes, fraction, mu, sigma = 200, 0.1, 2.0, 1.0
    num_samples = int(fraction * num_classes)
    z = mu + sigma * torch.randn(4000, num_classes, generator=gen)  # 4000 draws of the z vector
    q = torch.full((num_classes,), 1.0 / num_classes)
    b = torch.full((num_classes,), fraction)
    is_mc = S.importance_variance(z, q, num_samples).mean().item()
    be_mc = S.bernoulli_variance(z, b).mean().item()
    assert is_mc == pytest.approx(S.expected_variance_importance(mu, sigma, num_classes, fraction), rel=2e-2)
    assert be_mc == pytest.approx(S.expected_variance_bernoulli(mu, sigma, num_classes, fraction), rel=2e-2)
    printed = S.expected_variance_importance_as_printed(mu, sigma, num_classes, fraction)
    assert abs(printed - is_mc) / is_mc > 1.0  # the printed formula is far off when mu != 0
    assert is_mc < be_mc
    # with mu = 0 the footnote's conclusion holds: Bernoulli has the lower variance
    assert S.expected_variance_bernoulli(0, sigma, num_classes, fraction) < S.expected_variance_importance(
        0, sigma, num_classes, fraction)


@given(st.integers(20, 300), st.floats(1.5, 15.0), st.integers(0, 10_000))
@settings(max_examples=30, deadline=None)
def test_bernoulli_inclusion_sums_to_k_on_the_complement(num_classes, k, seed):
    freq = _frequencies(num_classes, seed)
    exclude = torch.zeros(num_classes, dtype=torch.bool)
    exclude[: num_classes // 10] = True
    k = min(k, float((~exclude).sum()) - 0.5)
    b, alpha = S.bernoulli_inclusion(freq, k, exclude)
    assert b[exclude].abs().max() == 0
    assert b.sum().item() == pytest.approx(k, rel=1e-6)
    assert bool(((b >= 0) & (b <= 1)).all())
    if k > 1:
        assert 0 < alpha.item() < 1


def test_bernoulli_alpha_is_about_054_at_the_papers_sizes():
    """§4: K = 20 gives b = f^0.54 (C = 1000); ours, for our synthetic frequencies, is close."""
    freq = _frequencies(1000)
    _, alpha = S.bernoulli_inclusion(freq, 20.0)
    assert 0.45 < alpha.item() < 0.65


def test_bernoulli_inclusion_rejects_bad_input():
    freq = _frequencies(10)
    with pytest.raises(ValueError, match="K"):
        S.bernoulli_inclusion(freq, 11.0)
    with pytest.raises(ValueError, match="> 0"):
        S.bernoulli_inclusion(torch.tensor([0.0, 1.0]), 1.0)
    with pytest.raises(ValueError, match="smoothing"):
        S.class_frequencies(torch.tensor([0, 1]), 3, smoothing=-1)


# ------------------------------------------------------------------------------- approximate likelihood


@pytest.mark.parametrize("method", ["importance", "bernoulli"])
@pytest.mark.parametrize("explicit", ["minibatch", "target"])
def test_normalisation_classes_keep_the_target_explicit(method, explicit):
    freq = _frequencies(100)
    target = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(3))
    chosen = S.normalisation_classes(target, freq, 10, method, explicit, torch.Generator().manual_seed(4))
    assert torch.equal(chosen.classes.gather(1, chosen.target_column[:, None]).squeeze(1), target)
    assert bool((chosen.log_weight.gather(1, chosen.target_column[:, None]) == 0).all())
    # the negatives lie outside C_n
    for row in range(16):
        explicit_set = set(target.tolist()) if explicit == "minibatch" else {int(target[row])}
        negatives = chosen.classes[row][chosen.log_weight[row] != 0]
        negatives = negatives[torch.isfinite(chosen.log_weight[row][chosen.log_weight[row] != 0])]
        assert not explicit_set & set(negatives.tolist())


def test_sampled_softmax_gradient_is_eq_24_25_and_gamma_in_range_with_the_right_sign():
    gen = torch.Generator().manual_seed(5)
    batch, width = 6, 9
    scores = torch.randn(batch, width, generator=gen, requires_grad=True)
    log_weight = torch.cat([torch.zeros(batch, 3), torch.rand(batch, width - 3, generator=gen) * 3], 1)
    target_column = torch.randint(0, 3, (batch,), generator=gen)
    S.sampled_softmax_nll(scores, log_weight, target_column).backward()
    p_tilde = torch.softmax(scores.detach() + log_weight, 1)  # Eq. 25: kappa u / Z~
    gamma_tilde = torch.nn.functional.one_hot(target_column, width) - p_tilde  # Eq. 26
    assert torch.allclose(-scores.grad, gamma_tilde)
    assert bool(((gamma_tilde >= -1) & (gamma_tilde <= 1)).all())
    # Eq. 28: same sign as the exact gamma on the explicit classes (target +, others -)
    assert bool((gamma_tilde.gather(1, target_column[:, None]) > 0).all())
    assert bool((gamma_tilde[:, :3].sum(1) - gamma_tilde.gather(1, target_column[:, None]).squeeze(1) <= 0).all())


def test_sampled_softmax_equals_exact_when_every_class_is_explicit():
    gen = torch.Generator().manual_seed(6)
    scores = torch.randn(5, 7, generator=gen)
    target = torch.randint(0, 7, (5,), generator=gen)
    assert S.sampled_softmax_nll(scores, torch.zeros(5, 7), target).item() == pytest.approx(
        S.exact_nll(scores, target).item())


def test_sampled_softmax_refuses_a_sampled_target():
    with pytest.raises(ValueError, match="explicit"):
        S.sampled_softmax_nll(torch.zeros(2, 3), torch.ones(2, 3), torch.tensor([0, 1]))


def test_bias_expansion_eq_27():
    """p~(c) = p(c) (1 + (1 - kappa) p(N)) + O((1 - kappa)^2) for a common kappa near 1."""
    gen = torch.Generator().manual_seed(7)
    scores = torch.randn(12, generator=gen)
    p = torch.softmax(scores, 0)
    negatives = torch.arange(6, 12)
    for eps in (1e-2, 1e-3):
        kappa = 1 - eps
        weights = torch.ones(12)
        weights[negatives] = kappa
        p_tilde = torch.softmax(scores + weights.log(), 0)
        predicted = p * (1 + (1 - kappa) * p[negatives].sum())
        assert (p_tilde[:6] - predicted[:6]).abs().max().item() < 5 * eps**2


def test_one_sample_ranking_identity_eq_39_41():
    """u_c / (u_c + (C-1) u_d) = sigma(s_c - s_d - log(C-1)) and the ranking loss with alpha = log(C-1)
    is minus its log."""
    num_classes = 1000
    s_c, s_d = torch.tensor([2.3, -1.0]), torch.tensor([[0.4], [1.5]])
    direct = torch.exp(s_c) / (torch.exp(s_c) + (num_classes - 1) * torch.exp(s_d[:, 0]))
    alpha = S.ranking_offset(num_classes)
    assert torch.allclose(direct, torch.sigmoid(s_c - s_d[:, 0] - alpha))
    assert S.ranking_loss(s_c, s_d, alpha, reduction="none").tolist() == pytest.approx((-direct.log()).tolist())


def test_ranking_offset_log_c_minus_1_is_6_9068_for_1000_and_6_2126_for_500():
    assert S.ranking_offset(1000) == pytest.approx(6.9068, abs=5e-5)
    assert S.ranking_offset(500) == pytest.approx(6.2126, abs=5e-5)


def test_ranking_gradient_eq_35():
    gen = torch.Generator().manual_seed(8)
    s_c = torch.randn(4, generator=gen, requires_grad=True)
    s_n = torch.randn(4, 3, generator=gen, requires_grad=True)
    S.ranking_loss(s_c, s_n, 1.0).backward()
    weight = 1 - torch.sigmoid(s_c.detach()[:, None] - s_n.detach() - 1.0)  # 1 - sigma(...)
    assert torch.allclose(-s_c.grad, weight.mean(1))
    assert torch.allclose(-s_n.grad, -weight / 3)


def test_negative_sampling_gradient_eq_44_45():
    gen = torch.Generator().manual_seed(9)
    s_c = torch.randn(4, generator=gen, requires_grad=True)
    s_n = torch.randn(4, 5, generator=gen, requires_grad=True)
    S.negative_sampling_loss(s_c, s_n).backward()
    assert torch.allclose(-s_c.grad, 1 - torch.sigmoid(s_c.detach()))
    assert torch.allclose(-s_n.grad, -torch.sigmoid(s_n.detach()) / 5)


def test_nce_gradient_eq_30():
    gen = torch.Generator().manual_seed(10)
    k = 4
    s_c = torch.randn(3, generator=gen, requires_grad=True)
    s_n = torch.randn(3, k, generator=gen, requires_grad=True)
    log_pn_c, log_pn_n = torch.log(torch.rand(3, generator=gen)), torch.log(torch.rand(3, k, generator=gen))
    S.nce_loss(s_c, s_n, log_pn_c, log_pn_n, k).backward()
    u_c, u_n = s_c.detach().exp(), s_n.detach().exp()
    kpc, kpn = k * log_pn_c.exp(), k * log_pn_n.exp()
    assert torch.allclose(-s_c.grad, kpc / (u_c + kpc))
    assert torch.allclose(-s_n.grad, -u_n / (u_n + kpn))


def test_blackout_matches_eq_46_47_directly():
    gen = torch.Generator().manual_seed(11)
    s_c, s_n = torch.randn(3, generator=gen), torch.randn(3, 4, generator=gen)
    log_q_c, log_q_n = torch.log(torch.rand(3, generator=gen)), torch.log(torch.rand(3, 4, generator=gen))
    w_c, w_n = torch.exp(s_c - log_q_c), torch.exp(s_n - log_q_n)  # q_j u_j with q = 1/Q
    total = w_c + w_n.sum(1)
    objective = torch.log(w_c / total) + torch.log(1 - w_n / total[:, None]).sum(1)
    assert S.blackout_loss(s_c, s_n, log_q_c, log_q_n, reduction="none").tolist() == pytest.approx((-objective).tolist())


def test_uniform_negatives_never_hit_the_target_and_cover_the_rest():
    target = torch.full((2000,), 3)
    draws = S.sample_uniform_negatives(target, 6, 5, torch.Generator().manual_seed(12))
    assert not bool((draws == 3).any())
    assert set(np.unique(draws.numpy()).tolist()) == {0, 1, 2, 4, 5}


def test_gather_scores_shared_and_per_example_agree_with_full_product():
    gen = torch.Generator().manual_seed(13)
    hidden, weight, bias = torch.randn(4, 5, generator=gen), torch.randn(9, 5, generator=gen), torch.randn(9, generator=gen)
    full = hidden @ weight.t() + bias
    shared = torch.tensor([2, 7, 0])
    per_example = torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]])
    assert torch.allclose(S.gather_scores(hidden, weight, bias, shared), full[:, shared])
    assert torch.allclose(S.gather_scores(hidden, weight, bias, per_example), full.gather(1, per_example))
    with pytest.raises(ValueError, match="match"):
        S.gather_scores(hidden, weight[:, :3], bias, shared)


def test_exact_nll_rejects_bad_targets():
    with pytest.raises(ValueError, match="outside"):
        S.exact_nll(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(TypeError):
        S.exact_nll(torch.zeros(2, 3), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="reduction"):
        S.exact_nll(torch.zeros(2, 3), torch.tensor([0, 1]), reduction="avg")


@pytest.mark.parametrize("method", S.SampledSoftmax.METHODS)
def test_sampled_softmax_layer_trains_and_is_exact_in_eval(method):
    torch.manual_seed(0)
    num_classes = 12
    freq = _frequencies(num_classes)
    layer = S.SampledSoftmax(4, num_classes, freq, method=method, num_negatives=3, seed=0).double()
    h, y = torch.randn(8, 4), torch.randint(0, num_classes, (8,))
    out = layer(h, y)
    assert out.output.shape == (8,) and torch.isfinite(out.loss)
    out.loss.backward()
    assert layer.linear.weight.grad is not None
    layer.eval()
    exact = layer(h, y)
    assert torch.allclose(exact.output, layer.log_prob(h).gather(1, y[:, None]).squeeze(1))
    assert torch.allclose(layer.log_prob(h).exp().sum(1), torch.ones(8))
    assert torch.equal(layer.predict(h), layer.topk(h, 1).indices[:, 0])


def test_sampled_softmax_layer_rejects_bad_settings():
    freq = _frequencies(5)
    with pytest.raises(ValueError, match="method"):
        S.SampledSoftmax(3, 5, freq, method="hinge")
    with pytest.raises(ValueError, match="num_negatives"):
        S.SampledSoftmax(3, 5, freq, num_negatives=5)
    with pytest.raises(ValueError, match="freq"):
        S.SampledSoftmax(3, 6, freq)


# ------------------------------------------------------------------------------- fast samplers, sparse path


@pytest.mark.parametrize("max_rounds", [8, 0])
def test_rejection_sampler_draws_from_the_proposal_restricted_to_non_targets(max_rounds):
    """Same law as sample_importance(exclude=one_hot(target)); max_rounds=0 exercises the direct fallback."""
    gen = torch.Generator().manual_seed(5)
    proposal = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    target = torch.tensor([0, 1, 4] * 400)
    draws = S.sample_negatives_excluding_target(proposal, target, 50, gen, max_rounds=max_rounds)
    assert draws.shape == (1200, 50)
    assert not bool((draws == target[:, None]).any())
    for label in (0, 1, 4):
        rows = draws[target == label].reshape(-1)
        expected = proposal.clone()
        expected[label] = 0.0
        expected = expected / expected.sum()
        observed = torch.bincount(rows, minlength=5).double() / rows.numel()
        assert torch.allclose(observed, expected, atol=0.01)


def test_rejection_sampler_rejects_a_target_with_all_the_mass():
    with pytest.raises(ValueError, match="all the proposal"):
        S.sample_negatives_excluding_target(torch.tensor([1.0, 1e-20]), torch.tensor([0]), 3)


@pytest.mark.parametrize("method,explicit", [(m, "minibatch") for m in S.SampledSoftmax.METHODS[1:]]
                         + [("importance", "target"), ("bernoulli", "target")])
def test_sparse_path_equals_dense_path(method, explicit):
    """sparse=True changes only how the gradient is stored: same loss, same gradient values, and the
    same parameters after a few Adagrad steps (Adagrad leaves rows with zero gradient unchanged)."""
    num_classes, dim = 15, 4
    freq = _frequencies(num_classes, seed=2)
    dense = S.SampledSoftmax(dim, num_classes, freq, method=method, num_negatives=4, explicit=explicit, seed=3)
    sparse = S.SampledSoftmax(dim, num_classes, freq, method=method, num_negatives=4, explicit=explicit, seed=3,
                              sparse=True)
    sparse.load_state_dict(dense.state_dict())
    gen = torch.Generator().manual_seed(4)
    h, y = torch.randn(9, dim, generator=gen), torch.randint(0, num_classes, (9,), generator=gen)
    loss_d, loss_s = dense(h, y).loss, sparse(h, y).loss
    assert torch.allclose(loss_d, loss_s)
    loss_d.backward()
    loss_s.backward()
    assert sparse.linear.weight.grad.is_sparse and sparse.linear.bias.grad.is_sparse
    assert torch.allclose(dense.linear.weight.grad, sparse.linear.weight.grad.to_dense())
    assert torch.allclose(dense.linear.bias.grad, sparse.linear.bias.grad.to_dense())
    opt_d = torch.optim.Adagrad(dense.parameters(), lr=0.1)
    opt_s = torch.optim.Adagrad(sparse.parameters(), lr=0.1)
    for _ in range(3):
        for layer, opt in ((dense, opt_d), (sparse, opt_s)):
            opt.zero_grad(set_to_none=True)
            layer(h, y).loss.backward()
            opt.step()
    assert torch.allclose(dense.linear.weight, sparse.linear.weight)
    assert torch.allclose(dense.linear.bias, sparse.linear.bias)


def test_sampled_scores_are_the_full_products_of_the_classes_asked_for():
    layer = S.SampledSoftmax(5, 11, _frequencies(11), num_negatives=3, sparse=True)
    gen = torch.Generator().manual_seed(6)
    h = torch.randn(3, 5, generator=gen)
    full = layer.linear(h)
    shared = torch.tensor([4, 0, 4, 10])
    per_example = torch.tensor([[1, 1, 2], [3, 9, 3], [10, 0, 5]])
    assert torch.allclose(layer._scores(h, shared), full[:, shared])
    assert torch.allclose(layer._scores(h, per_example), full.gather(1, per_example))


def test_sampled_softmax_rejects_unknown_explicit():
    with pytest.raises(ValueError, match="explicit"):
        S.SampledSoftmax(3, 5, _frequencies(5), explicit="batch")


def test_blackout_stays_finite_when_a_negative_takes_all_the_probability():
    """A rare negative (tiny Q, weight 1/Q) can get p~ = 1 in float32: log(1 - p~) must stay finite."""
    s_c = torch.tensor([0.0], dtype=torch.float32, requires_grad=True)
    s_n = torch.tensor([[40.0, 0.0, -3.0]], dtype=torch.float32, requires_grad=True)
    log_q = torch.tensor([-1.0], dtype=torch.float32)
    log_q_n = torch.tensor([[-12.0, -1.0, -2.0]], dtype=torch.float32)
    loss = S.blackout_loss(s_c, s_n, log_q, log_q_n)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(s_c.grad).all() and torch.isfinite(s_n.grad).all()
    # and in float64 it is the direct formula
    expected = S.blackout_loss(s_c.detach().double(), s_n.detach().double(), log_q.double(), log_q_n.double())
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


def test_the_sampled_softmax_orders_equal_values_by_label_id():
    freq = torch.ones(12)
    layer = S.SampledSoftmax(3, 12, freq, num_negatives=3, seed=0)
    with torch.no_grad():
        layer.linear.weight.zero_()
        layer.linear.bias.zero_()
        layer.linear.bias[[9, 4]] = 1.0
    h = torch.zeros(2, 3)
    assert layer.predict(h).tolist() == [4, 4]
    assert layer.topk(h, 4).indices.tolist() == [[4, 9, 0, 1]] * 2
