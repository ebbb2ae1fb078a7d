"""hsm.assign: the greedy AssignLabels of Algorithms 2 and 3 against plain references."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hsm.assign import (
    AssignmentDeadlock,
    AssignmentError,
    assign_labels_depth_constrained,
    assign_labels_well_formed,
    assign_node,
    assign_node_well_formed,
    assignment_score,
    brute_force_assign,
    greedy_assign_reference,
    pair_scores,
)
from hsm.objective import TIE_TOLERANCE, node_objective_grad, ranking_scores
from hsm.tree import Tree


@st.composite
def node_instances(draw, max_labels=10, max_arity=5):
    k = draw(st.integers(1, max_labels))
    m = draw(st.integers(2, max_arity))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    p_cond = rng.dirichlet(np.full(m, draw(st.sampled_from([0.2, 1.0, 5.0]))), size=k)
    counts = rng.integers(0, 30, size=k).astype(float)
    counts[rng.integers(k)] += 1
    capacity = rng.integers(0, k + 1, size=m)
    capacity[rng.integers(m)] += max(0, k - capacity.sum())
    return p_cond, counts, capacity


@settings(max_examples=150, deadline=None)
@given(node_instances(), st.sampled_from(["eq10", "eq12"]))
def test_greedy_equals_plain_python_reference(instance, score):
    p_cond, counts, capacity = instance
    fast = assign_node(p_cond, counts, capacity, score)
    slow, accepted = greedy_assign_reference(p_cond, counts, capacity, score, return_order=True)
    np.testing.assert_array_equal(fast, slow)
    # every label once, capacities respected, pairs accepted in non-increasing score order
    assert (fast >= 0).all()
    assert (np.bincount(fast, minlength=len(capacity)) <= capacity).all()
    scores = [s for _, _, s in accepted]
    assert all(a >= b for a, b in zip(scores, scores[1:]))


@settings(max_examples=60, deadline=None)
@given(node_instances(), st.sampled_from(["eq10", "eq12"]))
def test_scores_are_eq10_and_eq12(instance, score):
    p_cond, counts, _ = instance
    np.testing.assert_allclose(pair_scores(p_cond, counts, score), node_objective_grad(counts / counts.sum(), p_cond, score=score))


@st.composite
def tied_node_instances(draw, max_labels=12, max_arity=5):
    """Nodes full of ties: uninformed labels (p_{.|i} uniform, whose gap to p_j is rounding noise),
    repeated rows, zero counts, next to ordinary labels."""
    k = draw(st.integers(1, max_labels))
    m = draw(st.integers(2, max_arity))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p_cond = rng.dirichlet(np.ones(m), size=k)
    kind = rng.integers(0, 3, size=k)
    p_cond[kind == 0] = 1.0 / m  # uninformed
    p_cond[kind == 1] = p_cond[0]  # the same row as label 0
    counts = rng.integers(0, 4, size=k).astype(float)
    counts[rng.integers(k)] += 1
    capacity = np.full(m, -(-k // m))
    return p_cond, counts, capacity


@settings(max_examples=100, deadline=None)
@given(tied_node_instances(), st.sampled_from(["eq10", "eq12"]))
def test_compiled_scores_are_the_objective_definition(instance, score):
    """The compiled greedy scores pairs with hsm.objective.ranking_scores, tie rule included
    (bit for bit), and so visits them in the order of the plain reference."""
    from hsm.assign import _pair_score, node_terms

    p_cond, counts, capacity = instance
    k, m = p_cond.shape
    node = np.zeros(k, dtype=np.int64)
    coefficient, marginal = node_terms(p_cond, counts, node, 1)
    expected = ranking_scores(coefficient, p_cond, marginal[node], times_p_cond=score == "eq12")
    compiled = np.array([[_pair_score(p_cond, marginal, coefficient, score == "eq12", i, 0, j) for j in range(m)]
                         for i in range(k)])
    np.testing.assert_array_equal(compiled, expected)
    np.testing.assert_array_equal(pair_scores(p_cond, counts, score), expected)
    uninformed = np.abs(p_cond - marginal[node]).max(axis=1) <= TIE_TOLERANCE
    assert (expected[uninformed] == 0).all()
    np.testing.assert_array_equal(assign_node(p_cond, counts, capacity, score),
                                  greedy_assign_reference(p_cond, counts, capacity, score))


def test_unknown_scores_are_rejected_by_every_entry_point():
    """Only "eq10" / "eq12" name a score (the old "p" / "logp" included: they are not accepted)."""
    rng = np.random.default_rng(0)
    p_cond, counts = rng.dirichlet(np.ones(3), size=7), np.arange(1.0, 8.0)
    tree = Tree.random(30, 3, 4, seed=0)
    stats = HashedStatistics(30, 3, 30, 0)
    for bad in ("p", "logp", "logq"):
        for call in (lambda: pair_scores(p_cond, counts, bad), lambda: assign_node(p_cond, counts, 3, bad),
                     lambda: assign_labels_depth_constrained(tree, stats, bad)):
            with pytest.raises(ValueError, match="score must be 'eq10'"):
                call()


def test_greedy_is_not_always_optimal_lemma1():
    """Lemma 1 claims the greedy finds the best assignment; an eq. 12 instance (capacity 2, M = 3,
    the book's Errata chapter) shows it does not."""
    q = np.array([0.094, 0.619, 0.187, 0.101])
    p_cond = np.array([[0.257, 0.681, 0.062], [0.093, 0.068, 0.839], [0.086, 0.287, 0.626], [0.041, 0.592, 0.368]])
    greedy = assign_node(p_cond, q, 2, "eq12")
    best, best_value = brute_force_assign(p_cond, q, 2, "eq12")
    greedy_value = assignment_score(p_cond, q, greedy, "eq12")
    assert greedy_value == pytest.approx(0.1974, abs=5e-4)
    assert best_value == pytest.approx(0.2113, abs=5e-4)
    assert greedy_value < best_value - 0.01


@settings(max_examples=60, deadline=None)
@given(node_instances(max_labels=8, max_arity=4))
def test_arxiv_gradient_ascent_claim_holds_when_capacity_is_half(instance):
    """arXiv Lemma 1, second part: with capacity L >= K/2 per child, the greedy's eq. 10 gain is >= 0."""
    p_cond, counts, _ = instance
    capacity = int(np.ceil(len(counts) / 2))
    assert assignment_score(p_cond, counts, assign_node(p_cond, counts, capacity, "eq10"), "eq10") >= -1e-12


@pytest.mark.parametrize("arity", [2, 3, 4, 5, 20, 65])
def test_well_formed_rule_never_deadlocks(arity):
    rng = np.random.default_rng(arity)
    for trial in range(25):
        k = arity + (arity - 1) * int(rng.integers(0, 8))
        concentration = [0.05, 0.3, 1.0, 10.0][trial % 4]
        p_cond = rng.dirichlet(np.full(arity, concentration), size=k)
        counts = rng.integers(0, 50, size=k).astype(float)
        counts[0] += 1
        for score in ("eq10", "eq12"):
            children = assign_node_well_formed(p_cond, counts, score)
            sizes = np.bincount(children, minlength=arity)
            assert (sizes >= 1).all() and ((sizes - 1) % (arity - 1) == 0).all(), sizes


@pytest.mark.parametrize("arity,k", [(4, 7), (5, 9), (2, 5), (20, 39)])
def test_printed_checkfull_deadlocks(arity, k):
    rng = np.random.default_rng(0)
    p_cond = rng.dirichlet(np.ones(arity), size=k)
    with pytest.raises(AssignmentDeadlock, match="printed CheckFull deadlocked"):
        assign_node_well_formed(p_cond, np.ones(k), rule="printed")
    sizes = np.bincount(assign_node_well_formed(p_cond, np.ones(k)), minlength=arity)
    assert ((sizes - 1) % (arity - 1) == 0).all()


def test_printed_checkfull_works_for_three_children():
    rng = np.random.default_rng(1)
    for k in (3, 5, 7, 9, 11):
        children = assign_node_well_formed(rng.dirichlet(np.ones(3), size=k), np.ones(k), rule="printed")
        assert ((np.bincount(children, minlength=3) - 1) % 2 == 0).all()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: assign_node(np.full((3, 2), 0.5), np.ones(3), 1), "do not fit"),
        (lambda: assign_node(np.full((3, 2), 0.5), np.ones(2), 3), "counts must have shape"),
        (lambda: assign_node(np.full((3, 2), np.nan), np.ones(3), 3), "finite"),
        (lambda: assign_node(np.full((3, 2), 0.5), np.zeros(3), 3), "all be zero"),
        (lambda: assign_node(np.full((3, 2), 0.5), np.ones(3), 3, score="q"), "score must be"),
        (lambda: assign_node_well_formed(np.full((4, 3), 1 / 3), np.ones(4)), "K = 1 \\(mod M-1\\)"),
    ],
)
def test_errors(call, message):
    with pytest.raises((ValueError, AssignmentError), match=message):
        call()


