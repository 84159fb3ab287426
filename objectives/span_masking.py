"""Span masking on the host: SpanBERT's spans (Joshi et al., 2020) and ALBERT's n-grams (Lan et al., 2020). The
objectives that use it are in objectives/bert_pretraining.py (SpanBertPretraining; BertPretraining's
masking="ngrams").

Masking (paper Section 3.1; J&M 11.2.2). Per row, spans of whole words are drawn until the budget
of masked tokens is spent:
  * budget = min(max_predictions, max(1, round(n_candidates * mask_prob))) tokens, as in
    `objectives.mlm` (candidates are the non-special tokens);
  * a span's length in words is l ~ Geometric(p) clipped to [1, max_span_length] (the paper's
    p = 0.2, 10: the pmf renormalised over 1..10, mean 3.78 words);
  * its first word is uniform over the places where l words fit: inside one segment (a span never
    covers [CLS]/[SEP]/padding), on unmasked words, with one unmasked token left on each side, so
    that every span has a real, visible left and right boundary token for the SBO (the paper's
    code instead merges spans that touch; keeping a gap gives the same one-boundary-per-run effect
    and keeps the drawn lengths exact), and with a first word that fits the remaining budget.
    Where no place fits l words, l shrinks to the longest free run;
  * a span that would overflow the budget keeps only its first whole words that fit (so a row's
    last span may be shorter than drawn); a row stops when its budget is spent or no free word
    fits what is left of it, which is then less than one word's tokens: spans never start or end
    inside a word;
  * each span is corrupted as a unit: 80% all [MASK], 10% all random ids (uniform over the
    vocabulary, one per token, as in `objectives.mlm`), 10% unchanged.
Rows are processed in rounds, one span per unfinished row per round, vectorised over the batch.

The same placement with another length distribution is ALBERT's n-gram masking (Lan et al. 2020, Section 4.1;
`ngram_length_pmf`, chosen by BertPretraining's `masking="ngrams"`): n-grams of up to 3 whole words with
P(n) proportional to 1/n, and the 80/10/10 draw made for each token of an n-gram, as ALBERT's
create_pretraining_data.py does (`draw_per_token`). Where that code differs otherwise: it visits the start
words in a random order and shortens n to fit the budget (here the start is uniform over the places that fit);
and its n-grams may touch each other or straddle a [SEP] (here one unmasked word stays between two n-grams and
an n-gram stays inside its segment, so a masked run is exactly one n-gram).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from objectives import mlm

SPAN_KEYS = ("span_left_boundary", "span_right_boundary", "span_position")


def span_length_pmf(geometric_p: float, max_span_length: int) -> np.ndarray:
    """[max_span_length] P(l = 1..max): Geometric(p) truncated at the maximum and renormalised."""
    lengths = np.arange(1, max_span_length + 1)
    pmf = geometric_p * (1 - geometric_p) ** (lengths - 1)
    return pmf / pmf.sum()


def ngram_length_pmf(ngram_max: int) -> np.ndarray:
    """[ngram_max] P(n = 1..ngram_max) proportional to 1/n: ALBERT's n-gram lengths in whole words (its
    create_pretraining_data.py's pvals with favor_shorter_ngram), 6/11, 3/11, 2/11 for its maximum of 3."""
    pmf = 1.0 / np.arange(1, ngram_max + 1)
    return pmf / pmf.sum()


def _words(ids: np.ndarray, candidate: np.ndarray, real: np.ndarray, word_starts: np.ndarray | None):
    """Groups tokens into words, row by row.

    Returns word [B, L] (word index of each token), length [B, W=L] (tokens per word, 0 for specials
    and unused indices), first [B, W] (first token of each word) and placeable [B, W] (a candidate
    word with a real token on each side, so it can be a span's first or last word).
    """
    B, L = ids.shape
    starts = np.ones((B, L), bool) if word_starts is None else np.asarray(word_starts, bool).copy()
    starts |= ~candidate             # a special is its own word ...
    starts[:, 1:] |= ~candidate[:, :-1]  # ... and ends the word before it
    starts[:, 0] = True
    word = np.cumsum(starts, axis=1) - 1
    flat = (np.arange(B)[:, None] * L + word).ravel()
    length = np.bincount(flat, weights=candidate.ravel(), minlength=B * L).reshape(B, L).astype(np.int64)
    first = np.full((B, L), L - 1)
    r, t = np.nonzero(starts)
    first[r, word[r, t]] = t
    last = first + np.maximum(length, 1) - 1
    rows = np.arange(B)[:, None]
    has_left = (first > 0) & real[rows, np.maximum(first - 1, 0)]
    has_right = (last < L - 1) & real[rows, np.minimum(last + 1, L - 1)]
    return word, length, first, (length > 0) & has_left & has_right


