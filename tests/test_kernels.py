"""hsm.kernels: the compiled float32 CPU paths of HierarchicalSoftmax against the float64 reference.

Every check runs with one thread and with the batch split over two threads (the shares of
hsm.kernels.run_*), so the per-share buffers and their sums are exercised too."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hsm.kernels as kernels
import hsm.search
from hsm.optim import RowSparseAdagrad
from hsm.statistics import NodeStatistics
from hsm.tree import Tree

from kernel_cases import float64_reference, kernel_test_trees, scaled_layer


def _targets(tree, batch, seed):
    rng = np.random.default_rng(seed)
    probs = 1.0 / np.arange(1, tree.num_labels + 1) ** 1.2  # Zipf-like: groups of every size
    return torch.as_tensor(rng.choice(tree.num_labels, batch, p=probs / probs.sum()))


TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tree", kernel_test_trees(), ids=repr)
@pytest.mark.parametrize("sparse", [False, True])
def test_kernel_forward_and_gradients_equal_reference(tree, sparse, threads):
    layer = scaled_layer(tree, sparse=sparse)
    ref = float64_reference(layer)
    for batch, seed in ((1, 0), (29, 1), (260, 2)):
        y = _targets(tree, batch, seed)
        h = torch.randn(batch, layer.in_features, requires_grad=True)
        h64 = h.detach().double().requires_grad_()
        upstream = torch.randn(batch)  # a non-uniform gradient of the outputs
        out = layer(h, y).output
        want = ref.forward_reference(h64, y).output
        torch.testing.assert_close(out.double(), want, **TOL)
        got = torch.autograd.grad((out * upstream).sum(), [h, layer.weight, layer.bias])
        expected = torch.autograd.grad((want * upstream.double()).sum(), [h64, ref.weight, ref.bias])
        for g, w in zip(got, expected):
            assert g.is_sparse == (sparse and g.shape != h.shape)
            torch.testing.assert_close(g.to_dense().double(), w, **TOL)
        if sparse:  # one gradient row per unique path node: nothing for the optimiser to sum
            rows = got[1]._indices()[0]
            path_nodes = np.unique(tree.path_nodes[y.numpy()][tree.path_mask[y.numpy()]])
            assert rows.tolist() == path_nodes.tolist()


@pytest.mark.parametrize("tree", kernel_test_trees(), ids=repr)
def test_kernel_inference_equals_training_forward(tree, threads):
    layer = scaled_layer(tree, seed=1)
    for batch, seed in ((3, 0), (180, 1)):
        h = torch.randn(batch, layer.in_features)
        y = _targets(tree, batch, seed)
        with torch.no_grad():
            inference = layer(h, y).output
        training = layer(h.requires_grad_(), y).output.detach()
        torch.testing.assert_close(inference, training)
        torch.testing.assert_close(inference.double(), float64_reference(layer).forward_reference(h.double(), y).output
                                   .detach(), **TOL)


@pytest.mark.parametrize("tree", kernel_test_trees(), ids=repr)
def test_kernel_top1_is_the_arg_max_of_log_prob(tree, threads):
    for scale in (0.01, 6.0):  # near uniform (visits everything) and confident (prunes)
        layer = scaled_layer(tree, scale=scale, seed=2)
        h = torch.randn(41, layer.in_features)
        labels, visited = hsm.search.top1(layer, h)
        log_prob = float64_reference(layer).log_prob(h.double())
        best = log_prob.max(1).values
        # the chosen label is (within float32 rounding) as likely as the best one
        torch.testing.assert_close(log_prob[torch.arange(41), labels], best, rtol=0, atol=1e-5)
        assert ((labels >= 0) & (labels < tree.num_labels)).all()
        assert (visited >= 1).all() and (visited <= tree.num_nodes).all()


def test_kernel_statistics_match_the_reference_path():
    for tree in (Tree.random(60, 4, 3, seed=0), Tree.huffman(np.arange(1, 30), 3)):
        layers = [scaled_layer(tree, seed=3), scaled_layer(tree, seed=3)]
        layers[1].use_kernels = False
        h = torch.randn(40, layers[0].in_features)
        y = _targets(tree, 40, 3)
        for layer in layers:
            layer.statistics = NodeStatistics(tree, dtype=torch.double)
            layer(h, y)
        for name in ("sum_probas", "path_counts", "label_counts"):
            torch.testing.assert_close(getattr(layers[0].statistics, name), getattr(layers[1].statistics, name),
                                       rtol=1e-5, atol=1e-6)


def test_kernel_and_torch_paths_train_alike(threads):
    """A few RowSparseAdagrad steps through the kernels and through the PyTorch path."""
    tree = Tree.random(300, 7, 3, seed=0)
    layers = [scaled_layer(tree, seed=4), scaled_layer(tree, seed=4)]
    layers[1].use_kernels = False
    opts = [RowSparseAdagrad(layer.parameters(), lr=0.2) for layer in layers]
    for step in range(5):
        h = torch.randn(64, layers[0].in_features)
        y = _targets(tree, 64, step)
        for layer, opt in zip(layers, opts):
            opt.zero_grad()
            layer(h, y).loss.backward()
            opt.step()
    torch.testing.assert_close(layers[0].weight, layers[1].weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(layers[0].bias, layers[1].bias, rtol=1e-4, atol=1e-5)


def test_adagrad_rows_kernel_equals_the_formula(threads):
    rng = np.random.default_rng(0)
    param = rng.standard_normal((20, 33)).astype(np.float32)
    state = rng.random((20, 33)).astype(np.float32)
    rows = np.array([1, 4, 5, 19], dtype=np.int64)
    grad = rng.standard_normal((4, 33)).astype(np.float32)
    want_state = state.copy()
    want_state[rows] += grad ** 2
    want_param = param.copy()
    want_param[rows] -= 0.3 * grad / (np.sqrt(want_state[rows]) + 1e-10)
    kernels.run_adagrad_rows(param, state, rows, grad, np.float32(0.3), np.float32(1e-10))
    np.testing.assert_allclose(state, want_state, rtol=1e-6)
    np.testing.assert_allclose(param, want_param, rtol=1e-5, atol=1e-6)


def test_shares_cover_every_item_once():
    cumulative = np.cumsum([0, 5, 1, 1, 40, 3, 3, 3, 2])
    torch_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        shares = kernels._shares(cumulative, work=1e9)
    finally:
        torch.set_num_threads(torch_threads)
    covered = [i for lo, hi in shares for i in range(lo, hi)]
    assert covered == list(range(len(cumulative) - 1))
    assert kernels._shares(cumulative, work=1.0) == [(0, len(cumulative) - 1)]  # too little work to split


@settings(max_examples=50, deadline=None)
@given(loads=st.lists(st.integers(0, 50), min_size=1, max_size=40), parts=st.integers(2, 6))
def test_share_bounds_partition_the_items(loads, parts):
    """Contiguous, non-empty, in order, covering every item once, at most ``parts`` of them."""
    cumulative = np.concatenate([[0.0], np.cumsum(loads)])
    bounds = kernels._share_bounds(cumulative, parts)
    assert bounds[0] == 0 and bounds[-1] == len(loads)
    assert np.all(np.diff(bounds) > 0) and len(bounds) - 1 <= parts


@pytest.mark.parametrize("tree", kernel_test_trees()[2:4], ids=repr)
def test_results_do_not_depend_on_the_thread_count(tree, monkeypatch):
    """Threads claim groups dynamically, but per-pair results are summed per example in a fixed
    order: outputs and every gradient are bit-identical with 1, 2 and 3 threads."""
    monkeypatch.setattr(kernels, "MIN_WORK_PER_THREAD", 1)
    before = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            layer = scaled_layer(tree, d=9)
            h = torch.randn(40, 9, generator=torch.Generator().manual_seed(1), requires_grad=True)
            out = layer(h, _targets(tree, 40, seed=2)).output
            out.pow(2).sum().backward()
            results.append([out.detach(), h.grad, layer.weight.grad.to_dense(), layer.bias.grad.to_dense()])
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def test_blas_runs_single_threaded_inside_kernels_and_is_restored():
    """scipy's OpenBLAS (numba's np.dot) is held at one thread while kernels run, nested uses
    included, and gets its own setting back afterwards."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import scipy.linalg.cython_blas  # noqa: F401 - load the library

    def blas_threads():
        return [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]

    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        assert before and max(before) == 2
        seen = []

        def task(i, lo, hi):
            with kernels._BLAS_ONE_THREAD:  # nested
                seen.append(blas_threads())
            seen.append(blas_threads())

        kernels.run_on_pool(task, [(0, 1)])
        assert seen == [[1] * len(before)] * 2
        assert blas_threads() == before


