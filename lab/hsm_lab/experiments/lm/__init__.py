"""Language modelling (arXiv §7 Table 1 and Fig. 3; ICML §7.2 Table 2 and Fig. 2).

The log-bilinear LM (:class:`hsm.models.LogBilinearLM`, ``r_x = sum_k R_k U_{w_{t-k}}``) with four
output layers behind one interface:

* ``flat``: the flat softmax over the vocabulary;
* ``random``: a hierarchical softmax on a random depth-``D`` M-ary tree (best of several seeds,
  picked on validation; the arXiv paper takes the best of 5);
* ``clustering``: ICML §7.2's clustering tree: 50-dimensional word embeddings, MiniBatchKMeans into
  ``M**2`` centroids, words filled greedily into the nearest non-full centroid (M words each).
  The paper does not say how the ``M**2`` clusters are grouped under the root; we run a second
  k-means over the centroids into M groups of M clusters (same greedy fill). The embeddings are
  fastText's, as the paper's (5 epochs, hierarchical-softmax loss; the optional ``hsm[baselines]``
  extra); ``-o clustering_embeddings=lbl`` learns them with our own log-bilinear model (d = 50,
  random-tree HSM) on the same training data instead, as the quick scale does, and
  ``-o clustering_embeddings=fasttext-ngrams`` adds fastText's character n-grams (3-6 characters);
* ``learned``: Algorithm 1 (:class:`hsm.TreeLearner`) with Algorithm 3 (depth constraint) and the
  log-likelihood ranking of eq. 12, starting from a random tree, re-assigning 20 times per epoch
  (arXiv) or 50 times (ICML) while the tree is learned, then fine-tuning with the tree fixed.

Choices where the papers are silent (written into every result file's config):

* initial tree of the learned model: a random tree (seed 0 of the random-tree seeds);
* batch size: 128 (the largest of ICML's grid {32, 64, 128}; the fastest on our CPU); the learning
  rate is selected from a grid on validation perplexity after a short run (``select_steps``
  steps), separately for the flat softmax and for the trees (the random tree's choice is used for
  all trees, so the trees differ only in structure);
* the arXiv paper's L2 of 5e-5 on PTB is **not** applied by default: torch's Adagrad refuses
  weight decay with sparse gradients, and sparse gradients are what makes the tree cheap.
  ``-o l2=5e-5`` (``LMRunConfig.l2``) adds it ourselves, lazily: only on the embedding and node
  rows a batch touches (:func:`_add_l2`);
* examples are shuffled every epoch; perplexity is ``exp`` of the mean NLL per token over the
  whole split, every token a target (``<eos>``-padded windows);
* ms/batch: wall time per optimiser step (forward, backward, Adagrad, and for the learned tree the
  statistics and the amortised re-assignments), and per test batch (forward: ``log p(target)``),
  measured in the same run on the same machine, after ``warmup`` steps.

``lm-ptb-ablation`` varies one setting of the learned tree at a time (rebuild rate, statistics
decay and prior, ranking, learning rate, L2, schedule) on the full PTB, and retrains the final
learned tree from scratch, to see why the learned tree gains less over the random tree than in
the paper. ``lm-gutenberg-offset`` trains one random tree for one epoch on another draw of the
Gutenberg book split, on a split inside books or with a min-count vocabulary, and reads the test
perplexity of every held-out book from the kept model (:mod:`.offset`), to see where the offset of
our Gutenberg perplexities from the paper's comes from.

Long runs are resumable: each (experiment, run) checkpoints after every epoch under
``hsm_lab.config.runs_dir()`` (``HSM_RUNS``, else ``lm-runs/`` in the cache) and stores its finished record, so re-running the experiment
command continues where it stopped. Those files are written atomically under unique temporary
names (two runs of the same command do not collide; a full disk leaves the previous file); a
finished-run or checkpoint file that cannot be read is ignored with a warning naming it, and
the run is recomputed (from the checkpoint when only the finished-run file is bad).

Result files go to ``out``, or without it under :func:`hsm_lab.results.output_root`
(``hsm-results/lm/...``), never over the committed ``results/`` unless ``out`` names them; a
full-scale file is not replaced by a quick run unless ``force=True``.

The package, one module per job: :mod:`.presets` (what each experiment trains on, plain values),
:mod:`.config` (one run's configuration and its key), :mod:`.data` (the corpora),
:mod:`.training` (one resumable run, the learning-rate search), :mod:`.embeddings` (the
clustering tree's word vectors; the tree itself is :func:`hsm.clustering.clustering_tree`),
:mod:`.tables` (every run of a table or of the ablation), :mod:`.offset` (the split and vocabulary runs and
their per-book perplexities), :mod:`.mnih_hinton` (the thesis' simple Mnih-Hinton baseline),
:mod:`.node_accuracy` (the node decisions' accuracy and nats at each depth), :mod:`.new_words`
(words added to a trained model's tree without retraining, against retraining),
:mod:`.report` (result records, tables and plots for the notebooks) and :mod:`.commands` (the registered experiments and their
options). Every name is re-exported here (``from hsm_lab.experiments import lm; lm.train_lm``).
"""
from __future__ import annotations

