"""Barber & Botev: softmax regression trained with approximations of the likelihood.

Two registered experiments redraw the paper's figures:

* ``sampling-fig2``: their Fig. 2. Synthetic softmax regression drawn from the model (N = 2000,
  D = 100, C = 1000), minibatch 50, K = 20 negatives, gradient ascent with momentum 0.99, one
  shared initialisation (zeros) and one shared minibatch sequence. Methods: the exact gradient;
  the normalisation approximations with importance sampling and with Bernoulli sampling
  (explicit minibatch classes plus sampled negatives, Eq. 22-26); ranking with alpha = 1 and
  alpha = log(C - 1) (Eq. 35, 42); BlackOut (Eq. 46-47); NCE with z = 1 (Eq. 30-31); negative
  sampling (Eq. 43-45). Recorded per evaluation point: the exact mean log-likelihood on the
  training set (panel a), the log mean absolute difference of the predicted class probabilities
  against the exact-gradient run (panel b; the caption says "parameters", the text says
  predictions: parameters are not identifiable under ``w_c^T x + a(x)``, so we compare
  predictions, and record the parameter difference as well), and against the true model.
* ``sampling-fig1``: their Fig. 1, the ranking objective for a sweep of alpha, with the exact
  gradient beside it.

And one beyond the paper:

* ``lm-ptb-sampling``: "tree or sampling?" -- the log-bilinear language model of ``lm-ptb`` (the
  main paper's PTB experiment) with its output layer trained by each approximation
  (:class:`hsm.sampling.SampledSoftmax` through :func:`hsm_lab.experiments.lm.train_lm`), evaluated
  exactly, so that its perplexity and speed sit beside the flat softmax and the trees of
  ``results/lm/ptb.json`` (:func:`run_lm_ptb_sampling`).

Learning rates (Figs. 1-2). The paper (Fig. 2 caption) sets the exact and normalisation
approximations to one rate and ranking/BlackOut to "the largest values that ensured
convergence", without numbers. We use ``lr_exact = 1e-4`` (on the summed minibatch loss; with
momentum 0.99 the exact run reaches a training log-likelihood near 0 within about 1000
iterations, since N = 2000 points in D = 100 with C = 1000 classes are separable) for the exact
and normalisation methods, and pick, for every other method, the largest rate of a grid (seed 0,
a short run) whose exact log-likelihood stays finite, ends above its start and never drops more
than 1 nat below it; the rates are in the result file.

The package, one module per job: :mod:`.presets` (the methods, the settings of each scale, the
learning rates quick mode reuses: plain values), :mod:`.config` (the settings of one run, with
its ``-o key=value`` options checked), :mod:`.training` (Figs. 1-2: the problem, each method's
minibatch loss, one run, the rate search), :mod:`.lm_training` (``lm-ptb-sampling``'s runs, rate
selection and step benchmark), :mod:`.report` (result records, :func:`lm_rows` for the
sampled-softmax chapter) and :mod:`.commands` (the registered experiments). Every name is
re-exported here (``from hsm_lab.experiments import sampling as E; E.run_fig2``).
"""
from __future__ import annotations

# the library names the submodules call, re-exported as the single module had them
from hsm import sampling as S
from hsm_lab.config import seed_everything
from hsm_lab.experiments import check_device, check_scale
from hsm_lab.results import check_replace, make_record, output_path, provenance, write_results

from hsm_lab.experiments.sampling import commands, config, lm_training, presets, report, training
from hsm_lab.experiments.sampling.commands import run_fig1, run_fig2, run_lm_ptb_sampling
from hsm_lab.experiments.sampling.config import _lm_settings, _settings
from hsm_lab.experiments.sampling.lm_training import (_SparseSampledOutputs, _tree_arity)
from hsm_lab.experiments.sampling.presets import DEFAULT_OUT, DEFAULT_RATES, FIG_SETTINGS, LM_METHOD_NAMES, LM_METHODS, LM_SETTINGS, METHODS
from hsm_lab.experiments.sampling.report import (lm_rows)
from hsm_lab.experiments.sampling.training import (SoftmaxRegressionProblem, make_problem, train_softmax_regression)

__all__ = ["SoftmaxRegressionProblem", "make_problem", "train_softmax_regression", "METHODS", "run_fig2", "run_fig1",
           "LM_METHODS", "run_lm_ptb_sampling", "lm_rows"]