"""The 50-dimensional word vectors the clustering tree (:func:`hsm.clustering.clustering_tree`) is
built from: fastText's, as ICML §7.2 builds them, or our log-bilinear LM's (no optional extra)."""
from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from hsm_lab import config as hsm_config
from hsm.atomic import atomic_write
from hsm_lab.data.lm import LMCorpus
from hsm_lab.experiments import check_device
from hsm.layers import HierarchicalSoftmax
from hsm.optim import RowSparseAdagrad
from hsm.models import LogBilinearLM
from hsm.tree import Tree

from hsm_lab.experiments.lm.config import LMRunConfig

__all__ = ["fasttext_embeddings", "learn_embeddings"]


def learn_embeddings(corpus: LMCorpus, cfg: LMRunConfig, dim: int = 50, epochs: int = 1,
                     device: str | torch.device = "cpu") -> np.ndarray:
    """Word embeddings of dimension ``dim`` for the clustering tree: the input embeddings ``U``
    of a log-bilinear LM trained with a random-tree HSM (our stand-in for the paper's fastText
    run, which used a hierarchical-softmax loss too)."""
    device = torch.device(check_device(device))
    hsm_config.seed_everything(cfg.seed + 1000)
    model = LogBilinearLM(corpus.vocab_size, dim, cfg.context, sparse=True).to(device)
    output = HierarchicalSoftmax(dim, Tree.random(corpus.vocab_size, cfg.arity, cfg.depth, seed=cfg.tree_seed + 1000),
                                 sparse=True).to(device)
    optimizer = RowSparseAdagrad(list(model.parameters()) + list(output.parameters()), lr=cfg.lr)
    x_train, y_train = (t.to(device) for t in corpus.windows("train", cfg.context))
    generator = torch.Generator().manual_seed(cfg.seed + 1000)
    steps = math.ceil(len(y_train) / cfg.batch_size)
    if cfg.max_steps_per_epoch is not None:
        steps = min(steps, cfg.max_steps_per_epoch)
    for _ in range(epochs):
        order = torch.randperm(len(y_train), generator=generator).to(device)
        for step in range(steps):
            index = order[step * cfg.batch_size:(step + 1) * cfg.batch_size]
            optimizer.zero_grad(set_to_none=True)
            output(model(x_train[index]), y_train[index]).loss.backward()
            optimizer.step()
    return model.embedding.weight.detach().cpu().numpy()


def fasttext_embeddings(corpus: LMCorpus, dim: int = 50, epochs: int = 5, loss: str = "hs",
                        threads: int | None = None, char_ngrams: tuple[int, int] | None = None) -> np.ndarray:
    """Word vectors of dimension ``dim`` from fastText (``fasttext-wheel``) trained on the
    training split, one row per vocabulary word: the clustering tree's embeddings as ICML §7.2
    builds them ("FastTree", 5 epochs, hierarchical-softmax loss).

    The paper does not say which fastText model; we use skip-gram (fastText's unsupervised
    default) on whole words (no character n-grams: the tree clusters words, and the n-grams
    would triple the cost), every word kept (``minCount=1``, the vocabulary is already capped).
    ``char_ngrams=(minn, maxn)`` adds fastText's character n-grams of ``minn`` to ``maxn``
    characters (its default is (3, 6)): a word's vector is then the sum of its own and its
    n-grams' vectors, so words that share spelling move closer.
    The vectors are cached under ``hsm_lab.config.cache_dir()`` like any derived data. fastText
    (``fasttext-wheel`` 0.9.2 takes no seed) with several threads is not deterministic.
    Raises ImportError with the install command when fastText is missing."""
    try:
        import fasttext
    except ImportError as exc:
        raise ImportError("the paper's clustering tree needs fastText: pip install 'fasttext-wheel>=0.9.2' "
                          "(or the hsm[baselines] extra); the option clustering_embeddings=lbl uses our own "
                          "log-bilinear embeddings instead") from exc
    if loss not in ("hs", "ns", "softmax"):
        raise ValueError(f"loss must be 'hs', 'ns' or 'softmax', got {loss!r}")
    if char_ngrams is not None and not (1 <= char_ngrams[0] <= char_ngrams[1]):
        raise ValueError(f"char_ngrams must be (minn, maxn) with 1 <= minn <= maxn, got {char_ngrams!r}")
    minn, maxn = char_ngrams or (0, 0)
    threads = threads or torch.get_num_threads()
    folder = hsm_config.cache_dir() / "derived" / "fasttext"
    stem = f"{corpus.name}-{corpus.train.numel()}-V{corpus.vocab_size}-d{dim}-e{epochs}-{loss}"
    if char_ngrams is not None:
        stem += f"-n{minn}-{maxn}"
    vectors_path = folder / f"{stem}.npy"
    if vectors_path.exists():
        try:
            vectors = np.load(vectors_path)
            if vectors.shape == (corpus.vocab_size, dim) and np.isfinite(vectors).all():
                return vectors
        except (OSError, ValueError):
            pass
        warnings.warn(f"{vectors_path}: unreadable or wrong shape, training the vectors again", stacklevel=2)
    words = np.asarray(corpus.vocab, dtype=object)
    bad = [w for w in corpus.vocab if not w or any(ch.isspace() for ch in w)]
    if bad:
        raise ValueError(f"{len(bad)} vocabulary words are empty or contain white space (e.g. {bad[0]!r}): "
                         "fastText splits on white space")
    text_path = folder / f"{corpus.name}-{corpus.train.numel()}-V{corpus.vocab_size}-train.txt"
    if not text_path.exists():
        # lines of 1,000 tokens (fastText reads at most 1,024 words a line)
        ids = corpus.train.numpy()

        def write(handle) -> None:
            for start in range(0, len(ids), 1000):
                handle.write((" ".join(words[ids[start:start + 1000]]) + "\n").encode())

        atomic_write(text_path, write)
    model = fasttext.train_unsupervised(str(text_path), model="skipgram", dim=dim, epoch=epochs, loss=loss,
                                        minCount=1, minn=minn, maxn=maxn, thread=threads, verbose=0)
    vectors = np.stack([model.get_word_vector(w) for w in corpus.vocab]).astype(np.float32)
    atomic_write(vectors_path, lambda handle: np.save(handle, vectors))
    return vectors
