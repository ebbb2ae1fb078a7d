"""hsm_lab.paper: the papers' numbers as printed, and the ratios the papers state in words."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from hsm_lab import paper


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("arxiv2016.table1.ptb.random_tree.perplexity", 172),
        ("arxiv2016.table1.ptb.learned_tree.ms_per_batch", 63),
        ("arxiv2016.table1.gutenberg.flat_soft_max.ms_per_batch", 198),
        ("icml2017.table1.d50.learned_tree.arity5.p_at_1", 31.6),
        ("icml2017.table1.d200.huffman_tree.arity20.p_at_1", 36.4),
        ("icml2017.table1.d200.learned_tree.arity20.test_time", 8),
        ("icml2017.table3.d50.fasttext.arity2.recall", 4.17),
        ("icml2017.table3.d200.learned_tree.arity20.recall", 5.61),
        ("icml2017.table2.clustering_tree.perplexity", 212),
        ("icml2017.table2.learned_tree.train_ms_per_batch", 4.5),
        ("icml2017.table2.random_tree.test_ms_per_batch", 0.9),
        ("sf2020.table4.r52.flat.recall", 62.9258),
        ("sf2020.table3.r8.hierarchical.accuracy", 97.762),
        ("sf2020.table2.20ng.sota.accuracy", 88.5),
    ],
)
def test_numbers_as_printed(key: str, value: float) -> None:
    assert paper.get(key).value == pytest.approx(value)


def test_sanity_ratios_of_the_inventory() -> None:
    # ICML §7.2: "nearly three and seven times as fast at train and test time"
    assert paper.get("icml2017.speedup.train").value == pytest.approx(12.5 / 4.5)
    assert round(paper.get("icml2017.speedup.train").value, 2) == 2.78
    assert paper.get("icml2017.speedup.test").value == pytest.approx(6.9 / 0.9)
    assert round(paper.get("icml2017.speedup.test").value, 2) == 7.67
    # arXiv §7: "twice as fast" is 198/112 = 1.77
    assert paper.get("arxiv2016.speedup.gutenberg").value == pytest.approx(198 / 112)
    # ICML §7.1: "a gain of up to 3.3 precision points in the smaller 5-ary setting"
    assert paper.get("icml2017.gain.d50.arity5").value == pytest.approx(31.6 - 28.3)
    gains = {
        (d, arity): paper.get(f"icml2017.table1.d{d}.learned_tree.arity{arity}.p_at_1").value
        - paper.get(f"icml2017.table1.d{d}.huffman_tree.arity{arity}.p_at_1").value
        for d in (50, 200) for arity in (5, 20)
    }
    assert max(gains.values()) == pytest.approx(3.3)  # "up to 3.3"
    assert all(g > 0 for g in gains.values())  # "learning the structure ... always leads to more accurate models"


def test_table1_and_table3_agree_on_shared_columns() -> None:
    for number in paper.table("icml2017.table1"):
        twin = paper.get(number.key.replace("table1", "table3"))
        assert twin.value == number.value and twin.printed == number.printed


def test_printed_times_are_converted_to_minutes() -> None:
    assert paper.minutes("3h8") == 188
    assert paper.minutes("6h") == 360
    assert paper.minutes("5h32") == 332
    assert paper.minutes("45m") == 45
    tagspace = paper.get("icml2017.table1.d200.tagspace.test_time")
    assert (tagspace.value, tagspace.printed, tagspace.unit) == (900, "15h", "min")
    with pytest.raises(ValueError, match="not a time"):
        paper.minutes("3 hours")


def test_sf2020_r52_flat_accuracy_is_0_2_points_higher() -> None:
    # Schuurmans & Frasincar §6: "With a difference of 0.2 percentage points" (93.575 - 93.380)
    diff = paper.get("sf2020.table4.r52.flat.accuracy").value - paper.get("sf2020.table4.r52.hierarchical.accuracy").value
    assert round(diff, 1) == 0.2


def test_leaves_tables() -> None:
    assert all(len(words) == 7 for words in paper.ARXIV_TABLE2_LEAVES.values())
    assert all(len(words) == 10 for words in paper.ICML_TABLE4_LEAVES.values())
    assert paper.ICML_TABLE4_LEAVES["Leaf 230"].count("pa.") == 2  # printed twice


BIBLIOGRAPHY = (Path(__file__).resolve().parents[2] / "book" / "references.bib").read_text(encoding="utf-8")


def test_every_number_is_finite_and_sourced() -> None:
    assert len(paper.NUMBERS) > 100
    for key, number in paper.NUMBERS.items():
        assert key == number.key
        assert math.isfinite(number.value)
        assert number.source and f"{{{number.paper}," in BIBLIOGRAPHY  # a paper of the book's bibliography
        assert number.label()


def test_headline_claims_exist_and_are_unique() -> None:
    assert len(set(paper.HEADLINE)) == len(paper.HEADLINE)
    for key in paper.HEADLINE:
        assert paper.get(key).key == key


def test_unknown_key_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="icml2017.table2.learned_tree.perplexity"):
        paper.get("icml2017.table2.learned_tree.perplexty")
    with pytest.raises(TypeError):
        paper.get(3)  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        paper.table("nope")
