"""Masked language modelling (BERT): dynamic token masking on the host, and the loss.

Masking follows Google BERT's `create_masked_lm_predictions`, vectorised over the batch:
  * candidates are the non-special tokens; per row
    num_to_predict = min(max_predictions, max(1, round(n_candidates * mask_prob)));
  * candidates are grouped into words (one token per word unless `word_starts` is given),
    words are visited in a random order, and a word is taken if it still fits in the budget,
    skipped otherwise (the greedy of the original, exactly, done in rounds: see `_greedy_fill`);
  * each selected token independently: 80% [MASK], 10% a uniform id from the whole vocab
    (which may equal the original or a special id, as in the original), 10% unchanged.
One difference from the original: it counts [CLS]/[SEP] in the sequence length when computing
num_to_predict; we count candidates only, so padding and specials never inflate the budget.

Dynamic masking (RoBERTa) is the caller's choice: call `mask_tokens` on every batch with a fresh
`np.random.Generator`; the input is never mutated.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from objectives.losses import token_cross_entropy


def _greedy_fill(lengths: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Takes items in column order while they fit, skipping (not stopping at) ones that overflow.

    lengths: [B, W] int >= 0 (0 = not an item), budget: [B] int. Returns taken: [B, W] bool.
    Each round takes the longest prefix of the remaining items that fits; the first item past it
    can no longer fit, so the next round drops it (with every other item longer than the leftover
    budget) and goes on. Every round takes >= 1 item per active row, so rounds <= max(budget);
    with one-token words it is a single round.
    """
    taken = np.zeros(lengths.shape, bool)
    alive = lengths > 0
    left = budget.astype(np.int64).copy()
    while True:
        alive &= lengths <= left[:, None]
        if not alive.any():
            return taken
        csum = np.cumsum(np.where(alive, lengths, 0), axis=1)
        take = alive & (csum <= left[:, None])  # a prefix of the alive items: csum is increasing
        taken |= take
        alive &= ~take
        left -= np.where(take, lengths, 0).sum(axis=1)