def _room(free: np.ndarray, masked: np.ndarray) -> np.ndarray:
    """[n, W] the most words a span may take starting at each word (0: it cannot start there).

    free: words a span may cover (placeable, not masked); masked: words already in a span. A span
    needs an unmasked word on both sides (its boundaries stay visible), so a run of free words that
    ends at a masked word gives up its last word.
    """
    n, W = free.shape
    col = np.arange(W)
    stop = np.minimum.accumulate(np.where(free, W, col)[:, ::-1], axis=1)[:, ::-1]  # first non-free >= w
    run = stop - col
    after_masked = np.take_along_axis(np.pad(masked, ((0, 0), (0, 1))), stop, axis=1)
    before_masked = np.pad(masked, ((0, 0), (1, 0)))[:, :W]
    return np.where(free & ~before_masked, run - after_masked, 0)


def _place_spans(ids: np.ndarray, candidate: np.ndarray, real: np.ndarray, word_starts: np.ndarray | None,
                 remaining: np.ndarray, rng: np.random.Generator, span_lengths: np.ndarray):
    """Spans of whole words placed until each row's budget (`remaining` [B] tokens) is spent or nothing fits.
    -> [B, L] each: the span's left and right boundary tokens, the 1-based position in the span (0: not masked),
    the span's one 80/10/10 draw."""
    B, L = ids.shape
    word, length, first, placeable = _words(ids, candidate, real, word_starts)
    ends = np.cumsum(length, axis=1)           # [B, W] tokens up to and including word w
    J = np.arange(1, len(span_lengths) + 1)    # span lengths in words

    masked_word = np.zeros((B, L), bool)       # [B, W]
    # Per token: its span's boundaries, its 1-based position in the span, its span's 80/10/10 draw.
    left = np.zeros((B, L), np.int64)
    right = np.zeros((B, L), np.int64)
    position = np.zeros((B, L), np.int64)
    treatment = np.zeros((B, L))
    active = remaining > 0
    while active.any():
        rows = np.nonzero(active)[0]           # [n]
        n, at = len(rows), np.arange(len(rows))
        room = _room(placeable[rows] & ~masked_word[rows], masked_word[rows])  # [n, W]
        room[length[rows] > remaining[rows, None]] = 0  # a span's first word must fit the budget
        drawn = rng.choice(J, size=n, p=span_lengths)
        span_words = np.minimum(drawn, room.max(axis=1))  # 0 where nothing fits any more
        keys = np.where(room >= np.maximum(span_words, 1)[:, None], rng.random((n, L)), -1.0)
        start = np.argmax(keys, axis=1)        # uniform over the places that fit
        # Whole words within the budget: tokens of the first j words, j = 1..max.
        before = np.where(start > 0, ends[rows, np.maximum(start - 1, 0)], 0)
        upto = ends[rows[:, None], np.minimum(start[:, None] + J - 1, L - 1)] - before[:, None]  # [n, J]
        fits = (J <= span_words[:, None]) & (upto <= remaining[rows, None])
        taken = fits.sum(axis=1)               # words kept (a prefix: upto grows with j)
        placed = taken > 0
        n_tokens = np.where(placed, upto[at, np.maximum(taken - 1, 0)], 0)

        span_first = first[rows, start]        # [n] first token of the span
        token_word = word[rows]                # [n, L]
        inside = placed[:, None] & (token_word >= start[:, None]) & (token_word < (start + taken)[:, None])
        col = np.arange(L)
        masked_word[rows] |= placed[:, None] & (col >= start[:, None]) & (col < (start + taken)[:, None])
        for out, value in ((left, span_first - 1), (right, span_first + n_tokens),
                           (treatment, rng.random(n))):
            out[rows] = np.where(inside, value[:, None], out[rows])
        position[rows] = np.where(inside, col - span_first[:, None] + 1, position[rows])
        remaining[rows] -= n_tokens
        active[rows] = placed & (remaining[rows] > 0)  # placed: some word still fitted the budget
    return left, right, position, treatment


