"""The language-model corpora of the experiments: PTB or our Gutenberg corpus, optionally reduced
(fewer books or tokens, a capped vocabulary) for the quick scale and the learning-rate trials."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hsm_lab.data.gutenberg import CHUNK_TOKENS
from hsm_lab.data.lm import UNK, LMCorpus

__all__ = ["cap_vocabulary", "load_lm_corpus"]


def cap_vocabulary(corpus: LMCorpus, vocab_size: int) -> LMCorpus:
    """Keep the ``vocab_size`` most frequent ids (``<unk>`` among them); map the rest to ``<unk>``.

    Ids of :class:`LMCorpus` are sorted by decreasing training count, so the kept words are the
    first ids; ``<unk>`` is kept (and, if it was not among them, it replaces the least frequent
    kept word). Counts of dropped words are added to ``<unk>``'s.
    """
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
    if vocab_size >= corpus.vocab_size:
        return corpus
    unk = corpus.index(UNK)
    if unk < 0:
        raise ValueError(f"{corpus.name} has no {UNK} token to map dropped words to")
    keep = list(range(vocab_size))
    if unk not in keep:
        keep[-1] = unk
    keep_arr = np.array(sorted(keep))
    new_unk = int(np.searchsorted(keep_arr, unk))
    mapping = np.full(corpus.vocab_size, new_unk, dtype=np.int64)
    mapping[keep_arr] = np.arange(len(keep_arr))
    mapping_t = torch.from_numpy(mapping)
    counts = np.bincount(mapping, weights=corpus.counts, minlength=len(keep_arr)).astype(np.int64)
    stats = dict(corpus.stats, vocab_cap=vocab_size, original_vocab=corpus.vocab_size)
    return LMCorpus(
        name=f"{corpus.name}-V{vocab_size}", vocab=[corpus.vocab[i] for i in keep_arr],
        train=mapping_t[corpus.train], valid=mapping_t[corpus.valid], test=mapping_t[corpus.test],
        counts=counts, context=corpus.context, stats=stats,
    )


def _slice(corpus: LMCorpus, train_tokens: int | None, eval_tokens: int | None) -> LMCorpus:
    """The first tokens of each split (None: all)."""
    cut = lambda t, n: t if n is None else t[:n]  # noqa: E731
    train = cut(corpus.train, train_tokens)
    counts = (corpus.counts if train_tokens is None else
              np.bincount(train.numpy(), minlength=corpus.vocab_size).astype(np.int64))
    return LMCorpus(name=corpus.name, vocab=corpus.vocab, train=train, valid=cut(corpus.valid, eval_tokens),
                    test=cut(corpus.test, eval_tokens), counts=counts, context=corpus.context,
                    stats=dict(corpus.stats, train_tokens_used=int(train.numel())))


def load_lm_corpus(dataset: str, *, max_books: int | None = None, vocab_size: int | None = None,
                   train_tokens: int | None = None, eval_tokens: int | None = None,
                   **gutenberg_split: Any) -> LMCorpus:
    """PTB or our Gutenberg corpus, optionally reduced (fewer books/tokens, capped vocabulary).

    The vocabulary cap is applied before slicing, from the counts of the whole training split
    (PTB) or of the selected books (Gutenberg: the cap is the loader's own ``vocab_size``).
    ``gutenberg_split`` (``split``, ``split_seed``, ``chunk_tokens``, ``min_count``) goes to
    :func:`hsm_lab.data.load_gutenberg`; PTB refuses any that differ from the defaults.
    """
    defaults = {"split": "books", "split_seed": None, "chunk_tokens": CHUNK_TOKENS, "min_count": 1}
    unknown = sorted(set(gutenberg_split) - set(defaults))
    if unknown:
        raise TypeError(f"load_lm_corpus got unknown options {unknown}; known: {sorted(defaults)}")
    if dataset == "ptb":
        from hsm_lab.data import load_ptb

        changed = {k: v for k, v in gutenberg_split.items() if v != defaults[k]}
        if changed:
            raise ValueError(f"options {changed}: only the gutenberg dataset has a book split to vary")
        corpus = load_ptb()
        if vocab_size is not None:
            corpus = cap_vocabulary(corpus, vocab_size)
    elif dataset == "gutenberg":
        from hsm_lab.data import load_gutenberg
        from hsm_lab.data.gutenberg import load_prebuilt_lm, prebuilt_directory

        prebuilt = prebuilt_directory()
        if prebuilt is not None:  # a machine without the archive: the exported corpus, checked to be the same
            corpus = load_prebuilt_lm(prebuilt, max_books=max_books, vocab_size=vocab_size or 250_000,
                                      **gutenberg_split)
        else:
            corpus = load_gutenberg(max_books=max_books, vocab_size=vocab_size or 250_000, progress=False,
                                    **gutenberg_split)
    else:
        raise ValueError(f"dataset must be 'ptb' or 'gutenberg', got {dataset!r}")
    if train_tokens is not None or eval_tokens is not None:
        corpus = _slice(corpus, train_tokens, eval_tokens)
    return corpus
