"""hsm.distributed: Algorithm 1 with 2 gloo processes on CPU against 1 process on the same data."""
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from hsm.distributed import DistributedTreeLearner, average_gradients, broadcast_parameters, tree_checksum
from hsm.layers import HierarchicalSoftmax
from hsm.training import TreeLearner
from hsm.tree import Tree

STEPS, GLOBAL_BATCH, EVERY = 12, 16, 3
RELOAD_AT = 4  # between the re-assignments after steps 3 and 6


def _scenarios():
    return {
        "depth": Tree.random(60, 4, 3, seed=0),  # Algorithm 3
        "well_formed": Tree.huffman(np.arange(1, 41), 3),  # Algorithm 2 (moves and resets nodes)
    }


def _data(tree, seed=0):
    rng = np.random.default_rng(seed)
    probs = 1.0 / np.arange(1, tree.num_labels + 1)
    xs = torch.as_tensor(rng.normal(size=(STEPS, GLOBAL_BATCH, 8)))
    ys = torch.as_tensor(rng.choice(tree.num_labels, size=(STEPS, GLOBAL_BATCH), p=probs / probs.sum()))
    return xs, ys


def _models(tree):
    torch.manual_seed(0)
    encoder = torch.nn.Linear(8, 6).double()
    layer = HierarchicalSoftmax(6, tree, sparse=True).double()
    return encoder, layer


def _load_other_tree(layer):
    """What every rank does when resuming from a checkpoint with another tree: the layer's
    ``load_state_dict`` installs the saved tree, and the learner's statistics follow it."""
    state = layer.state_dict()
    other = HierarchicalSoftmax(layer.in_features, Tree.random(60, 4, 3, seed=5))
    state["_extra_state"] = other.get_extra_state()
    layer.load_state_dict(state)


def _train(tree, rank=None, world=1, reload_at=None):
    """Run Algorithm 1; rank None: one process on the whole batches. ``reload_at``: before that
    step, load a state dict with another tree into the layer (between two synchronisations)."""
    encoder, layer = _models(tree)
    if rank is None:
        learner = TreeLearner(layer, EVERY)
        model = encoder
    else:
        model = DistributedDataParallel(encoder)
        broadcast_parameters(layer)
        learner = DistributedTreeLearner(layer, EVERY)
    optimizer = torch.optim.SGD(list(model.parameters()) + list(layer.parameters()), lr=0.5)
    xs, ys = _data(tree)
    trees = []
    for step, (x, y) in enumerate(zip(xs, ys)):
        if step == reload_at:
            _load_other_tree(layer)
        if rank is not None:
            share = GLOBAL_BATCH // world
            x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        optimizer.zero_grad()
        layer(model(x), y).loss.backward()
        if rank is not None:
            average_gradients(layer)
        optimizer.step()
        if learner.step() is not None:
            trees.append(tree_checksum(layer.tree))
    return {"trees": trees, "weight": layer.weight.detach().clone(), "bias": layer.bias.detach().clone(),
            "encoder": encoder.weight.detach().clone(), "final_tree": layer.tree.to_dict()}