class HashedStatistics:
    """A statistics source whose p_{.|i} depends on (label, depth, node): deterministic, random-looking."""

    def __init__(self, num_leaves, arity, num_labels, seed=0, node_dependent=True):
        self.rng_seed, self.arity, self.node_dependent = seed, arity, node_dependent
        self.weights = np.random.default_rng(seed).integers(1, 100, size=num_leaves).astype(float)
        self.weights[num_labels:] = 0.0

    def label_weights(self):
        return self.weights

    def p_cond(self, depth, labels, nodes):
        out = np.empty((len(labels), self.arity))
        for row, (label, node) in enumerate(zip(labels, nodes)):
            key = (self.rng_seed, int(label), depth, int(node) if self.node_dependent else 0)
            out[row] = np.random.default_rng(abs(hash(key)) % 2**32).dirichlet(np.full(self.arity, 0.5))
        return out


def _reference_depth_constrained(tree, stats, score):
    """Algorithm 3 node by node with the plain-Python greedy."""
    m, depth = tree.arity, tree.depth_limit
    positions = np.zeros(tree.num_labels, dtype=np.int64)

    def recurse(labels, node, level, position):
        if level == depth:
            positions[labels] = position
            return
        p_cond = stats.p_cond(level, labels, np.full(len(labels), node))
        children = greedy_assign_reference(p_cond, stats.label_weights()[labels], m ** (depth - 1 - level), score)
        for j in range(m):
            if (children == j).any():
                recurse(labels[children == j], node * m + j + 1, level + 1, position * m + j)

    recurse(np.arange(tree.num_labels), 0, 0, 0)
    return positions


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 40), m=st.integers(2, 4), seed=st.integers(0, 1000), score=st.sampled_from(["eq10", "eq12"]))
def test_algorithm3_tree_level_equals_node_by_node(k, m, seed, score):
    depth = int(np.ceil(np.log(k) / np.log(m) - 1e-9)) + (seed % 2)
    depth = max(depth, 1)
    while m**depth < k:
        depth += 1
    tree = Tree.random(k, m, depth, seed=seed)
    stats = HashedStatistics(k, m, k, seed)
    result = assign_labels_depth_constrained(tree, stats, score)
    np.testing.assert_array_equal(result.tree.leaf_positions(), _reference_depth_constrained(tree, stats, score))
    # capacity: a depth-d subtree never holds more labels than its M^(D-d) leaves (by construction of a valid tree)
    assert result.tree.depth_limit == depth and (result.tree.depths == depth).all()


