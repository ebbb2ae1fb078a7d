"""Saving and loading label trees: the ``hsm.Tree/1`` JSON description of a :class:`hsm.tree.Tree`.

A tree is stored as its two ``[N, M]`` slot arrays (``child_node``, ``child_label``), its label
count ``K``, its depth limit ``D`` (fixed-depth trees of Algorithm 3) and optional label names:
everything else (paths of eq. 3, masks, depths) is derived again on loading, so a file written
by one version of the package loads into the same tree in the next. ``Tree.to_dict``,
``Tree.from_dict``, ``Tree.save`` and ``Tree.load`` call these functions.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_write
from .tree import Tree, check_integer

__all__ = ["TREE_FORMAT", "load_tree", "save_tree", "tree_from_dict", "tree_to_dict"]

#: the ``format`` field of a tree description; a change of layout gets a new version number
TREE_FORMAT = "hsm.Tree/1"


def tree_to_dict(tree: Tree) -> dict[str, Any]:
    """The JSON-ready description of ``tree`` (plain lists and ints; key order is the file's)."""
    return {
        "format": TREE_FORMAT,
        "num_labels": tree.num_labels,
        "arity": tree.arity,
        "depth_limit": tree.depth_limit,
        "child_node": tree.child_node.tolist(),
        "child_label": tree.child_label.tolist(),
        "label_names": tree.label_names,
    }


def tree_from_dict(data: Mapping[str, Any]) -> Tree:
    """The tree :func:`tree_to_dict` described. Raises ValueError when ``data`` is not such a
    description (not a mapping, another ``format``, a missing key, or arrays that do not
    form a tree), naming what is wrong; TypeError for a non-integer size."""
    if not isinstance(data, Mapping):
        raise ValueError(f"an hsm tree description is a JSON object / dict, got {type(data).__name__}")
    if data.get("format") != TREE_FORMAT:
        raise ValueError(f"not an hsm tree description (format={data.get('format')!r}, expected {TREE_FORMAT!r})")
    missing = [key for key in ("num_labels", "arity", "child_node", "child_label") if key not in data]
    if missing:
        raise ValueError(f"the hsm tree description lacks {', '.join(map(repr, missing))}")
    arity = check_integer(data["arity"], "arity")
    if arity < 2:
        raise ValueError(f"arity M must be >= 2, got {arity}")
    arrays = []
    for key in ("child_node", "child_label"):
        array = _json_integers(data[key], key)
        if array.ndim not in (1, 2) or array.size % arity:
            raise ValueError(f"{key} must hold N * arity = N * {arity} integers, got shape {list(array.shape)}")
        arrays.append(array.reshape(-1, arity))
    names = data.get("label_names")
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        raise ValueError("label_names must be a list of strings (or null)")
    # the same checks as Tree() itself: nothing is coerced on the way in
    return Tree(arrays[0], arrays[1], data["num_labels"], depth_limit=data.get("depth_limit"), label_names=names)


def _json_integers(values: Any, key: str) -> np.ndarray:
    """``values`` (nested JSON lists) as an int64 array, refusing what a cast would silently change:
    a float such as 1.5 (or 1.0), a boolean, a string. TypeError / ValueError naming ``key``."""
    try:
        array = np.asarray(values, dtype=object)
    except ValueError as error:  # ragged rows
        raise ValueError(f"{key} must be a list of integers ({error})") from None
    flat = array.ravel()
    bad = next((v for v in flat if type(v) is not int), None) if flat.size else None  # noqa: E721 - bool is an int
    if bad is not None or (flat.size == 0 and array.ndim == 0):
        raise TypeError(f"{key} must hold integers, got {bad!r} ({type(bad).__name__})")
    try:
        return array.astype(np.int64)
    except OverflowError:
        raise ValueError(f"{key} holds an integer outside int64") from None


def save_tree(tree: Tree, path: str | Path) -> Path:
    """Write ``tree`` as JSON, atomically (a per-process temporary file, fsynced and renamed
    into place): a reader sees the previous file or the complete new one, and two writers of
    the same path do not collide."""
    return atomic_write(path, json.dumps(tree_to_dict(tree)))


def load_tree(path: str | Path) -> Tree:
    """The tree :func:`save_tree` wrote to ``path``. Raises FileNotFoundError for a missing file
    and ValueError naming the path when the file is not JSON (truncated, another format),
    not a JSON object, or not a tree description (:func:`tree_from_dict` says what is wrong)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not a tree file (not UTF-8 text: {error})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON, truncated or not a tree file ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: holds a JSON {type(data).__name__}, not an hsm tree description (a JSON object)")
    try:
        return tree_from_dict(data)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{path}: {error}") from None