from hsm.clustering import kmeans_fill, clustering_tree, greedy_fill
from hsm_lab.data.lm import UNK, LMCorpus
from hsm.tree import Tree

from hsm_lab.experiments.lm import (commands, config, data, decoding, embeddings, lemma31, mnih_hinton, new_words,
               node_accuracy, offset, presets, report, tables, training)
from hsm_lab.experiments.lm.commands import (_parse_options, _scale_for,
                       run_lm_gutenberg_65, run_lm_gutenberg_75, run_lm_ptb, run_lm_ptb_ablation, run_lm_ptb_schedules)
from hsm_lab.experiments.lm.config import OUTPUT_KINDS, RANKING_SCORE, SAMPLED_KINDS, LMRunConfig, LMRunResult
from hsm_lab.experiments.lm.data import _slice, cap_vocabulary, load_lm_corpus
from hsm_lab.experiments.lm.embeddings import fasttext_embeddings, learn_embeddings
from hsm_lab.experiments.lm.presets import (ABLATION_VARIANTS, ABLATION_WHAT, DEFAULT_OUT, RESULTS_DIR, RUN_FOLDER, SCALES, LMScale)
from hsm_lab.experiments.lm.report import (ablation_markdown, ablation_rows, best_epoch_markdown, combine_parts, leaf_table,
                     leaf_table_markdown, load_tree_file, plot_ablation, plot_learning_evidence, plot_per_epoch,
                     plt_colours, read_runs, RunRecord, runs_of, table_markdown)
from hsm_lab.experiments.lm.decoding import decoder_agreement, run_lm_gutenberg_decoding
from hsm_lab.experiments.lm.lemma31 import mean_objective_by_depth, run_lm_ptb_lemma31
from hsm_lab.experiments.lm.new_words import lm_new_words
from hsm_lab.experiments.lm.mnih_hinton import run_lm_gutenberg_mnih_hinton, train_mnih_hinton, word_vectors
from hsm_lab.experiments.lm.node_accuracy import (node_accuracy_markdown, node_accuracy_rows, node_decisions_by_depth,
                            run_lm_gutenberg_node_accuracy)
from hsm_lab.experiments.lm.offset import book_genres, per_book_perplexity, run_lm_gutenberg_offset, token_nll
from hsm_lab.experiments.lm.tables import run_ablation, run_table
from hsm_lab.experiments.lm.training import (RunFiles, _add_l2, _make_output, _select_lr, _sync, train_lm)

__all__ = [
    "LMRunConfig",
    "cap_vocabulary",
    "clustering_tree",
    "greedy_fill",
    "load_lm_corpus",
    "train_lm",
    "run_lm_ptb",
    "run_lm_ptb_schedules",
    "run_lm_gutenberg_65",
    "run_lm_gutenberg_75",
    "run_lm_ptb_ablation",
    "run_lm_gutenberg_offset",
    "run_ablation",
    "ABLATION_VARIANTS",
    "OUTPUT_KINDS",
    "SAMPLED_KINDS",
]