def test_thread_shares_raise_a_workers_error_and_recover():
    """An exception in a pool thread reaches the caller, and the pool still works afterwards."""
    torch_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        done = []

        def failing(i, lo, hi):
            if i == 2:
                raise RuntimeError("share 2 failed")
            done.append(i)

        with pytest.raises(RuntimeError, match="share 2 failed"):
            kernels.run_on_pool(failing, [(0, 1), (1, 2), (2, 3)])
        assert sorted(done) == [0, 1]
        done.clear()
        kernels.run_on_pool(lambda i, lo, hi: done.append((lo, hi)), [(0, 1), (1, 2), (2, 3)])
        assert sorted(done) == [(0, 1), (1, 2), (2, 3)]
    finally:
        torch.set_num_threads(torch_threads)


def test_path_pairs_lists_the_existing_steps_in_example_depth_order():
    """The compiled pair builder against a plain numpy reading of the path tables (a tree whose
    paths differ in length, so the mask matters)."""
    tree = Tree.huffman(np.arange(1, 40, dtype=float), arity=3)
    labels = np.array([0, 5, 39 - 1, 5, 17], dtype=np.int64)
    example, depth, node, child = kernels.path_pairs(labels, tree.path_nodes, tree.path_children, tree.path_mask,
                                                     False)
    want_example, want_depth = np.nonzero(tree.path_mask[labels])
    np.testing.assert_array_equal(example, want_example)
    np.testing.assert_array_equal(depth, want_depth)
    np.testing.assert_array_equal(node, tree.path_nodes[labels][tree.path_mask[labels]])
    np.testing.assert_array_equal(child, tree.path_children[labels][tree.path_mask[labels]])


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 200), m=st.integers(2, 9), batch=st.integers(1, 70), seed=st.integers(0, 10_000))
def test_kernel_log_probabilities_property(k, m, batch, seed):
    """For random fixed-depth trees (any K, M), the kernel forward equals the reference and the
    target's log-probability matches log_prob's entry."""
    depth = 1
    while m ** depth < k:
        depth += 1
    tree = Tree.random(k, m, depth, seed=seed)
    layer = scaled_layer(tree, d=5, seed=seed % 97)
    rng = np.random.default_rng(seed)
    y = torch.as_tensor(rng.integers(0, k, batch))
    h = torch.randn(batch, 5)
    with torch.no_grad():
        out = layer(h, y).output
    ref = float64_reference(layer)
    torch.testing.assert_close(out.double(), ref.forward_reference(h.double(), y).output.detach(), **TOL)
    torch.testing.assert_close(out.double(), ref.log_prob(h.double())[torch.arange(batch), y].detach(), **TOL)


