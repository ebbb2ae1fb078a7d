"""Showing a label tree: a text outline and a matplotlib drawing of its top levels.

Both show each node by its most frequent labels, as the papers' figures of learned trees do
(ICML Figure 3 and arXiv Figure 4 list the four most frequent words of each node).
``Tree.summary`` and ``Tree.draw`` call these functions.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .tree import Tree

__all__ = ["draw_tree", "tree_summary"]


def tree_summary(tree: Tree, counts: Any | None = None, k: int = 4, max_depth: int = 1,
                 max_children: int = 8) -> str:
    """A readable outline: each node down to ``max_depth`` with its label count and its ``k``
    most frequent labels (:meth:`Tree.top_labels`); at most ``max_children`` children per node."""
    lines = [repr(tree)]

    def visit(node: int, indent: str) -> None:
        labels = tree.labels_under(node)
        lines.append(f"{indent}node {node}: {labels.size} labels: {', '.join(tree.top_labels(node, counts, k))}")
        if tree.node_depth[node] >= max_depth:
            return
        shown = 0
        for slot in range(tree.arity):
            child = tree.child_node[node, slot]
            if child >= 0 and tree.slot_mask[node, slot]:
                if shown == max_children:
                    lines.append(f"{indent}  ...")
                    break
                visit(int(child), indent + "  ")
                shown += 1

    visit(0, "")
    return "\n".join(lines)


def draw_tree(
    tree: Tree,
    ax: Any = None,
    counts: Any | None = None,
    k: int = 4,
    max_depth: int = 2,
    max_children: int = 6,
    root: int = 0,
) -> Any:
    """Draw the top of ``tree`` with matplotlib and return the axes: each node shows its ``k``
    most frequent labels; at most ``max_children`` children per node are drawn (the busiest
    ones, by label mass under ``counts``, or by label count without counts)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(12, 1.8 * (max_depth + 1)))
    weights = None if counts is None else np.asarray(counts, dtype=np.float64)
    positions: dict[int, tuple[float, int]] = {}
    edges: list[tuple[int, int]] = []
    next_x = [0.0]

    def mass(node: int) -> float:
        labels = tree.labels_under(node)
        return float(weights[labels].sum()) if weights is not None else float(labels.size)

    def layout(node: int, depth: int) -> float:
        # leaves of the drawing get consecutive x; a parent sits above the mean of its children
        kids = [int(c) for c, ok in zip(tree.child_node[node], tree.slot_mask[node]) if c >= 0 and ok]
        if depth >= max_depth or not kids:
            x = next_x[0]
            next_x[0] += 1.0
        else:
            kids = sorted(kids, key=mass, reverse=True)[:max_children]
            xs = [layout(child, depth + 1) for child in kids]
            edges.extend((node, child) for child in kids)
            x = float(np.mean(xs))
        positions[node] = (x, depth)
        return x

    layout(root, 0)
    for a, b in edges:
        (xa, ya), (xb, yb) = positions[a], positions[b]
        ax.plot([xa, xb], [-ya, -yb], color="0.7", lw=1, zorder=1)
    for node, (x, y) in positions.items():
        text = "\n".join(tree.top_labels(node, counts, k))
        ax.text(x, -y, text, ha="center", va="center", fontsize=7, zorder=2,
                bbox=dict(boxstyle="round", fc="white", ec="0.5"))
    ax.set_xlim(-0.7, max(next_x[0] - 0.3, 0.7))
    ax.set_ylim(-max_depth - 0.6, 0.6)
    ax.axis("off")
    return ax
