"""hsm.models: the log-bilinear language model of §6."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hsm
from hsm.models import LogBilinearLM


@settings(max_examples=25, deadline=None)
@given(vocab=st.integers(2, 30), dim=st.integers(1, 8), context=st.integers(1, 5), batch=st.integers(0, 6),
       seed=st.integers(0, 10_000))
def test_representation_is_the_sum_of_projected_context_embeddings(vocab, dim, context, batch, seed) -> None:
    """r_x = sum_{k=1}^T R_k U_{w_{t-k}}, with contexts stored oldest first (w_{t-1} last)."""
    torch.manual_seed(seed)
    model = LogBilinearLM(vocab, dim, context)
    contexts = torch.randint(0, vocab, (batch, context))
    U, R = model.embedding.weight, model.context_weight
    expected = torch.zeros(batch, dim)
    for k in range(1, context + 1):
        expected += U[contexts[:, context - k]] @ R[k - 1].T
    assert torch.allclose(model(contexts), expected, atol=1e-5)


def test_representation_is_linear_in_each_context_embedding() -> None:
    """No non-linearity: doubling U doubles r_x."""
    model = LogBilinearLM(20, 6, 3)
    contexts = torch.randint(0, 20, (4, 3))
    before = model(contexts)
    with torch.no_grad():
        model.embedding.weight.mul_(2)
    assert torch.allclose(model(contexts), 2 * before, atol=1e-5)


def test_word_order_matters() -> None:
    model = LogBilinearLM(10, 4, 2)
    a = model(torch.tensor([[1, 2]]))
    b = model(torch.tensor([[2, 1]]))
    assert not torch.allclose(a, b)


def test_sparse_embedding_gradient_touches_only_context_rows() -> None:
    model = LogBilinearLM(50, 8, 3, sparse=True)
    layer = hsm.HierarchicalSoftmax(8, hsm.Tree.random(50, 4, 3, seed=0), sparse=True)
    contexts = torch.tensor([[1, 2, 3], [3, 4, 5]])
    layer(model(contexts), torch.tensor([7, 9])).loss.backward()
    grad = model.embedding.weight.grad
    assert grad.is_sparse
    touched = set(grad.coalesce().indices()[0].tolist())
    assert touched == {1, 2, 3, 4, 5}
    assert model.context_weight.grad is not None and not model.context_weight.grad.is_sparse
    # Adagrad accepts the sparse gradients (the optimiser of the papers)
    torch.optim.Adagrad(list(model.parameters()) + list(layer.parameters()), lr=0.1).step()


def test_trains_on_a_tiny_corpus() -> None:
    """A deterministic sequence 0 1 2 ... is learnable: the loss falls well below log V."""
    torch.manual_seed(0)
    vocab = 12
    stream = torch.arange(600) % vocab
    contexts = stream.unfold(0, 3, 1)[:-1]
    targets = stream[3:]
    model = LogBilinearLM(vocab, 16, 2 + 1)
    out = hsm.FlatSoftmax(16, vocab)
    opt = torch.optim.Adagrad(list(model.parameters()) + list(out.parameters()), lr=0.3)
    for _ in range(60):
        opt.zero_grad()
        loss = out(model(contexts), targets).loss
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.2 * torch.log(torch.tensor(float(vocab)))


@pytest.mark.parametrize("kwargs", [dict(vocab_size=0), dict(vocab_size=5, dim=0), dict(vocab_size=5, context=0),
                                    dict(vocab_size=5, context=2.5)])
def test_bad_sizes_are_rejected(kwargs) -> None:
    with pytest.raises(ValueError):
        LogBilinearLM(**kwargs)


def test_bad_contexts_are_rejected() -> None:
    model = LogBilinearLM(10, 4, 3)
    with pytest.raises(ValueError, match="shape"):
        model(torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="word ids"):
        model(torch.tensor([[0, 1, 10]]))
    with pytest.raises(ValueError, match="word ids"):
        model(torch.tensor([[0, -1, 2]]))
    with pytest.raises(TypeError, match="integer"):
        model(torch.zeros(1, 3))
    with pytest.raises(TypeError):
        model([[0, 1, 2]])


# ---------------------------------------------------------------- the hand-written forward / backward
def _grads(model: LogBilinearLM, contexts: torch.Tensor, weights: torch.Tensor, reference: bool):
    model.zero_grad(set_to_none=True)
    out = model.forward_reference(contexts) if reference else model(contexts)
    (out * weights).sum().backward()
    grad_u = model.embedding.weight.grad
    return out.detach(), (grad_u.to_dense() if grad_u.is_sparse else grad_u), model.context_weight.grad


@pytest.fixture(params=["compiled-1-thread", "compiled-2-threads", "torch"])
def path(request, monkeypatch):
    """The compiled kernels (float32 CPU; on one thread and on two, tiny work split anyway) or
    torch's ops (USE_KERNELS off: what other devices run)."""
    from hsm import kernels, models

    before = torch.get_num_threads()
    torch.set_num_threads(2 if request.param == "compiled-2-threads" else 1)
    monkeypatch.setattr(kernels, "MIN_WORK_PER_THREAD", 1)
    monkeypatch.setattr(models, "USE_KERNELS", request.param != "torch")
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("context", [1, 4])
def test_fast_path_matches_autograd_reference(sparse, dtype, context, path) -> None:
    """Values, the embedding gradient (repeated words: rows summed) and the R_k gradients equal
    those autograd computes through F.embedding + einsum (forward_reference)."""
    torch.manual_seed(context)
    model = LogBilinearLM(9, 5, context, sparse=sparse).to(dtype)
    contexts = torch.randint(0, 9, (11, context))
    contexts[0] = 3  # one word in every position of a row, and again in other rows
    weights = torch.randn(11, 5, dtype=dtype)
    got = _grads(model, contexts, weights, reference=False)
    want = _grads(model, contexts, weights, reference=True)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)
    assert model.embedding.weight.grad.is_sparse == sparse


