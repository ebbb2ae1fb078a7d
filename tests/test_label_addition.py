"""hsm.label_addition: new labels placed by the node objective without retraining."""
import copy

import numpy as np
import pytest
import torch

import hsm
from hsm.assign import assignment_score
from hsm.label_addition import add_labels


def _trained(tree: hsm.Tree, dim: int = 6, steps: int = 300, seed: int = 0):
    """A layer and learner trained on Gaussian classes (centres in ``centres``)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    centres = torch.tensor(rng.normal(size=(tree.num_labels + 3, dim)), dtype=torch.float32) * 2
    layer = hsm.HierarchicalSoftmax(dim, tree)
    learner = hsm.TreeLearner(layer, reassign_every=50, freeze_after=200)
    optimizer = torch.optim.Adagrad(layer.parameters(), lr=0.3)
    for _ in range(steps):
        y = torch.randint(0, tree.num_labels, (32,))
        out = layer(centres[y] + torch.randn(32, dim), y)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        learner.step()
    return layer, learner, centres


TREES = {
    "huffman-3": lambda: hsm.Tree.huffman(np.arange(1, 11), 3),
    "binary": lambda: hsm.Tree.huffman(np.ones(9), 2),
    "fixed-depth": lambda: hsm.Tree.random(10, 3, 3, seed=1),
}


@pytest.mark.parametrize("name", sorted(TREES))
def test_each_step_of_the_descent_is_the_brute_force_best_child(name):
    """At every node of the new label's path, the chosen child maximises the whole node's assignment
    score (eq. 14) over the children with room, every trained label kept in its child."""
    layer, learner, centres = _trained(TREES[name]())
    before = copy.deepcopy(layer)
    tree, dim, arity = before.tree, before.in_features, before.arity
    h = centres[-1] + torch.randn(7, dim)
    result = add_labels(layer, [h], statistics=learner.statistics)
    path = result.paths[0]
    weight = before.weight.detach().double().view(tree.num_nodes, arity, dim)
    bias = before.bias.detach().double()
    weights_all = learner.statistics.label_weights()
    for depth, (node, slot) in enumerate(path):
        if node >= tree.num_nodes:  # a node created for the new label: its slot is not a choice
            continue
        logits = h.double() @ weight[node].T + bias[node]
        logits = logits.masked_fill(~torch.as_tensor(tree.slot_mask[node]), -np.inf)
        p_new = torch.softmax(logits, dim=1).mean(0).numpy()
        labels = tree.labels_under(node)
        p_old = learner.statistics.p_cond(depth, labels, np.full(labels.size, node))
        children_old = tree.path_children[labels, depth]
        counts = np.concatenate([weights_all[labels], [h.shape[0]]])
        if tree.depth_limit is not None:  # a child is a candidate while it has an empty leaf below
            room = []
            for j in range(arity):
                child = tree.child_node[node, j]
                below = tree.labels_under(child).size if child >= 0 else int(tree.child_label[node, j] >= 0)
                room.append(below < arity ** (tree.depth_limit - depth - 1))
        else:
            room = [True] * arity
        values = [assignment_score(np.vstack([p_old, p_new]), counts, np.append(children_old, j)) if room[j]
                  else -np.inf for j in range(arity)]
        best = np.flatnonzero(np.isclose(values, max(values), rtol=0, atol=1e-12))
        assert slot in best, (depth, node, slot, values)


@pytest.mark.parametrize("name", sorted(TREES))
def test_trained_labels_keep_their_paths_and_parameters(name):
    layer, learner, centres = _trained(TREES[name]())
    old = copy.deepcopy(layer)
    examples = [centres[-1] + torch.randn(5, layer.in_features), centres[-2] + torch.randn(3, layer.in_features)]
    result = learner.add_labels(examples)
    tree, old_tree = layer.tree, old.tree
    assert tree.num_labels == old_tree.num_labels + 2 and list(result.labels) == [old_tree.num_labels,
                                                                                 old_tree.num_labels + 1]
    for label in range(old_tree.num_labels):
        # the path is unchanged, or its leaf became new nodes (one per new label placed beside it),
        # in each of which the trained label holds slot 0
        before, after = old_tree.path(label), tree.path(label)
        assert after[: len(before)] == before or (after[: len(before) - 1] == before[:-1]
                                                   and after[len(before) - 1][0] == before[-1][0])
        assert all(node >= old_tree.num_nodes and slot == 0 for node, slot in after[len(before):])
    # every parameter of the trained tree is unchanged, but the new labels' own slots
    arity, dim = layer.arity, layer.in_features
    new_w = layer.weight.detach().view(tree.num_nodes, arity, dim)[: old_tree.num_nodes]
    old_w = old.weight.detach().view(old_tree.num_nodes, arity, dim)
    changed = torch.zeros(old_tree.num_nodes, arity, dtype=torch.bool)
    for node, slot in result.slots:
        if node < old_tree.num_nodes:
            changed[node, slot] = True
    assert torch.equal(new_w[~changed], old_w[~changed])
    assert torch.equal(layer.bias.detach()[: old_tree.num_nodes][~changed], old.bias.detach()[~changed])
    # the statistics follow the grown tree and keep the trained labels' counts
    assert learner.statistics.label_counts.shape[0] == tree.num_leaves
    assert torch.equal(learner.statistics.label_counts[: old_tree.num_labels],
                       learner.statistics.label_counts[: old_tree.num_labels])
    assert layer.statistics is learner.statistics or learner.frozen


def test_a_new_label_with_a_distinct_direction_is_predicted_for_most_of_its_examples():
    layer, learner, centres = _trained(hsm.Tree.huffman(np.ones(12), 3), dim=8, steps=400)
    direction = torch.zeros(8)
    direction[0] = 12.0
    result = learner.add_labels([direction + torch.randn(20, 8)])
    test = direction + torch.randn(200, 8)
    assert (layer.predict(test) == int(result.labels[0])).float().mean() > 0.8
    assert result.seconds < 1.0


def test_random_placement_is_seeded():
    layer, learner, centres = _trained(hsm.Tree.random(10, 3, 3, seed=1))
    examples = [centres[-1] + torch.randn(4, layer.in_features)]
    slots = [add_labels(copy.deepcopy(layer), examples, placement="random", seed=s).slots.tolist() for s in (1, 1, 2)]
    assert slots[0] == slots[1]


def test_the_grown_layer_and_learner_round_trip_through_their_state_dicts():
    layer, learner, centres = _trained(hsm.Tree.huffman(np.arange(1, 11), 3))
    result = learner.add_labels([centres[-1] + torch.randn(5, layer.in_features)])
    copy_layer = hsm.HierarchicalSoftmax(layer.in_features, result.tree)
    copy_layer.load_state_dict(layer.state_dict())
    copy_learner = hsm.TreeLearner(copy_layer, reassign_every=50)
    copy_learner.load_state_dict(learner.state_dict())
    h = torch.randn(9, layer.in_features)
    torch.testing.assert_close(copy_layer.log_prob(h), layer.log_prob(h), rtol=0, atol=0)
    assert copy_layer.tree == layer.tree
    assert torch.equal(copy_learner.statistics.label_counts, learner.statistics.label_counts)


@pytest.mark.parametrize("examples, error, match", [
    ([], ValueError, "no new labels"),
    (torch.randn(3, 6), TypeError, r"a list with one \[n, d\] tensor of representations per new label"),
    ([torch.randn(3, 5)], ValueError, r"examples\[0\] has shape \(3, 5\); the layer takes \[n, 6\]"),
    ([torch.randn(0, 6)], ValueError, r"examples\[0\] holds no example"),
    ([torch.full((2, 6), float("nan"))], ValueError, r"examples\[0\] holds NaN"),
    ([[1.0] * 6], TypeError, r"examples\[0\] must be a torch tensor"),
])
def test_bad_examples_are_refused_in_one_line_and_change_nothing(examples, error, match):
    layer = hsm.HierarchicalSoftmax(6, hsm.Tree.huffman(np.ones(8), 3))
    before = copy.deepcopy(layer.state_dict())
    with pytest.raises(error, match=match):
        add_labels(layer, examples)
    assert layer.num_labels == 8
    for key, value in layer.state_dict().items():
        assert torch.equal(value, before[key])


def test_other_bad_settings_are_refused():
    layer = hsm.HierarchicalSoftmax(6, hsm.Tree.random(8, 2, 3, seed=0))  # 8 labels in 8 leaves: full
    with pytest.raises(ValueError, match="0 empty leaves for 1 new labels: build it one level deeper"):
        add_labels(layer, [torch.randn(2, 6)])
    with pytest.raises(TypeError, match="needs an hsm.HierarchicalSoftmax"):
        add_labels(hsm.FlatSoftmax(6, 8), [torch.randn(2, 6)])
    named = hsm.HierarchicalSoftmax(6, hsm.Tree.huffman(np.ones(4), 2, label_names=list("abcd")))
    with pytest.raises(ValueError, match="label a already in the model"):
        add_labels(named, [torch.randn(2, 6)], label_names=["a"])
    with pytest.raises(ValueError, match="give one name per new label"):
        add_labels(named, [torch.randn(2, 6)])
    with pytest.raises(ValueError, match="placement must be"):
        add_labels(named, [torch.randn(2, 6)], label_names=["e"], placement="best")
    assert add_labels(named, [torch.randn(2, 6)], label_names=["e"]).tree.label_names == list("abcde")


def _bow_data(num_labels=6, per_label=40, seed=0):
    """Documents whose words say their label: label y uses words 10 y .. 10 y + 9."""
    rng = np.random.default_rng(seed)
    docs, labels = [], []
    for label in range(num_labels):
        for _ in range(per_label):
            docs.append(rng.integers(10 * label, 10 * label + 10, size=6))
            labels.append(label)
    return docs, np.array(labels)


def test_the_bag_of_words_classifier_adds_labels_and_saves_them(tmp_path):
    docs, labels = _bow_data(num_labels=8)
    train = labels < 6
    clf = hsm.FastBowClassifier(dim=8, output="learned", arity=2, epochs=10, lr=0.5, threads=1, seed=0)
    clf.fit([d for d, keep in zip(docs, train) if keep], labels[train], num_words=80)
    new_docs = [[d for d, y in zip(docs, labels) if y == label][:5] for label in (6, 7)]
    result = clf.add_labels(new_docs)
    assert clf.num_labels == 8 and list(result.labels) == [6, 7]
    path = clf.save(tmp_path / "model.bin")
    loaded = hsm.FastBowClassifier.load(path)
    test_docs = [d for d, y in zip(docs, labels) if y >= 6]
    assert np.array_equal(loaded.predict(test_docs).labels, clf.predict(test_docs).labels)
    flat = hsm.FastBowClassifier(dim=4, output="flat", epochs=1, threads=1).fit(docs[:80], labels[:80])
    with pytest.raises(ValueError, match="output is flat"):
        flat.add_labels([[np.array([1, 2])]])
    with pytest.raises(ValueError, match=r"docs_per_label\[0\] is empty"):
        clf.add_labels([[]])