def _worker(rank, world, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {name: _train(tree, rank, world) for name, tree in _scenarios().items()}
        results["reload"] = _train(_scenarios()["depth"], rank, world, reload_at=RELOAD_AT)
        results["plain_learner"] = _plain_learner_error()
        results["mismatch"] = _mismatch_errors(rank)
        results["add_labels"] = _train_adding_labels(rank, world)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _mismatch_errors(rank):
    """What constructing the learner says when the ranks' layers differ: another tree of the same
    shape on each rank, then another label count (each a ValueError on every rank)."""
    errors = {}
    for name, tree in (("tree", Tree.random(60, 4, 3, seed=rank)), ("labels", Tree.random(60 + rank, 4, 3, seed=0))):
        try:
            DistributedTreeLearner(HierarchicalSoftmax(6, tree), EVERY, freeze_after=1)
            errors[name] = None
        except ValueError as error:
            errors[name] = str(error)
    return errors


def _train_adding_labels(rank=None, world=1):
    """Algorithm 1 with two labels added after step 4, then re-assignments over the grown tree."""
    tree = Tree.random(60, 4, 3, seed=0)
    encoder, layer = _models(tree)
    if rank is None:
        learner = TreeLearner(layer, EVERY)
    else:
        broadcast_parameters(layer)
        learner = DistributedTreeLearner(layer, EVERY)
    xs, ys = _data(tree)
    trees = []
    for step, (x, y) in enumerate(zip(xs, ys)):
        if step == RELOAD_AT:
            generator = torch.Generator().manual_seed(7)
            learner.add_labels([torch.randn(3, 6, generator=generator, dtype=torch.float64) + 2 * i for i in range(2)])
        optimizer = torch.optim.SGD(list(encoder.parameters()) + list(layer.parameters()), lr=0.5)
        if rank is not None:
            share = GLOBAL_BATCH // world
            x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        optimizer.zero_grad()
        layer(encoder(x), y).loss.backward()
        if rank is not None:
            average_gradients(layer)
            for param in encoder.parameters():  # the encoder is not wrapped in DDP here
                dist.all_reduce(param.grad)
                param.grad /= world
        optimizer.step()
        if learner.step() is not None:
            trees.append(tree_checksum(layer.tree))
    return {"trees": trees, "num_labels": layer.num_labels, "weight": layer.weight.detach().clone()}


def _plain_learner_error():
    """What constructing the single-process TreeLearner says inside the group (None: nothing)."""
    try:
        TreeLearner(HierarchicalSoftmax(4, Tree.random(9, 3, 2)), 3)
    except RuntimeError as error:
        return str(error)
    return None


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(2, str(out / "init"), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_ranks_hold_the_same_tree_after_every_reassignment(two_rank_results):
    rank0, rank1 = two_rank_results
    for name in _scenarios():
        assert len(rank0[name]["trees"]) == STEPS // EVERY
        assert rank0[name]["trees"] == rank1[name]["trees"]
        assert rank0[name]["final_tree"] == rank1[name]["final_tree"]
        torch.testing.assert_close(rank0[name]["weight"], rank1[name]["weight"], rtol=0, atol=0)
        torch.testing.assert_close(rank0[name]["bias"], rank1[name]["bias"], rtol=0, atol=0)


def test_two_ranks_match_one_process_on_the_same_data(two_rank_results):
    tree = _scenarios()["depth"]
    single = _train(tree)
    got = two_rank_results[0]["depth"]
    assert got["trees"] == single["trees"]
    # the trees actually changed: otherwise this would not test the statistics all-reduce
    assert len(set(single["trees"])) > 1 or single["trees"][0] != tree_checksum(tree)
    torch.testing.assert_close(got["weight"], single["weight"])
    torch.testing.assert_close(got["bias"], single["bias"])
    torch.testing.assert_close(got["encoder"], single["encoder"])


def test_helpers_need_an_initialised_process_group():
    tree = Tree.random(10, 3, 3)
    with pytest.raises(RuntimeError, match="not initialised"):
        DistributedTreeLearner(HierarchicalSoftmax(4, tree), 2)


def test_ranks_loading_another_tree_between_synchronisations_match_one_process(two_rank_results):
    # the statistics gathered before the load follow the new tree on every rank; the last
    # synchronised snapshot must follow it too, or the next all-reduce sums two layouts
    tree = _scenarios()["depth"]
    single = _train(tree, reload_at=RELOAD_AT)
    got = two_rank_results[0]["reload"]
    assert got["trees"] == two_rank_results[1]["reload"]["trees"]
    assert got["trees"] == single["trees"]
    assert got["final_tree"] == single["final_tree"]
    torch.testing.assert_close(got["weight"], single["weight"])


def test_plain_tree_learner_refuses_a_group_of_several_processes(two_rank_results):
    # each rank would rebuild the tree from its own shard's statistics: the model would fork
    for rank in two_rank_results:
        message = rank["plain_learner"]
        assert message is not None and "\n" not in message
        assert "2 processes" in message and "hsm.distributed.DistributedTreeLearner" in message


def test_plain_tree_learner_accepts_a_group_of_one_process(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        learner = TreeLearner(HierarchicalSoftmax(4, Tree.random(9, 3, 2)), 3)
    finally:
        dist.destroy_process_group()
    assert learner.steps == 0 and not dist.is_initialized()


def test_ranks_whose_layers_differ_are_refused_when_the_learner_is_built(two_rank_results):
    """One collective at construction: a tree of the same shape built with another seed, or
    another label count, is named at once on every rank (not at the first re-assignment, and
    also for a learner that will be frozen)."""
    for rank in two_rank_results:
        tree, labels = rank["mismatch"]["tree"], rank["mismatch"]["labels"]
        assert tree is not None and "hold different trees of K = 60 labels" in tree and "\n" not in tree
        assert labels is not None and "different label counts" in labels and "from 60 to 61" in labels


def test_labels_added_on_every_rank_keep_the_ranks_and_one_process_together(two_rank_results):
    rank0, rank1 = (r["add_labels"] for r in two_rank_results)
    single = _train_adding_labels()
    assert rank0["num_labels"] == rank1["num_labels"] == single["num_labels"] == 62
    assert len(rank0["trees"]) == STEPS // EVERY  # re-assignments went on over the grown tree
    assert rank0["trees"] == rank1["trees"] == single["trees"]
    torch.testing.assert_close(rank0["weight"], rank1["weight"], rtol=0, atol=0)
    torch.testing.assert_close(rank0["weight"], single["weight"])
