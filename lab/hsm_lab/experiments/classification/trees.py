"""How a label tree groups labels: :func:`author_grouping` (do learned trees put one author's
books together? the classification chapter's section on it) and the tree files a table saves."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hsm import Tree

__all__ = ["author_grouping"]


def author_grouping(tree: Tree, category_of_label: Sequence[str]) -> dict[str, float]:
    """How well a label tree groups labels of the same category (books of one author).

    * ``ari_depth{1,2}`` / ``purity_depth{1,2}``: cut the tree below depth 1 (the root's
      children) or 2; each subtree (or leaf hanging above the cut) is a cluster of labels; the
      adjusted Rand index of those clusters against the categories, and the purity (share of labels
      whose cluster's majority category is theirs).
    * ``lca_same`` / ``lca_diff``: mean depth of the lowest common ancestor (root = 0) of pairs of
      labels with the same category / with different categories; a tree that groups authors has
      ``lca_same`` well above ``lca_diff``.
    """
    from sklearn.metrics import adjusted_rand_score

    k = tree.num_labels
    if len(category_of_label) != k:
        raise ValueError(f"{len(category_of_label)} categories for {k} labels")
    _, category = np.unique(np.asarray(category_of_label, dtype=object).astype(str), return_inverse=True)
    nodes = np.where(tree.path_mask[:k], tree.path_nodes[:k], -1)
    out: dict[str, float] = {}
    for cut in (1, 2):
        if nodes.shape[1] > cut:
            # cluster id: the node at depth `cut` on the path, or a singleton for a shallower leaf
            cluster = np.where(nodes[:, cut] >= 0, nodes[:, cut], -1 - np.arange(k))
        else:
            cluster = -1 - np.arange(k)
        out[f"ari_depth{cut}"] = float(adjusted_rand_score(category, cluster))
        _, cluster_id = np.unique(cluster, return_inverse=True)
        table = np.zeros((cluster_id.max() + 1, category.max() + 1))
        np.add.at(table, (cluster_id, category), 1)
        out[f"purity_depth{cut}"] = float(table.max(axis=1).sum() / k)
        out[f"clusters_depth{cut}"] = int(cluster_id.max() + 1)
    equal = nodes[:, None, :] == nodes[None, :, :]
    equal &= nodes[:, None, :] >= 0
    common = np.cumprod(equal, axis=2).sum(axis=2) - 1  # depth of the deepest shared node
    upper = np.triu_indices(k, 1)
    same = category[upper[0]] == category[upper[1]]
    lca = common[upper]
    out["lca_same"] = float(lca[same].mean()) if same.any() else float("nan")
    out["lca_diff"] = float(lca[~same].mean())
    out["max_depth"] = int(tree.max_depth)
    return out


def _save_trees(final: Tree, start: Tree, label_names: Sequence[str], tree_dir: Path, stem: str) -> tuple[str, str]:
    """Write the learned tree and the tree it started from, with the label names, to
    ``tree_dir/<stem>.json`` and ``tree_dir/<stem>-start.json``; their paths relative to the result
    file's folder (``tree_dir``'s parent)."""
    tree_dir.mkdir(parents=True, exist_ok=True)
    names = [str(n) for n in label_names]
    final = Tree(final.child_node, final.child_label, final.num_labels, label_names=names)
    start = Tree(start.child_node, start.child_label, start.num_labels, label_names=names)
    return (str(final.save(tree_dir / f"{stem}.json").relative_to(tree_dir.parent)),
            str(start.save(tree_dir / f"{stem}-start.json").relative_to(tree_dir.parent)))