def test_fast_path_gradcheck_and_int32_contexts() -> None:
    """torch.autograd.gradcheck in float64 (finite differences), and int32 ids give the same result."""
    torch.manual_seed(0)
    model = LogBilinearLM(7, 3, 3).double()
    contexts = torch.tensor([[1, 2, 1], [6, 6, 0], [1, 1, 1]])
    from hsm.models import _LogBilinear

    assert torch.autograd.gradcheck(
        lambda u, r: _LogBilinear.apply(contexts, u, r, False),
        (model.embedding.weight.detach().clone().requires_grad_(), model.context_weight.detach().clone().requires_grad_()))
    torch.testing.assert_close(model(contexts.int()), model(contexts))


def test_fast_path_sparse_gradient_trains_like_the_reference_with_adagrad(path) -> None:
    """Five Adagrad steps (hsm.RowSparseAdagrad and torch.optim.Adagrad) on the sparse fast path
    reach the parameters the reference path reaches, within float32 rounding."""
    torch.manual_seed(1)
    models = [LogBilinearLM(30, 8, 4, sparse=True) for _ in range(3)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = [hsm.RowSparseAdagrad(models[0].parameters(), lr=0.1), torch.optim.Adagrad(models[1].parameters(), lr=0.1),
            torch.optim.Adagrad(models[2].parameters(), lr=0.1)]
    for step in range(5):
        contexts = torch.randint(0, 12, (16, 4))  # few words: many repeated rows
        weights = torch.randn(16, 8)
        for i, (m, opt) in enumerate(zip(models, opts)):
            opt.zero_grad(set_to_none=True)
            out = m.forward_reference(contexts) if i == 2 else m(contexts)
            (out * weights).sum().backward()
            opt.step()
    for m in models[:2]:
        torch.testing.assert_close(m.embedding.weight, models[2].embedding.weight, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(m.context_weight, models[2].context_weight, rtol=1e-5, atol=1e-6)


def test_fast_path_empty_batch_and_no_grad(path) -> None:
    model = LogBilinearLM(10, 4, 2, sparse=True)
    empty = torch.zeros(0, 2, dtype=torch.long)
    out = model(empty)
    assert out.shape == (0, 4)
    out.sum().backward()
    assert model.embedding.weight.grad.to_dense().abs().sum() == 0
    assert model.context_weight.grad.abs().sum() == 0
    with torch.no_grad():
        assert not model(torch.tensor([[1, 2]])).requires_grad


def test_compiled_sparse_gradient_is_coalesced_and_the_same_on_one_or_two_threads(monkeypatch) -> None:
    """The compiled path's embedding gradient lists each word once, in increasing order (what
    RowSparseAdagrad checks before skipping its sort), and one or two threads give the same bits."""
    from hsm import kernels

    monkeypatch.setattr(kernels, "MIN_WORK_PER_THREAD", 1)
    torch.manual_seed(3)
    model = LogBilinearLM(40, 16, 4, sparse=True)
    # 150 rows: three forward chunks (kernels.LBL_FORWARD_CHUNK), shared between the two threads
    contexts = torch.randint(0, 10, (150, 4))
    weights = torch.randn(150, 16)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(_grads(model, contexts, weights, reference=False))
            grad = model.embedding.weight.grad
            rows = grad._indices()[0]
            assert bool((rows[1:] > rows[:-1]).all())
            assert set(rows.tolist()) == set(contexts.flatten().tolist())
    finally:
        torch.set_num_threads(before)
    for one, two in zip(*results):
        assert torch.equal(one, two)


def test_use_kernels_false_takes_torch_products_with_the_same_result() -> None:
    """model.use_kernels = False: torch's products (no compiled kernels), same values and gradients."""
    from unittest import mock

    from hsm import kernels

    torch.manual_seed(5)
    model = LogBilinearLM(20, 6, 3, sparse=True)
    contexts = torch.randint(0, 20, (9, 3))
    weights = torch.randn(9, 6)
    compiled = _grads(model, contexts, weights, reference=False)
    model.use_kernels = False
    with mock.patch.object(kernels, "run_lbl_forward", side_effect=AssertionError("compiled path used")):
        plain = _grads(model, contexts, weights, reference=False)
    for a, b in zip(compiled, plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