def test_algorithm3_arxiv_printed_capacity_fails():
    tree = Tree.random(100, 3, 5, seed=0)
    stats = HashedStatistics(100, 3, 100, 0)
    with pytest.raises(AssignmentError, match="arXiv print's capacity"):
        assign_labels_depth_constrained(tree, stats, capacity_rule="arxiv_printed")


def _nested_partition(tree, node=0):
    parts = []
    for j in range(tree.arity):
        if tree.child_node[node, j] >= 0:
            parts.append(_nested_partition(tree, tree.child_node[node, j]))
        else:
            parts.append(int(tree.child_label[node, j]))
    return parts


def _reference_well_formed(tree, stats, score):
    """Algorithm 2 node by node with the node-level function (statistics independent of the node)."""
    def recurse(labels, level):
        if len(labels) == 1:
            return int(labels[0])
        p_cond = stats.p_cond(level, labels, np.zeros(len(labels), dtype=int))
        weights = stats.label_weights()[labels]
        if weights.sum() == 0:
            weights = weights + 1e-300  # all-dummy node: scores are all zero either way
        children = assign_node_well_formed(p_cond, weights, score)
        return [recurse(labels[children == j], level + 1) for j in range(tree.arity)]

    return recurse(np.arange(tree.num_leaves), 0)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 60), m=st.integers(2, 5), seed=st.integers(0, 1000), score=st.sampled_from(["eq10", "eq12"]))
