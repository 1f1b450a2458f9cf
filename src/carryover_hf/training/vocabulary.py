"""Reduced draft vocabularies built from the response tokens of a training set (EAGLE-3 / speculators style).

The drafter's LM head then runs over `draft_vocab_size` rows instead of the whole vocabulary, at training and at
inference. Tokens outside it are never proposed; generation stays lossless (they get probability 0 in the candidate
distributions), but a draft that needs one is a rejected draft, so the choice is judged by how much of *held-out*
response text it covers.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .data import token_rows


def response_token_counts(rows: Iterable, vocab_size: int) -> np.ndarray:
    """How often each token id occurs as a response token (`loss_mask == 1`), `(vocab_size,)` int64."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for row in token_rows(rows):
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        mask = np.asarray(row["loss_mask"], dtype=bool)
        counts += np.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def draft_vocabulary(counts: np.ndarray, size: int) -> np.ndarray:
    """The `size` ids ranked by (response count, descending; id, ascending), sorted.

    When `size` exceeds the number of ids seen, this is every seen id plus the lowest unseen ids: for BPE vocabularies
    the low ids are the bytes and most frequent merges, which cover text the training set never showed.
    """
    if not 1 <= size <= counts.shape[0]:
        raise ValueError(f"draft_vocab_size must be in [1, {counts.shape[0]}], got {size}.")
    order = np.lexsort((np.arange(counts.shape[0]), -counts))  # primary: count desc, then id asc
    return np.sort(order[:size])


def coverage(counts: np.ndarray, token_ids: np.ndarray) -> float:
    """Share of the response tokens counted in `counts` that lie in `token_ids`."""
    total = counts.sum()
    return float(counts[token_ids].sum() / total) if total else float("nan")


def build_draft_vocabulary(train_rows, held_out_rows, vocab_size: int, size: int) -> tuple[np.ndarray, dict]:
    """A draft vocabulary of `size` ids from `train_rows`, and a record of its coverage of `held_out_rows`."""
    train_counts = response_token_counts(train_rows, vocab_size)
    ids = draft_vocabulary(train_counts, size)
    held_counts = response_token_counts(held_out_rows, vocab_size)
    record = {
        "draft_vocab_size": int(size),
        "construction": "ids ranked by response-token count in the training rows, ties and unseen ids by lowest id",
        "distinct_training_response_ids": int((train_counts > 0).sum()),
        "training_response_tokens": int(train_counts.sum()),
        "coverage_training": round(coverage(train_counts, ids), 5),
        "held_out_response_tokens": int(held_counts.sum()),
        "coverage_held_out": round(coverage(held_counts, ids), 5),
    }
    return ids, record


__all__ = ["build_draft_vocabulary", "coverage", "draft_vocabulary", "response_token_counts"]