def test_kernels_work_in_a_forked_child(threads):
    """A child forked after the thread pool started (DataLoader workers) gets a pool of its own."""
    import multiprocessing

    tree = Tree.random(500, 8, 3, seed=0)
    layer = scaled_layer(tree)
    h = torch.randn(64, layer.in_features)
    y = _targets(tree, 64, 0)
    with torch.no_grad():
        expected = layer(h, y).output  # starts the pool in this process (2-thread case)
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        got = pool.apply_async(_forward_in_child, (layer, h, y)).get(timeout=60)
    torch.testing.assert_close(got, expected)


def _forward_in_child(layer, h, y):
    with torch.no_grad():
        return layer(h, y).output


def test_kernel_statistics_fallback_when_the_statistics_are_not_plain_cpu_tensors(monkeypatch):
    """Statistics the compiled pass cannot write (e.g. on a GPU) are collected by the torch path."""
    tree = Tree.random(60, 4, 3, seed=0)
    h = torch.randn(40, 7)
    y = _targets(tree, 40, 5)
    results = []
    for compiled in (True, False):
        layer = scaled_layer(tree, seed=3)
        layer.statistics = NodeStatistics(tree, dtype=torch.double)
        if not compiled:
            monkeypatch.setattr(NodeStatistics, "accumulate_pairs", lambda self, *args: False)
        layer(h, y)
        results.append(layer.statistics)
    for name in ("sum_probas", "path_counts", "label_counts"):
        torch.testing.assert_close(getattr(results[0], name), getattr(results[1], name))
    assert float(results[0].path_counts.sum()) == 40 * 3


