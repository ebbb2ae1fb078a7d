"""The papers' reported numbers, as plain data.

Every number here is copied from the papers this project reproduces and carries the table it
comes from. They are the *papers'* numbers: nothing in this module is
measured. Experiments compare against them through :func:`get`; the landing page of the book
gives a verdict per claim from them (see :mod:`hsm_lab.report`), and its appendix lists every
measured one beside ours.

Sources (the key prefix, the paper, and its key in the book's bibliography, ``PaperNumber.paper``):

* ``arxiv2016``: Jernite, Choromanska, Sontag & LeCun, arXiv:1610.04658, Table 1
  (``jernite2016simultaneous``).
* ``icml2017``: Jernite, Choromanska & Sontag, ICML 2017 with supplement, Tables 1-4, and the
  speed-ups claimed in §7.2 (``jernite2017simultaneous``).
* ``sf2020``: Schuurmans & Frasincar, SAC 2020, Tables 1-4 (``schuurmans2020global``).

Keys are dotted paths, e.g. ``icml2017.table2.learned_tree.perplexity``; :data:`NUMBERS` maps
every key to its :class:`PaperNumber`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

__all__ = [
    "PaperNumber",
    "NUMBERS",
    "HEADLINE",
    "ICML_TABLE4_LEAVES",
    "ARXIV_TABLE2_LEAVES",
    "get",
    "table",
    "minutes",
]


@dataclass(frozen=True)
class PaperNumber:
    """One number printed in a paper.

    Attributes:
        key: stable identifier (dotted path) used by result records to say which number they
            reproduce.
        value: the number, in ``unit`` (times printed as ``3h8`` are converted to minutes).
        metric: what is measured (``"perplexity"``, ``"P@1"``, ``"train time"`` ...).
        unit: ``""`` for unitless, ``"%"``, ``"ms/batch"``, ``"min"``, ``"x"`` (a ratio).
        source: where it is printed, e.g. ``"ICML 2017, Table 2"``.
        paper: the paper's key in the book's bibliography (``book/references.bib``), e.g.
            ``"jernite2017simultaneous"``.
        setting: what distinguishes the row (data set, model, arity, dimension ...).
        printed: the number exactly as printed, when that differs from ``value``'s repr.
        higher_is_better: direction of the metric, None for a setting-free quantity.
        description: the claim in plain words (set for derived numbers and headline claims).
    """

    key: str
    value: float
    metric: str
    unit: str
    source: str
    paper: str
    setting: Mapping[str, object] = field(default_factory=dict)
    printed: str = ""
    higher_is_better: bool | None = None
    description: str = ""

    def label(self) -> str:
        """A one-line human-readable label: setting and metric."""
        if self.description:
            return self.description
        setting = dict(self.setting)
        head = ", ".join(str(setting.pop(k)) for k in ("dataset", "model") if setting.get(k) is not None)
        details = []
        for name, value in setting.items():
            if value is None:
                continue
            details.append({"arity": f"{value}-ary", "depth": f"depth {value}"}.get(name, f"{name}={value}"))
        if details:
            head = f"{head} ({', '.join(details)})"
        return f"{head}: {self.metric}" if head else self.metric


_TIME_RE = re.compile(r"^(?:(?P<h>\d+)h(?P<hm>\d+)?|(?P<m>\d+)m)$")


def minutes(printed: str) -> float:
    """Convert a wall-clock time as printed in ICML Table 1 / 3 (``"3h8"``, ``"6h"``, ``"18m"``)
    to minutes. ``"3h8"`` is read as 3 h 8 min (the tables mix ``h`` and ``m`` cells).
    """
    match = _TIME_RE.match(printed.strip())
    if not match:
        raise ValueError(f"not a time as printed in the ICML tables: {printed!r}")
    if match["m"] is not None:
        return float(match["m"])
    return 60.0 * int(match["h"]) + float(match["hm"] or 0)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9@]+", "_", text.lower()).strip("_").replace("@", "_at_")


_numbers: dict[str, PaperNumber] = {}

# the papers' keys in book/references.bib
_ARXIV, _ICML, _SF = "jernite2016simultaneous", "jernite2017simultaneous", "schuurmans2020global"


def _add(number: PaperNumber) -> PaperNumber:
    if number.key in _numbers:
        raise RuntimeError(f"duplicate paper number key {number.key}")  # a typo in this file
    _numbers[number.key] = number
    return number


# --- arXiv Table 1: flat vs depth-3 HSM; 25-ary PTB, 75-ary Gutenberg; GTX TITAN -----
_ARXIV_T1 = "arXiv 2016, Table 1"
for _model, _ptb_perp, _ptb_ms, _gut_perp, _gut_ms in (
    ("Random Tree", 172, 61, 160, 111),
    ("Learned Tree", 159, 63, 148, 112),
    ("Flat soft-max", 151, 105, 149, 198),
):
    for _dataset, _arity, _perp, _ms in (("PTB", 25, _ptb_perp, _ptb_ms), ("Gutenberg", 75, _gut_perp, _gut_ms)):
        _tree = _model != "Flat soft-max"
        _setting = {"dataset": _dataset, "model": _model, "arity": _arity if _tree else None, "depth": 3 if _tree else None}
        _base = f"arxiv2016.table1.{_dataset.lower()}.{_slug(_model)}"
        _add(PaperNumber(f"{_base}.perplexity", float(_perp), "perplexity", "", _ARXIV_T1, _ARXIV, _setting, higher_is_better=False))
        _add(PaperNumber(f"{_base}.ms_per_batch", float(_ms), "time", "ms/batch", _ARXIV_T1, _ARXIV, _setting, higher_is_better=False))

#: arXiv Table 2: words in four deepest internal nodes ("leaves") of the PTB tree (7 rows).
ARXIV_TABLE2_LEAVES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "Leaf 229": ("suggested", "watched", "created", "violated", "introduced", "discovered", "carried"),
    "Leaf 230": ("vegas", "&", "calif.", "park", "n.j.", "conn.", "pa."),
    "Leaf 300": ("payments", "buy-outs", "swings", "gains", "taxes", "operations", "profits"),
    "Leaf 231": ("operates", "includes", "intends", "makes", "means", "helps", "seeks"),
})

# --- ICML Table 1 and supplement Table 3: YFCC100M tag prediction, 312K labels ---------
# (d, model, arity, P@1, recall (Table 3), train, test); recall is None where printed "-".
_YFCC_ROWS = (
    (50, "TagSpace", None, 30.1, None, "3h8", "6h"),
    (50, "FastText", 2, 27.2, 4.17, "8m", "1m"),
    (50, "Huffman Tree", 5, 28.3, 4.33, "8m", "1m"),
    (50, "Huffman Tree", 20, 29.9, 4.58, "10m", "3m"),
    (50, "Learned Tree", 5, 31.6, 4.85, "18m", "1m"),
    (50, "Learned Tree", 20, 32.1, 4.92, "30m", "3m"),
    (200, "TagSpace", None, 35.6, None, "5h32", "15h"),
    (200, "FastText", 2, 35.2, 5.4, "12m", "1m"),
    (200, "Huffman Tree", 5, 35.8, 5.5, "13m", "2m"),
    (200, "Huffman Tree", 20, 36.4, 5.59, "18m", "3m"),
    (200, "Learned Tree", 5, 36.1, 5.53, "35m", "3m"),
    (200, "Learned Tree", 20, 36.6, 5.61, "45m", "8m"),
)
for _table, _source in (("table1", "ICML 2017, Table 1"), ("table3", "ICML 2017, supplement Table 3")):
    for _d, _model, _arity, _p1, _rec, _train, _test in _YFCC_ROWS:
        _setting = {"dataset": "YFCC100M", "d": _d, "model": _model, "arity": _arity}
        _base = f"icml2017.{_table}.d{_d}.{_slug(_model)}" + (f".arity{_arity}" if _arity else "")
        _add(PaperNumber(f"{_base}.p_at_1", _p1, "P@1", "%", _source, _ICML, _setting, higher_is_better=True))
        if _table == "table3" and _rec is not None:
            _add(PaperNumber(f"{_base}.recall", _rec, "recall", "%", _source, _ICML, _setting, higher_is_better=True))
        _add(PaperNumber(f"{_base}.train_time", minutes(_train), "train time", "min", _source, _ICML, _setting, _train, False))
        _add(PaperNumber(f"{_base}.test_time", minutes(_test), "test time", "min", _source, _ICML, _setting, _test, False))

# --- ICML Table 2: Gutenberg LM, 65-ary depth-3 trees, GTX TITAN ---------------------------------
_ICML_T2 = "ICML 2017, Table 2"
for _model, _perp, _train_ms, _test_ms in (
    ("Clustering Tree", 212, 2.0, 1.0),
    ("Random Tree", 160, 1.9, 0.9),
    ("Flat soft-max", 149, 12.5, 6.9),
    ("Learned Tree", 148, 4.5, 0.9),
):
    _tree = _model != "Flat soft-max"
    _setting = {"dataset": "Gutenberg", "model": _model, "arity": 65 if _tree else None, "depth": 3 if _tree else None}
    _base = f"icml2017.table2.{_slug(_model)}"
    _add(PaperNumber(f"{_base}.perplexity", float(_perp), "perplexity", "", _ICML_T2, _ICML, _setting, higher_is_better=False))
    _add(PaperNumber(f"{_base}.train_ms_per_batch", _train_ms, "train time", "ms/batch", _ICML_T2, _ICML, _setting, higher_is_better=False))
    _add(PaperNumber(f"{_base}.test_ms_per_batch", _test_ms, "test time", "ms/batch", _ICML_T2, _ICML, _setting, higher_is_better=False))

#: ICML supplement Table 4 (= thesis Table 3.2): labels reaching four nodes of the final tree
#: (10 rows printed, then an ellipsis). "pa." is printed twice in Leaf 230.
ICML_TABLE4_LEAVES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "Leaf 229": ARXIV_TABLE2_LEAVES["Leaf 229"] + ("described", "accepted", "listed"),
    "Leaf 230": ARXIV_TABLE2_LEAVES["Leaf 230"] + ("pa.", "ii", "d."),
    "Leaf 300": ARXIV_TABLE2_LEAVES["Leaf 300"] + ("penalties", "relations", "liabilities"),
    "Leaf 231": ARXIV_TABLE2_LEAVES["Leaf 231"] + ("reduces", "continues", "fails"),
})

# --- Derived claims: the speed-ups and the precision gain as the papers state them in words ------
_n = _numbers  # shorthand for the ratios below
_add(PaperNumber(
    "icml2017.speedup.train", _n["icml2017.table2.flat_soft_max.train_ms_per_batch"].value
    / _n["icml2017.table2.learned_tree.train_ms_per_batch"].value,
    "train speed-up over flat", "x", "ICML 2017, §7.2 and Table 2", _ICML,
    {"dataset": "Gutenberg", "arity": 65, "depth": 3}, "nearly three times (12.5/4.5)", True,
    "Learned tree trains faster than the flat softmax (Gutenberg)"))
_add(PaperNumber(
    "icml2017.speedup.test", _n["icml2017.table2.flat_soft_max.test_ms_per_batch"].value
    / _n["icml2017.table2.learned_tree.test_ms_per_batch"].value,
    "test speed-up over flat", "x", "ICML 2017, §7.2 and Table 2", _ICML,
    {"dataset": "Gutenberg", "arity": 65, "depth": 3}, "seven times (6.9/0.9)", True,
    "Learned tree evaluates faster than the flat softmax (Gutenberg)"))
_add(PaperNumber(
    "arxiv2016.speedup.gutenberg", _n["arxiv2016.table1.gutenberg.flat_soft_max.ms_per_batch"].value
    / _n["arxiv2016.table1.gutenberg.learned_tree.ms_per_batch"].value,
    "speed-up over flat", "x", "arXiv 2016, §7 and Table 1", _ARXIV,
    {"dataset": "Gutenberg", "arity": 75, "depth": 3}, "twice as fast (198/112)", True,
    "Learned tree is faster than the flat softmax (Gutenberg, arXiv)"))
_add(PaperNumber(
    "icml2017.gain.d50.arity5", round(_n["icml2017.table1.d50.learned_tree.arity5.p_at_1"].value
                                      - _n["icml2017.table1.d50.huffman_tree.arity5.p_at_1"].value, 1),
    "P@1 gain of learned over Huffman tree", "points", "ICML 2017, §7.1 and Table 1", _ICML,
    {"dataset": "YFCC100M", "d": 50, "arity": 5}, "up to 3.3 precision points (31.6 - 28.3)", True,
    "Learning the tree beats the Huffman tree (YFCC100M, 5-ary, d=50)"))
del _n

# --- Schuurmans & Frasincar Tables 1-4: BiLSTM, flat vs two-level HSM (macro %) --------
_SF_TABLES = {
    # dataset: (table number, h_dim, {measure: (flat, hierarchical)})
    "TREC": (1, 150, {"F1": (72.595, 74.258), "Precision": (74.937, 75.882), "Recall": (73.370, 74.952), "Accuracy": (84.800, 86.000)}),
    "20NG": (2, 150, {"F1": (81.048, 82.479), "Precision": (81.586, 82.979), "Recall": (80.905, 82.465), "Accuracy": (81.382, 82.924)}),
    "R8": (3, 150, {"F1": (89.264, 92.939), "Precision": (90.696, 93.065), "Recall": (88.380, 93.056), "Accuracy": (96.711, 97.762)}),
    # Recall (flat) is printed with four decimals, 62.9258, in the paper.
    "R52": (4, 100, {"F1": (63.637, 64.407), "Precision": (70.325, 68.361), "Recall": (62.9258, 64.124), "Accuracy": (93.575, 93.380)}),
}
_SF_SOTA = {"TREC": 97.2, "20NG": 88.5, "R8": 97.8, "R52": 95.00}
for _dataset, (_tab, _hdim, _measures) in _SF_TABLES.items():
    _source = f"Schuurmans & Frasincar 2020, Table {_tab}"
    for _measure, (_flat, _hier) in _measures.items():
        for _model, _value in (("flat", _flat), ("hierarchical", _hier)):
            _setting = {"dataset": _dataset, "model": f"BiLSTM + {_model} softmax", "h_dim": _hdim}
            # macro-averaged except accuracy, which the paper reports as micro-accuracy
            _metric = "accuracy" if _measure == "Accuracy" else f"macro-{_measure.lower()}"
            _add(PaperNumber(f"sf2020.table{_tab}.{_dataset.lower()}.{_model}.{_slug(_measure)}", _value,
                             _metric, "%", _source, _SF, _setting, higher_is_better=True))
    _add(PaperNumber(f"sf2020.table{_tab}.{_dataset.lower()}.sota.accuracy", _SF_SOTA[_dataset], "accuracy", "%",
                     _source, _SF, {"dataset": _dataset, "model": "state of the art cited by the paper"},
                     higher_is_better=True))

#: Every paper number by key (read-only).
NUMBERS: Mapping[str, PaperNumber] = MappingProxyType(dict(_numbers))
del _numbers

#: The headline results of the papers, in order.
HEADLINE: tuple[str, ...] = (
    "icml2017.table2.learned_tree.perplexity",
    "icml2017.table2.random_tree.perplexity",
    "icml2017.table2.flat_soft_max.perplexity",
    "icml2017.table2.clustering_tree.perplexity",
    "icml2017.speedup.train",
    "icml2017.speedup.test",
    "icml2017.table1.d50.learned_tree.arity5.p_at_1",
    "icml2017.table1.d50.huffman_tree.arity5.p_at_1",
    "icml2017.gain.d50.arity5",
    "icml2017.table1.d50.fasttext.arity2.p_at_1",
    "arxiv2016.table1.ptb.learned_tree.perplexity",
    "arxiv2016.table1.ptb.random_tree.perplexity",
    "arxiv2016.table1.ptb.flat_soft_max.perplexity",
    "sf2020.table1.trec.hierarchical.f1",
    "sf2020.table1.trec.flat.f1",
    "sf2020.table2.20ng.hierarchical.f1",
    "sf2020.table2.20ng.flat.f1",
    "sf2020.table3.r8.hierarchical.f1",
    "sf2020.table3.r8.flat.f1",
    "sf2020.table4.r52.hierarchical.f1",
    "sf2020.table4.r52.flat.f1",
)


def get(key: str) -> PaperNumber:
    """The paper number with this key; a KeyError lists close keys when there is no such number."""
    if not isinstance(key, str):
        raise TypeError(f"paper number keys are strings, got {type(key).__name__}")
    try:
        return NUMBERS[key]
    except KeyError:
        prefix = key.rsplit(".", 1)[0]
        close = [k for k in NUMBERS if k.startswith(prefix)][:8]
        hint = f"; keys starting {prefix!r}: {close}" if close else ""
        raise KeyError(f"no paper number {key!r}{hint}") from None


def table(prefix: str) -> list[PaperNumber]:
    """All paper numbers whose key starts with ``prefix`` (e.g. ``"icml2017.table2"``), in the
    order they are printed."""
    rows = [n for k, n in NUMBERS.items() if k == prefix or k.startswith(prefix.rstrip(".") + ".")]
    if not rows:
        raise KeyError(f"no paper numbers under {prefix!r}")
    return rows


# The headline list must only name numbers that exist (checked at import, so a typo here fails
# at once instead of naming no number).
for _key in HEADLINE:
    get(_key)
del _key
