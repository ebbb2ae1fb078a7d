"""A tiny language-model corpus for the lab's tests."""
from __future__ import annotations

import numpy as np
import torch

from hsm_lab.data.lm import LMCorpus


def toy_corpus(vocab: int = 40, tokens: int = 3000, seed: int = 0, eval_tokens: int = 400) -> LMCorpus:
    """Tokens from a tiny bigram model: word w is followed by (w * 7 + noise) % V, so the context
    tells the next word; ``tokens`` for training, ``eval_tokens`` each for validation and test."""
    rng = np.random.default_rng(seed)
    stream = np.empty(tokens + 2 * eval_tokens, dtype=np.int64)
    stream[0] = 0
    for t in range(1, len(stream)):
        stream[t] = (stream[t - 1] * 7 + rng.integers(0, 3)) % vocab
    words = ["<eos>", "<unk>"] + [f"w{i}" for i in range(vocab - 2)]
    return LMCorpus(name="toy", vocab=words, train=torch.from_numpy(stream[:tokens]),
                    valid=torch.from_numpy(stream[tokens:tokens + eval_tokens]),
                    test=torch.from_numpy(stream[tokens + eval_tokens:]),
                    counts=np.bincount(stream[:tokens], minlength=vocab).astype(np.int64))