@pytest.mark.parametrize("size", [0, 1, 37, 3 * kernels.MIN_WORK_PER_THREAD * 4 + 5])
def test_adagrad_dense_kernel_equals_torch_adagrad(threads, size):
    """The dense one-pass update against torch.optim.Adagrad's own (one step from a non-zero state,
    sizes that split over threads unevenly), float32 and float64."""
    for dtype in (torch.float32, torch.float64):
        gen = torch.Generator().manual_seed(size)
        param = torch.randn(size, generator=gen, dtype=dtype)
        grad = torch.randn(size, generator=gen, dtype=dtype)
        state = torch.rand(size, generator=gen, dtype=dtype)
        want = torch.nn.Parameter(param.clone())
        opt = torch.optim.Adagrad([want], lr=0.3, eps=1e-10)
        opt.state[want]["sum"].copy_(state)
        want.grad = grad.clone()
        opt.step()
        np_dtype = np.float32 if dtype == torch.float32 else np.float64
        got_state = state.clone()
        kernels.run_adagrad_dense(param.numpy(), got_state.numpy(), grad.numpy(), np_dtype(0.3), np_dtype(1e-10))
        tol = dict(rtol=1e-6, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-13, atol=1e-14)
        torch.testing.assert_close(got_state, opt.state[want]["sum"], **tol)
        torch.testing.assert_close(param, want.detach(), **tol)


def test_lbl_kernels_equal_the_products_and_sum_rows_by_id_equals_add_at(threads):
    """The log-bilinear kernels against numpy's products (float64 reference), and the per-word sum
    of gradient rows against np.add.at: ids unique and increasing, every id present."""
    rng = np.random.default_rng(1)
    vocab, dim, context, batch = 30, 6, 3, 13
    weight = rng.standard_normal((vocab, dim)).astype(np.float32)
    context_weight = rng.standard_normal((context, dim, dim)).astype(np.float32)
    ids = rng.integers(0, 8, context * batch).astype(np.int64)  # few words: many repeats
    out, gathered = kernels.run_lbl_forward(weight, ids, context_weight, batch)
    w64, r64 = weight.astype(np.float64), context_weight.astype(np.float64)
    want = sum(w64[ids[k * batch:(k + 1) * batch]] @ r64[k].T for k in range(context))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    grad_out = rng.standard_normal((batch, dim)).astype(np.float32)
    grad_context, rows = kernels.run_lbl_backward(grad_out, gathered, context_weight, True, True)
    for k in range(context):
        np.testing.assert_allclose(grad_context[k], grad_out.T.astype(np.float64) @ w64[ids[k * batch:(k + 1) * batch]],
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(rows[k], grad_out.astype(np.float64) @ r64[k], rtol=1e-5, atol=1e-5)
    unique, summed = kernels.sum_rows_by_id(ids, rows.reshape(-1, dim))
    dense = np.zeros((vocab, dim), dtype=np.float64)
    np.add.at(dense, ids, rows.reshape(-1, dim).astype(np.float64))
    assert unique.tolist() == sorted(set(ids.tolist()))
    np.testing.assert_allclose(summed, dense[unique], rtol=1e-5, atol=1e-5)
