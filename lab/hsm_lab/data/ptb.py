"""Penn TreeBank, Mikolov's language-modelling split (arXiv Table 1 and Figure 3).

The files are already tokenized, lower-cased, with numbers as ``N`` and rare words as ``<unk>`` (10,000 types
including ``<unk>``). We read each line as a sentence, split on whitespace and append ``<eos>``, the usual
convention (Mikolov et al. 2010; Zaremba et al. 2014): 929,589 / 73,760 / 82,430 tokens and a vocabulary of
10,000 words counting ``<eos>`` (``<unk>`` is one of the file's 9,999 word types).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import torch

from hsm_lab.data.errors import EmptyCorpusError
from hsm_lab.data.fetch import fetch_file, read_text
from hsm_lab.data.lm import EOS, UNK, LMCorpus, frequency_order
from hsm_lab.data.registry import SOURCES

SPLITS = ("train", "valid", "test")


def read_sentences(path: Path) -> list[list[str]]:
    """Whitespace tokens of each non-empty line of a PTB file."""
    sentences = [line.split() for line in read_text(path).split("\n")]
    sentences = [sentence for sentence in sentences if sentence]
    if not sentences:
        raise EmptyCorpusError(f"{path} holds no tokens. Fix: delete it and run `python -m hsm data fetch ptb`.")
    return sentences


def _encode(sentences: list[list[str]], index: dict[str, int], unk_id: int) -> tuple[torch.Tensor, int]:
    ids: list[int] = []
    oov = 0
    for sentence in sentences:
        for word in sentence:
            word_id = index.get(word)
            if word_id is None:
                oov += 1
                word_id = unk_id
            ids.append(word_id)
        ids.append(index[EOS])
    return torch.tensor(ids, dtype=torch.int64), oov


def load_ptb(context: int | None = None) -> LMCorpus:
    """Load PTB (Mikolov split) as an :class:`~hsm_lab.data.lm.LMCorpus`, fetching and verifying the files.

    The vocabulary is the training file's types plus ``<eos>``, ids sorted by decreasing training count.
    ``context`` sets the default window size ``T`` of :meth:`LMCorpus.windows` (arXiv: 3 on PTB).
    Words of valid/test missing from the training vocabulary would map to ``<unk>``; in Mikolov's split there
    are none (``stats['oov_valid']``, ``stats['oov_test']`` report 0).
    """
    source = SOURCES["ptb"]
    sentences = {split: read_sentences(fetch_file(source.file(f"ptb/ptb.{split}.txt"))) for split in SPLITS}
    counter: Counter[str] = Counter()
    for sentence in sentences["train"]:
        counter.update(sentence)
    counter[EOS] = len(sentences["train"])
    vocab = frequency_order(counter)
    index = {word: i for i, word in enumerate(vocab)}
    unk_id = index[UNK]
    streams = {}
    stats: dict[str, object] = {"train_lines": len(sentences["train"])}
    for split in SPLITS:
        streams[split], oov = _encode(sentences[split], index, unk_id)
        stats[f"oov_{split}"] = oov
    counts = np.array([counter[word] for word in vocab], dtype=np.int64)
    return LMCorpus(name="ptb", vocab=vocab, counts=counts, context=context, stats=stats, **streams)
