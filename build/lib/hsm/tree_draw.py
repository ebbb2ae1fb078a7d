"""Showing a label tree: a text outline, a drawing of its top levels, and a drawing of a small
tree in full.

The outline and :func:`draw_tree` show each node by its most frequent labels, as the papers'
figures of learned trees do (ICML Figure 3 and arXiv Figure 4 list the four most frequent words
of each node). ``Tree.summary`` and ``Tree.draw`` call these functions;
:func:`draw_tree_vertical` lays two levels out one node per line, so that a wide tree (65 children
per node) stays legible on a page. :func:`draw_label_tree` draws every node and leaf of a small
tree, as the papers' figures of a hierarchical predictor do (ICML Figure 1, thesis Figures 3.1-3.3
and 3.6): named nodes, one box per label, text on the edges (a child's number, a probability) and
one label's path in bold.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._optional import require
from .tree import Tree

__all__ = ["draw_label_tree", "draw_tree", "draw_tree_vertical", "tree_summary"]

#: draw_label_tree draws every leaf; beyond this many the boxes no longer fit a page's width
MAX_DRAWN_LEAVES = 40


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
    plt = require("matplotlib.pyplot", "drawing a tree")

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


# between the words of a node: a comma would be confused with the "," token
SEP = " \u00b7 "


def _children_by_mass(tree: Tree, node: int, weights: np.ndarray | None, limit: int) -> list[int]:
    """The ``limit`` children of ``node`` with the most label mass (label count without weights)."""
    kids = [int(c) for c, ok in zip(tree.child_node[node], tree.slot_mask[node]) if c >= 0 and ok]

    def mass(child: int) -> float:
        labels = tree.labels_under(child)
        return float(weights[labels].sum()) if weights is not None else float(labels.size)

    return sorted(kids, key=mass, reverse=True)[:limit]


def draw_tree_vertical(
    tree: Tree,
    ax: Any = None,
    counts: Any | None = None,
    k: int = 4,
    children: int = 8,
    grandchildren: int = 3,
    root: int = 0,
    fontsize: float = 9,
) -> Any:
    """Draw two levels below ``root`` top to bottom, one node per line, and return the axes.

    The root sits on the left with its ``k`` most frequent labels (ICML Figure 3 shows each
    node by its four most common words); the middle column lists its ``children`` busiest
    children (by label mass under ``counts``), each followed in the right column by its
    ``grandchildren`` busiest children. A 65-ary node cannot show all its children side by side
    at a legible size, so the drawing keeps the busiest and says how many there are."""
    plt = require("matplotlib.pyplot", "drawing a tree")

    if children < 1 or grandchildren < 1:
        raise ValueError(f"children={children} and grandchildren={grandchildren}: "
                         "draw at least one of each")
    weights = None if counts is None else np.asarray(counts, dtype=np.float64)
    level1 = _children_by_mass(tree, root, weights, children)
    rows: list[tuple[int, list[int]]] = [
        (child, _children_by_mass(tree, child, weights, grandchildren)) for child in level1]
    n_lines = sum(max(len(kids), 1) for _, kids in rows)
    if ax is None:
        # a line per node, tall enough for a boxed line of text at ``fontsize``
        _, ax = plt.subplots(figsize=(7, 0.034 * fontsize * n_lines + 0.6))
    # the middle column holds two words a line; wider text pushes the right column out
    x_root, x_mid, x_right = 0.0, 0.12, 0.42 + 0.03 * max(fontsize - 9, 0)
    box = dict(boxstyle="round,pad=0.25", fc="white", ec="0.6")
    line = 0
    mid_ys = []
    for child, kids in rows:
        ys = [-(line + i) for i in range(max(len(kids), 1))]
        line += len(ys)
        y_mid = float(np.mean(ys))
        mid_ys.append(y_mid)
        for kid, y in zip(kids, ys):
            # an elbow from the child to each of its own children
            ax.plot([x_right - 0.03, x_right - 0.015, x_right - 0.015, x_right],
                    [y_mid, y_mid, y, y], color="0.7", lw=0.8, zorder=1)
            ax.text(x_right, y, SEP.join(tree.top_labels(kid, counts, k)), ha="left",
                    va="center", fontsize=fontsize, bbox=box, zorder=2)
        # two words a line keep the middle column narrow enough for the right one
        words = tree.top_labels(child, counts, k)
        text = "\n".join(SEP.join(words[i:i + 2]) for i in range(0, len(words), 2))
        ax.text(x_mid, y_mid, text, ha="left", va="center", fontsize=fontsize, bbox=box, zorder=2)
    y_root = float(np.mean(mid_ys))
    for y in mid_ys:
        ax.plot([x_root + 0.07, x_mid - 0.03, x_mid - 0.015, x_mid],
                [y_root, y_root, y, y], color="0.7", lw=0.8, zorder=1)
    ax.text(x_root, y_root, "\n".join(tree.top_labels(root, counts, k)), ha="left", va="center",
            fontsize=fontsize, bbox=box, zorder=2)
    n_kids = int(tree.slot_mask[root].sum())
    ax.text(x_mid, 0.9, f"busiest {len(level1)} of {n_kids} children", ha="left",
            va="bottom", fontsize=fontsize - 1, color="0.35")
    ax.text(x_right, 0.9, f"busiest {grandchildren} children of each", ha="left",
            va="bottom", fontsize=fontsize - 1, color="0.35")
    ax.set_xlim(-0.01, 1.0)
    ax.set_ylim(-line + 0.4, 1.5)
    ax.axis("off")
    return ax


def draw_label_tree(
    tree: Tree,
    ax: Any = None,
    *,
    node_names: Mapping[int, str] | None = None,
    edge_text: Mapping[tuple[int, int], str] | None = None,
    highlight: int | None = None,
    child_numbers: bool = False,
    marked_nodes: Any = (),
    fontsize: float = 10,
) -> Any:
    """Draw every internal node and every leaf of a small ``tree`` and return the axes.

    Internal nodes are circles named ``node_names[n]`` (default ``n1, n2, ...``: node id + 1, so
    the root is ``n1`` as in the papers); leaves are boxes with the label names. ``highlight``
    is a label whose path ``c^label`` (ICML Eq. 3, :meth:`Tree.path`) is drawn in bold red.
    ``edge_text[(n, j)]`` is written on the edge from node ``n`` to its child slot ``j``
    (0-based), e.g. the node's probability of that child; ``child_numbers`` writes ``j + 1`` on
    every edge that has no other text. ``marked_nodes`` (node ids) are drawn with a dashed
    orange outline, e.g. the nodes a re-assignment created. Empty (masked) slots are skipped.
    """
    plt = require("matplotlib.pyplot", "drawing a tree")

    if tree.num_leaves > MAX_DRAWN_LEAVES:
        raise ValueError(
            f"draw_label_tree draws every leaf and this tree has {tree.num_leaves}; "
            f"use draw_tree (Tree.draw), which draws the top levels, for trees over "
            f"{MAX_DRAWN_LEAVES} leaves"
        )
    if highlight is not None and not 0 <= highlight < tree.num_labels:
        raise ValueError(
            f"highlight={highlight} is not a label of this tree: pick one of 0..{tree.num_labels - 1}"
        )
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 1.1 * (tree.max_depth + 1)))
    names = {n: f"n{n + 1}" for n in range(tree.num_nodes)}
    names.update(node_names or {})
    edge_text = dict(edge_text or {})
    marked = {int(n) for n in np.atleast_1d(np.asarray(marked_nodes, dtype=np.int64))}
    on_path = set(tree.path(highlight)) if highlight is not None else set()

    # leaves get consecutive x in depth-first order; a node sits above the mean of its children
    node_xy: dict[int, tuple[float, float]] = {}
    leaf_xy: dict[int, tuple[float, float]] = {}
    edges: list[tuple[int, int, tuple[float, float]]] = []
    next_x = [0.0]

    def layout(node: int, depth: int) -> float:
        xs = []
        for slot in range(tree.arity):
            if not tree.slot_mask[node, slot]:
                continue
            child, label = int(tree.child_node[node, slot]), int(tree.child_label[node, slot])
            if child >= 0:
                x = layout(child, depth + 1)
                end = (x, -(depth + 1.0))
            else:
                x = next_x[0]
                next_x[0] += 1.0
                end = (x, -(depth + 1.0))
                leaf_xy[label] = end
            edges.append((node, slot, end))
            xs.append(x)
        x = float(np.mean(xs))
        node_xy[node] = (x, -float(depth))
        return x

    layout(0, 0)
    for node, slot, (xb, yb) in edges:
        xa, ya = node_xy[node]
        bold = (node, slot) in on_path
        ax.plot([xa, xb], [ya, yb], color="tab:red" if bold else "0.55", lw=2.6 if bold else 1.1,
                zorder=1)
        text = edge_text.get((node, slot))
        if text is None and child_numbers:
            text = str(slot + 1)
        if text is not None:
            ax.text(xa + 0.55 * (xb - xa), ya + 0.55 * (yb - ya), text, ha="center", va="center",
                    fontsize=fontsize - 1, color="tab:red" if bold else "0.2", zorder=3,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none"))
    for node, (x, y) in node_xy.items():
        ax.text(x, y, names[node], ha="center", va="center", fontsize=fontsize, zorder=2,
                bbox=dict(boxstyle="circle,pad=0.25", fc="#e8eef7",
                          ec="tab:orange" if node in marked else "0.3",
                          ls="--" if node in marked else "-", lw=1.8 if node in marked else 1))
    for label, (x, y) in leaf_xy.items():
        name = tree.label_names[label] if tree.label_names is not None else str(label)
        bold = label == highlight
        ax.text(x, y, name, ha="center", va="center", fontsize=fontsize, zorder=2,
                bbox=dict(boxstyle="round,pad=0.3", fc="#fff4e0" if bold else "white",
                          ec="tab:red" if bold else "0.5", lw=1.8 if bold else 1))
    ax.set_xlim(-0.6, max(next_x[0] - 0.4, 0.6))
    ax.set_ylim(-tree.max_depth - 0.45, 0.45)
    ax.axis("off")
    return ax
