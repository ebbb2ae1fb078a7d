"""The presets of the classification experiments, as plain values: the paper's grids and output
layers (ICML §7.1 and supplement §11.1), the peers, the stand-in data sets, and what the quick
scale changes. ``-o key=value`` options override :class:`~.config.TableConfig` fields
(:func:`hsm_lab.experiments.classification.config._parse_options`)."""
from __future__ import annotations

from typing import Any

__all__ = ["LEARNED_KINDS", "OUTPUTS", "PAPER_LR_GRID", "PEERS", "QUICK", "REASSIGNS", "STAND_INS", "VW_LR_GRID"]

#: ICML §7.1 learning-rate grid.
PAPER_LR_GRID = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5)
#: Output layers: name -> (kind, arity); "flat" has no tree. The paper's rows, then a depth limit
#: (kind "learned_fixed_depth": Algorithm 3 of the ICML supplement from the complete M-ary tree of the
#: smallest depth D with M**D >= K, labels in order of frequency): M = 20 gives D = 3 on both
#: stand-ins, M = 28 gives D = 2, the depth of their 20-ary Huffman trees.
OUTPUTS: dict[str, tuple[str, int | None]] = {
    "flat": ("flat", None),
    "huffman2": ("huffman", 2),
    "huffman5": ("huffman", 5),
    "huffman20": ("huffman", 20),
    "learned5": ("learned", 5),
    "learned20": ("learned", 20),
    "huffman28": ("huffman", 28),
    "learned20-fixed-depth": ("learned_fixed_depth", 20),
    "learned28-fixed-depth": ("learned_fixed_depth", 28),
}
#: the kinds of OUTPUTS whose tree is learned (Algorithm 1)
LEARNED_KINDS = ("learned", "learned_fixed_depth")
PEERS = ("fasttext-softmax", "fasttext-hs", "vw-log_multi")
#: VW's own learning rate (-l) grid: VW's updates are normalised and adaptive, so the SGD grid does not apply.
VW_LR_GRID = (0.25, 0.5, 1.0)
#: AssignLabels calls during the first half of training (ICML §11.1).
REASSIGNS = 50
STAND_INS = ("cooking", "gutenberg-books")

#: the quick scale (CI, notebooks): a 3,000-question slice of cooking (or 40 Gutenberg books), d = 50,
#: two learning rates; the full scale is TableConfig's defaults (the whole stand-in, the paper's grid)
QUICK: dict[str, Any] = {"dims": (50,), "lr_grid": (0.1, 0.5), "vw_lr_grid": (0.5,), "train_limit": 3000,
                         "test_limit": 1000, "max_books": 40}
