"""hsm: learned-tree hierarchical softmax (Jernite, Choromanska & Sontag, ICML 2017), reproduced.

The pieces follow the paper's concepts:

* :mod:`hsm.objective`: the node objective J_n (eqs. 6-12), purity, balance; :mod:`hsm.theory`: the
  bounds around it (Lemmas 4-5, Theorem 1) and its sample estimates;
* :class:`hsm.Tree`: M-ary label trees (random, balanced, Huffman, taxonomy, clustering);
* :mod:`hsm.assign`: AssignLabels, Algorithms 2 (well-formed) and 3 (depth constraint);
* :class:`hsm.HierarchicalSoftmax` / :class:`hsm.FlatSoftmax`: output layers with the interface
  of ``torch.nn.AdaptiveLogSoftmaxWithLoss`` (:mod:`hsm.layers`; their fast path in :mod:`hsm.backend`
  and :mod:`hsm.kernels`, their searches in :mod:`hsm.search`);
* :class:`hsm.RowSparseAdagrad` / :class:`hsm.RowSparseSGD`: optimisers for the layer's row-sparse
  gradients (:mod:`hsm.optim`), :class:`hsm.TreeModelOptimizer`, the body's optimiser and the
  layer's stepped as one, and :func:`hsm.clip_grad_norm_`, gradient clipping that takes them
  (:mod:`hsm.clipping`);
* :class:`hsm.TreeLearner`: Algorithm 1 (the tree learned during training);
* :class:`hsm.FastBowClassifier`: the bag-of-words classifier of §7.1 trained like fastText
  (compiled per-example Hogwild SGD, flat / Huffman / learned trees; ``fit``, ``predict``, ``test``);
* :class:`hsm.SparseTreeClassifier`: the same tree learning with a linear model per node on
  sparse TF-IDF features (:mod:`hsm.classifiers.sparse_tree`, :mod:`hsm.classifiers.sparse_features`), the
  representation of today's label-tree libraries (both classifiers are imported on first use:
  ``import hsm`` loads the layers, the trees and Algorithm 1);

Quick start::

    import torch, hsm
    tree = hsm.Tree.random(num_labels=10_000, arity=25, depth=3, seed=0)
    layer = hsm.HierarchicalSoftmax(in_features=200, tree=tree)
    # Algorithm 1: learn the tree (statistics never decayed, decay=1), then freeze it and fine-tune
    learner = hsm.TreeLearner(layer, reassign_every=500, freeze_after=learning_steps)
    out = layer(h, target)          # out.output = log p(target | h), out.loss = mean NLL
    out.loss.backward(); optimizer.step(); learner.step()

Under ``torch.distributed`` with several processes, use
:class:`hsm.distributed.DistributedTreeLearner` (:mod:`hsm.distributed`).
"""
from ._numba_cache import ensure_cache_location

ensure_cache_location()  # before any kernel is defined: a read-only install needs another cache folder

from .assign import (  # noqa: E402
    AssignmentDeadlock,
    AssignmentError,
    assign_labels_depth_constrained,
    assign_labels_well_formed,
    assign_node,
    assign_node_well_formed,
)
from .clipping import clip_grad_norm_
from .layers import FlatSoftmax, HierarchicalSoftmax, HSMOutput, NonFiniteInputError, TopK
from .objective import balance, max_objective, node_objective, node_objective_grad, purity
from .optim import RowSparseAdagrad, RowSparseSGD, TreeModelOptimizer
from .statistics import NodeStatistics, ReleasedStatistics
from .training import TreeLearner, evaluate, train_epoch
from .tree import Tree

__version__ = "0.1.0"

#: the classifiers (:mod:`hsm.classifiers`), imported on first use: ``import hsm`` loads the layers
#: and Algorithm 1 only
_CLASSIFIERS = ("FastBowClassifier", "SparseTreeClassifier")


def __getattr__(name: str) -> object:
    if name in _CLASSIFIERS:
        import importlib  # loaded on first use, not by ``import hsm``

        value = getattr(importlib.import_module("hsm.classifiers"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'hsm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_CLASSIFIERS))


__all__ = [
    "AssignmentDeadlock",
    "AssignmentError",
    "FastBowClassifier",
    "FlatSoftmax",
    "HSMOutput",
    "HierarchicalSoftmax",
    "NodeStatistics",
    "NonFiniteInputError",
    "ReleasedStatistics",
    "RowSparseAdagrad",
    "RowSparseSGD",
    "SparseTreeClassifier",
    "TopK",
    "Tree",
    "TreeLearner",
    "TreeModelOptimizer",
    "assign_labels_depth_constrained",
    "assign_labels_well_formed",
    "assign_node",
    "assign_node_well_formed",
    "balance",
    "clip_grad_norm_",
    "evaluate",
    "max_objective",
    "node_objective",
    "node_objective_grad",
    "purity",
    "train_epoch",
]
