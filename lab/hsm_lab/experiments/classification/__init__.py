"""ICML Tables 1 and 3: extreme classification with a bag-of-words model and tree softmaxes.

The paper (ICML §7.1 and Tables 1 and 3, supplement §11.1) predicts YFCC100M tags (312K labels,
91M captions) from the caption's bag of words, with the fastText recipe: embeddings of dimension
``d in {50, 200}``, SGD with a linearly decreasing learning rate over 5 epochs, the rate picked
from {0.01, 0.02, 0.05, 0.1, 0.25, 0.5}; output layers

* ``flat``: the flat softmax (not in the paper's table; the accuracy ceiling of the rest);
* ``huffman2``: the binary Huffman tree (fastText's ``-loss hs``, the paper's "FastText" row);
* ``huffman5``, ``huffman20``: M-ary Huffman trees;
* ``learned5``, ``learned20``: the tree learned by Algorithm 1 with AssignLabels = Algorithm 2
  (well-formed trees), started from the M-ary Huffman tree as the authors' released fastText fork
  does (the recipe table of the classification chapter, ``notebooks/classification.md``); the
  learning rate stays constant during the first half of training, in which AssignLabels runs 50
  times in total; then the tree is frozen and the rate decays linearly to 0.

Prediction is the exact top-1 of the branch-and-bound search (:meth:`hsm.HierarchicalSoftmax.topk`).
We report precision at 1 (P@1: the share of test examples whose top label is one of their
labels), recall at 1 (R@1: correct top labels over all gold labels of the test set, the
micro-average that fastText's ``test`` prints, which the paper's supplement Table 3 is presumably
computed with: the paper never defines it), train and test wall-clock time, and the mean number
of internal nodes the search evaluates against the tree's expected depth.

YFCC100M cannot be had here, so the commands run on two stand-ins (say so wherever they are shown):
``cooking`` (cooking.stackexchange, 736 tags, fastText's tutorial split) and ``gutenberg-books``
(100-token passage -> book, 678 classes, authors as a taxonomy). Anyone holding the YFCC100M
files in fastText format runs the real table with ``-o data=/path/to/train.txt -o
test=/path/to/test.txt`` (read by :func:`hsm_lab.data.load_fasttext_file`, labels seen fewer than 100
times dropped as ICML §7.1 does).

Multi-label examples (cooking, YFCC) are trained on **one label sampled uniformly per example and
per epoch**, as fastText does for its softmax and hs losses. Peers run on the same splits, in the
same process, timed the same way: fastText itself (``fasttext-wheel``, losses softmax and hs) and
Vowpal Wabbit ``--log_multi`` (the logarithmic-time online multiclass tree of Choromanska &
Langford 2015, the binary ancestor of the method); each is skipped, with a note in the result
file, when its package is missing.

The package, one module per job: :mod:`.presets` (the paper's grids, the output layers, the
peers, the quick scale: plain values), :mod:`.config` (one table's configuration and its
options), :mod:`.data` (the stand-ins or a fastText file, encoded), :mod:`.training` (the output
layers and the two trainers), :mod:`.evaluation` (P@1, R@1, test time, nodes visited),
:mod:`.peers` (fastText and Vowpal Wabbit), :mod:`.trees` (author grouping, tree files),
:mod:`.table` (every row of a table, resumable), :mod:`.report` (result records and markdown
tables), :mod:`.commands` (the registered experiments) and :mod:`.today` (today's label-tree
libraries and fastText with bigrams, experiment ``today-tools``). Every name is re-exported here
(``from hsm_lab.experiments import classification as C; C.train_bow``).
"""
from __future__ import annotations

from hsm_lab.experiments.classification import commands, config, data, evaluation, peers, presets, report, table, today, training, trees
from hsm_lab.experiments.classification.commands import _default_out, icml_table1, icml_table3
from hsm_lab.experiments.classification.config import TableConfig, _parse_options
from hsm_lab.experiments.classification.data import (EncodedSplit, _subset_rows, encode_data,
                   load_classification_data, load_table_data)
from hsm_lab.experiments.classification.evaluation import _precision_recall, evaluate_bow
from hsm_lab.experiments.classification.peers import peer_available, run_fasttext, run_vw
from hsm_lab.experiments.classification.presets import OUTPUTS, PAPER_LR_GRID, PEERS, QUICK, REASSIGNS, STAND_INS, VW_LR_GRID
from hsm_lab.experiments.classification.report import (DEPTH_LIMIT_OUTPUTS, _ROW_ORDER, _seconds,
                     depth_limit_markdown, depth_limit_runs, fast_runs,
                     paper_table_markdown, table_markdown)
from hsm_lab.experiments.classification.table import _run_ours, run_table, tree_prefix_of
from hsm_lab.experiments.classification.today import TODAY_METHODS, TodayConfig, precision_at_k, run_today, today_tools
from hsm_lab.experiments.classification.training import TrainedBow, build_output_layer, train_bow
from hsm_lab.experiments.classification.trees import author_grouping

__all__ = [
    "OUTPUTS",
    "PAPER_LR_GRID",
    "TODAY_METHODS",
    "TodayConfig",
    "EncodedSplit",
    "author_grouping",
    "encode_data",
    "evaluate_bow",
    "icml_table1",
    "icml_table3",
    "load_classification_data",
    "load_table_data",
    "precision_at_k",
    "run_table",
    "run_today",
    "today_tools",
    "train_bow",
    "tree_prefix_of",
]