def test_algorithm2_tree_level_equals_node_by_node(k, m, seed, score):
    counts = np.random.default_rng(seed).integers(1, 50, size=k)
    tree = Tree.huffman(counts, m)
    stats = HashedStatistics(tree.num_leaves, m, k, seed, node_dependent=False)
    result = assign_labels_well_formed(tree, stats, score)
    new = result.tree
    assert new.is_well_formed() and new.num_nodes == tree.num_nodes and new.num_leaves == tree.num_leaves
    assert _nested_partition(new) == _reference_well_formed(tree, stats, score)
    assert 0.0 <= result.moved_labels <= 1.0


def test_algorithm2_keeps_node_ids_when_nothing_changes():
    """Re-assigning twice from the same statistics gives the same tree: nodes keep their ids."""
    counts = np.random.default_rng(3).integers(1, 100, size=200)
    tree = Tree.huffman(counts, 5)
    stats = HashedStatistics(tree.num_leaves, 5, 200, 3, node_dependent=False)
    first = assign_labels_well_formed(tree, stats).tree
    second = assign_labels_well_formed(first, stats)
    assert second.tree == first and second.moved_labels == 0.0 and len(second.moved_nodes) == 0


def test_algorithm2_uninformed_labels_do_not_grow_a_chain():
    """With no statistics at all (every score 0) the tie rule deals labels round-robin, so the
    rebuilt tree stays shallow instead of degenerating into a chain of depth K/(M-1)."""

    class Uninformed(HashedStatistics):
        def p_cond(self, depth, labels, nodes):
            return np.full((len(labels), self.arity), 1.0 / self.arity)

    tree = Tree.huffman(np.ones(1000), 4)
    new = assign_labels_well_formed(tree, Uninformed(tree.num_leaves, 4, 1000)).tree
    assert new.max_depth <= 7


# ---------------------------------------------------------------------------- Algorithm 1's rebuild
def test_assign_labels_refuses_an_unknown_algorithm_in_one_line() -> None:
    from hsm.assign import assign_labels

    with pytest.raises(ValueError, match="algorithm must be 'depth' or 'well_formed', got 'bfs'"):
        assign_labels(Tree.random(8, 2, 3, seed=0), None, "bfs")  # type: ignore[arg-type]


def test_every_training_driver_rebuilds_through_the_one_algorithm_1_rebuild(monkeypatch) -> None:
    """TreeLearner, the bag-of-words classifier's trainer and the sparse classifier's trainer all
    call :func:`hsm.assign.rebuild_tree`: one AssignLabels call per recorded rebuild."""
    import scipy.sparse as sp
    import torch

    import hsm
    import hsm.assign as assign
    from hsm.classifiers.sparse_tree import SparseTreeClassifier

    calls: list[str] = []
    real = assign.assign_labels

    def counted(tree, statistics, algorithm, score=None):
        calls.append(algorithm)
        return real(tree, statistics, algorithm, score=score)

    monkeypatch.setattr(assign, "assign_labels", counted)

    torch.manual_seed(0)
    layer = hsm.HierarchicalSoftmax(4, hsm.Tree.random(12, 3, 3, seed=0))
    learner = hsm.TreeLearner(layer, reassign_every=1)
    for _ in range(3):
        layer(torch.randn(5, 4), torch.randint(0, 12, (5,))).loss.backward()
        learner.step()
    assert calls == ["depth"] * 3 and len(learner.history) == 3

    calls.clear()
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 30, size=int(rng.integers(1, 5))) for _ in range(60)]
    labels = rng.integers(0, 7, size=len(docs))
    clf = hsm.FastBowClassifier(dim=4, output="learned", arity=2, epochs=2, threads=1, rebuilds=2).fit(docs, labels)
    assert calls == ["well_formed"] * len(clf.history.rebuilds) and calls

    calls.clear()
    features = sp.random(60, 20, density=0.3, format="csr", random_state=0, dtype=np.float32)
    sparse = SparseTreeClassifier(output="learned", arity=2, epochs=2, threads=1).fit(features, labels, num_labels=7)
    assert calls == ["well_formed"] * len(sparse.history.rebuilds) and calls