def mask_spans(input_ids: np.ndarray,
               rng: np.random.Generator,
               *, vocab_size: int, mask_id: int,
               special_ids: Sequence[int],
               max_predictions: int,
               word_starts: np.ndarray | None = None,
               input_mask: np.ndarray | None = None,
               mask_prob: float = 0.15,
               span_lengths: np.ndarray | None = None,
               replace_with_mask: float = 0.8, replace_with_random: float = 0.1,
               draw_per_token: bool = False,
               ) -> dict[str, np.ndarray]:
    """Span masking of a batch (see the module docstring): SpanBERT's, or ALBERT's n-grams.

    Args:
        input_ids: [B, L] int, already holding [CLS]/[SEP]/pad.
        rng: numpy Generator; a fresh one per batch = dynamic masking.
        vocab_size, mask_id, special_ids, max_predictions, mask_prob, replace_with_*: as
            `objectives.mlm.mask_tokens`, except that the 80/10/10 draw is made once per span.
        word_starts: [B, L] bool, True where a token begins a word (None: every token is a word).
        input_mask: [B, L], 1 = real token (None: all real). Boundaries are always real tokens.
        span_lengths: [n] P(a span is 1..n words); None: SpanBERT's span_length_pmf(0.2, 10)
            (ALBERT: ngram_length_pmf(3)).
        draw_per_token: the 80/10/10 draw made for each token (ALBERT's code) rather than once per span
            (SpanBERT's).

    Returns:
        `mlm.mask_tokens`' keys ('input_ids', 'masked_lm_positions', 'masked_lm_ids',
        'masked_lm_weights') and, per prediction slot, [B, P] int32: 'span_left_boundary' (the
        token before the slot's span), 'span_right_boundary' (the token after it), 'span_position'
        (1-based position of the token in its span); all 0 on padding slots.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"mask_spans: input_ids must be [batch, length], got shape {ids.shape}")
    if not 0 <= replace_with_mask + replace_with_random <= 1:
        raise ValueError("mask_spans: replace_with_mask + replace_with_random must be in [0, 1]")
    span_lengths = span_length_pmf(0.2, 10) if span_lengths is None else np.asarray(span_lengths, np.float64)
    if span_lengths.ndim != 1 or not np.isclose(span_lengths.sum(), 1.0) or (span_lengths < 0).any():
        raise ValueError(f"mask_spans: span_lengths must be probabilities of lengths 1..n summing to 1, "
                         f"got {span_lengths}")
    B, L = ids.shape
    P = max_predictions
    candidate = ~np.isin(ids, np.asarray(list(special_ids), dtype=ids.dtype))  # [B, L]
    real = np.ones((B, L), bool) if input_mask is None else np.asarray(input_mask).astype(bool)
    n_candidates = candidate.sum(axis=1)
    budget = np.minimum(P, np.maximum(1, np.rint(n_candidates * mask_prob).astype(np.int64)))
    remaining = np.minimum(budget, n_candidates)  # [B] tokens still to mask

    left, right, position, treatment = _place_spans(ids, candidate, real, word_starts, remaining, rng, span_lengths)
    selected = position > 0                    # [B, L]

    # Positions ascending; unselected slots sort to the end (key L) and become padding.
    key = np.where(selected, np.arange(L), L)
    pos = np.sort(key, axis=1)[:, :P]
    if pos.shape[1] < P:
        pos = np.pad(pos, ((0, 0), (0, P - pos.shape[1])), constant_values=L)
    valid = pos < L                            # [B, P]
    pos = np.where(valid, pos, 0)

    def at_slots(x: np.ndarray) -> np.ndarray:  # [B, L] -> [B, P], 0 on padding slots
        return np.where(valid, np.take_along_axis(x, pos, axis=1), 0)

    draws = rng.random(pos.shape) if draw_per_token else np.take_along_axis(treatment, pos, axis=1)  # [B, P]
    out, labels = mlm.replace_selected(
        ids, pos, valid, draws, rng, vocab_size=vocab_size, mask_id=mask_id,
        replace_with_mask=replace_with_mask, replace_with_random=replace_with_random)
    return {"input_ids": out, "masked_lm_positions": pos.astype(np.int32),
            "masked_lm_ids": labels.astype(np.int32), "masked_lm_weights": valid.astype(np.float32),
            "span_left_boundary": at_slots(left).astype(np.int32),
            "span_right_boundary": at_slots(right).astype(np.int32),
            "span_position": at_slots(position).astype(np.int32)}