def mask_tokens(input_ids: np.ndarray,
                rng: np.random.Generator,
                *, vocab_size: int, mask_id: int,
                special_ids: Sequence[int],
                max_predictions: int,
                mask_prob: float = 0.15,
                replace_with_mask: float = 0.8, replace_with_random: float = 0.1,
                word_starts: np.ndarray | None = None,
                ) -> dict[str, np.ndarray]:
    """BERT masking of a batch.

    Args:
        input_ids: [B, L] int, already holding [CLS]/[SEP]/pad.
        rng: numpy Generator; a fresh one (or the same one, advanced) per batch = dynamic masking.
        vocab_size: random replacements are uniform in [0, vocab_size).
        mask_id: id of [MASK].
        special_ids: ids never selected ([CLS], [SEP], pad, ...).
        max_predictions: P, BERT's max_predictions_per_seq (the width of the outputs).
        mask_prob: fraction of candidate tokens to predict.
        replace_with_mask, replace_with_random: probabilities for a selected token; the rest is kept.
        word_starts: [B, L] bool, optional. Whole-word masking: a word is a start token plus the
            following non-start tokens, and is selected or not as a whole. Specials always form
            their own (never selected) word, so a word never spans a special token.

    Returns:
        {'input_ids': [B, L] corrupted copy, 'masked_lm_positions': [B, P] int32 (ascending,
         padded with 0), 'masked_lm_ids': [B, P] int32 original ids, 'masked_lm_weights': [B, P]
         float32 (1 real / 0 padding)}.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"mask_tokens: input_ids must be [batch, length], got shape {ids.shape}")
    if not 0 <= replace_with_mask + replace_with_random <= 1:
        raise ValueError("mask_tokens: replace_with_mask + replace_with_random must be in [0, 1]")
    B, L = ids.shape
    P = max_predictions
    cand = ~np.isin(ids, np.asarray(list(special_ids), dtype=ids.dtype))  # [B, L]
    n_cand = cand.sum(axis=1)
    # np.rint rounds half to even, like Python 3's round() in the original.
    budget = np.minimum(P, np.maximum(1, np.rint(n_cand * mask_prob).astype(np.int64)))
    budget = np.minimum(budget, n_cand)  # [B]; 0 for rows with no candidate

    # Words: a new word starts at every given start, at every special and right after one.
    if word_starts is None:
        starts = np.ones((B, L), bool)
    else:
        starts = np.asarray(word_starts, bool).copy()
        starts |= ~cand
        starts[:, 1:] |= ~cand[:, :-1]
    starts[:, 0] = True
    word = np.cumsum(starts, axis=1) - 1  # [B, L] word index of each token, in [0, L)
    rows = np.arange(B)[:, None]
    lengths = np.zeros((B, L), np.int64)  # [B, W=L] tokens per candidate word (0: not one)
    np.add.at(lengths, (np.broadcast_to(rows, (B, L)), word), cand)

    # Visit words in a uniformly random order: sort random keys, fill greedily in that order.
    order = np.argsort(rng.random((B, L)), axis=1)  # [B, W] word ids by visit rank
    taken_by_rank = _greedy_fill(np.take_along_axis(lengths, order, axis=1), budget)
    taken = np.zeros((B, L), bool)
    np.put_along_axis(taken, order, taken_by_rank, axis=1)
    selected = np.take_along_axis(taken, word, axis=1) & cand  # [B, L]

    # Positions ascending; unselected slots sort to the end (key L) and become padding.
    key = np.where(selected, np.arange(L), L)
    pos = np.sort(key, axis=1)[:, :P]
    if pos.shape[1] < P:
        pos = np.pad(pos, ((0, 0), (0, P - pos.shape[1])), constant_values=L)
    valid = pos < L  # [B, P]
    pos = np.where(valid, pos, 0).astype(np.int32)
    # 80/10/10 per selected token, drawn on [B, P] only.
    out, labels = replace_selected(ids, pos, valid, rng.random((B, P)), rng, vocab_size=vocab_size, mask_id=mask_id,
                                   replace_with_mask=replace_with_mask, replace_with_random=replace_with_random)
    return {"input_ids": out, "masked_lm_positions": pos, "masked_lm_ids": labels,
            "masked_lm_weights": valid.astype(np.float32)}


def replace_selected(ids: np.ndarray, pos: np.ndarray, valid: np.ndarray, u: np.ndarray, rng: np.random.Generator,
                     *, vocab_size: int, mask_id: int, replace_with_mask: float, replace_with_random: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """BERT's corruption of the selected tokens: ids [B, L], positions pos [B, P] (valid [B, P]),
    u [B, P] uniform in [0, 1): u < replace_with_mask -> [MASK], then replace_with_random -> a random
    id, else unchanged. Returns (corrupted copy of ids [B, L] int32, original ids at pos [B, P], 0 on
    invalid slots). SpanBERT passes one u per span, repeated over its tokens."""
    labels = np.where(valid, np.take_along_axis(ids, pos, axis=1), 0).astype(np.int32)
    random_ids = rng.integers(0, vocab_size, pos.shape)
    new = np.where(u < replace_with_mask, mask_id,
                   np.where(u < replace_with_mask + replace_with_random, random_ids, labels))
    out = np.array(ids, dtype=np.int32)  # a copy: the caller's batch is never mutated
    r, c = np.nonzero(valid)
    out[r, pos[r, c]] = new[r, c]
    return out, labels


def mlm_loss(logits: jax.Array, target_ids: jax.Array, weights: jax.Array,
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted mean cross-entropy over predicted tokens (objectives.losses.token_cross_entropy).

    logits: [B, P, V] (any float dtype; the loss is computed in float32), target_ids: [B, P] int,
    weights: [B, P] float (0 on padding). Returns (loss, {'mlm_loss', 'mlm_accuracy'}); both are
    sum(w * x) / max(sum(w), 1), so an all-padding batch gives 0 rather than NaN.
    """
    metrics = token_cross_entropy(logits, target_ids, weights)
    loss = metrics["cross_entropy"]
    return loss, {"mlm_loss": loss, "mlm_accuracy": metrics["accuracy"]}
