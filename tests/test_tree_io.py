"""hsm.tree_io: the hsm.Tree/1 file format. Files written before the constructors and the format
moved out of hsm/tree.py (tests/data/trees, written by ``Tree.save`` of that code) must load into
the same trees, and saving those trees again must give the same bytes."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hsm.tree import Tree
from hsm.tree_io import TREE_FORMAT, load_tree, save_tree, tree_from_dict, tree_to_dict

DATA = Path(__file__).parent / "data" / "trees"
COUNTS = np.array([50, 3, 7, 0, 12, 1, 9, 30, 2, 5, 5])
CLUSTERS = [0, 0, 1, 2, 2, 2, 1, 3]

# the constructor calls that wrote each committed file
SAVED = {
    "random_k11_m3": lambda: Tree.random(11, 3, seed=4),
    "random_k9_m2_d5": lambda: Tree.random(9, 2, 5, seed=1, label_names=[f"l{i}" for i in range(9)]),
    "balanced_k7_m2": lambda: Tree.balanced([6, 0, 5, 1, 4, 2, 3], 2),
    "complete_k5_m3_d2": lambda: Tree.complete([8, 0, 4, 2, 6], 3, 2),
    "huffman_k11_m2": lambda: Tree.huffman(COUNTS, 2, label_names=[f"w{i}" for i in range(11)]),
    "huffman_k11_m3": lambda: Tree.huffman(COUNTS, 3),
    "huffman_k11_m4": lambda: Tree.huffman(COUNTS, 4),
    "nested": lambda: Tree.from_nested([[0, 1, 2], [3, [4, 5]], 6]),
    "taxonomy": lambda: Tree.from_taxonomy(
        {"fruit": ["apple", "pear"], "veg": ["kale"], "nut": ["pecan", "almond", "cashew"]},
        ["apple", "pear", "kale", "pecan", "almond", "cashew"]),
    "clusters": lambda: Tree.from_clusters(CLUSTERS, 3, 3),
    "clusters_order": lambda: Tree.from_clusters(CLUSTERS, 3, 3, cluster_order=[2, 0, 3, 1]),
    "clusters_group": lambda: Tree.from_clusters(CLUSTERS, 3, 3, cluster_group=[1, 0, 1, 2]),
}


def test_every_committed_file_has_its_constructor() -> None:
    assert sorted(p.stem for p in DATA.glob("*.json")) == sorted(SAVED)


@pytest.mark.parametrize("name", sorted(SAVED))
def test_old_files_load_into_the_same_tree(name: str) -> None:
    loaded = Tree.load(DATA / f"{name}.json")
    built = SAVED[name]()
    assert loaded == built
    assert loaded.label_names == built.label_names
    assert loaded.same_partition(built)
    np.testing.assert_array_equal(loaded.slot_mask, built.slot_mask)


@pytest.mark.parametrize("name", sorted(SAVED))
def test_saving_again_gives_the_same_bytes(name: str, tmp_path: Path) -> None:
    written = SAVED[name]().save(tmp_path / "tree.json")
    assert written.read_bytes() == (DATA / f"{name}.json").read_bytes()


def test_functions_and_methods_agree(tmp_path: Path) -> None:
    tree = Tree.huffman(COUNTS, 3)
    assert tree_to_dict(tree) == tree.to_dict()
    assert tree_to_dict(tree)["format"] == TREE_FORMAT
    assert tree_from_dict(json.loads(json.dumps(tree.to_dict()))) == tree
    save_tree(tree, tmp_path / "a.json")
    tree.save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert load_tree(tmp_path / "a.json") == Tree.load(tmp_path / "b.json") == tree


def test_a_file_of_another_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({**Tree.random(5, 2).to_dict(), "format": "hsm.Tree/0"}))
    with pytest.raises(ValueError, match="other.json.*expected 'hsm.Tree/1'"):
        load_tree(path)
