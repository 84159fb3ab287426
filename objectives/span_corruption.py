"""T5 denoising primitives, vectorised over a batch of token rows (numpy, host side).

Semantics are those of the T5 library's `t5/data/preprocessors.py` (Raffel et al. 2020, JMLR 21,
Section 3.1.4 and 3.3), used by its `span_corruption`, `iid_denoising` and `prefix_lm` tasks:
  * `random_spans_noise_mask`: num_noise_tokens = round(length * noise_density) clipped to
    [1, length - 1]; num_noise_spans = max(1, round(num_noise_tokens / mean_noise_span_length));
    noise and non-noise span lengths are uniformly random compositions (`_random_segmentation`);
    spans alternate, starting with non-noise, so the last span is always noise.
  * `compute_input_and_target_lengths` = `random_spans_helper`: the raw length (568 for 512
    inputs) whose corrupted inputs are exactly `inputs_length` tokens, and the targets length (114).
  * `noise_span_to_unique_sentinel`: each run of noise tokens becomes one sentinel, the k-th run
    sentinel k (`tokenizer.sentinel_id(k)` = vocab_size - 1 - k); called with the complement mask
    it is `nonnoise_span_to_unique_sentinel`, T5's targets.
A row is [B, W] ids with `lengths` [B]: tokens at and after a row's length are padding.

Deliberate differences, all where the T5 code would fail or silently misbehave (its lengths
helper and its mask disagree, so some raw lengths give one input token too many):
  * the mask rounds in float64 as the length helper does (T5 rounds length * density in float32
    there: 390 * 0.15 is 58.5000023 in float32);
  * the helper clips the counts as the mask does (at least 1 noise token and 1 span);
  * num_noise_spans is also capped at the number of non-noise tokens (T5 raises a shape error
    for such densities, e.g. 0.9 on 10 tokens);
  * a row needing more sentinels than the tokenizer has reuses the last one (T5 runs on into
    ordinary vocabulary ids). Span corruption at the lengths of the paper needs < 100 of them.
"""
from __future__ import annotations

import numpy as np


# ---------------------------------------------------------------------------------------------
# Noise masks.
# ---------------------------------------------------------------------------------------------
def random_spans_noise_mask(lengths, noise_density: float = 0.15, mean_noise_span_length: float = 3.0,
                            rng: np.random.Generator | None = None, width: int | None = None) -> np.ndarray:
    """T5's `random_spans_noise_mask` for every row of a batch.

    lengths: an int -> returns [lengths] bool; or [B] ints -> returns [B, W] bool with
    W = width or max(lengths), False at and after each row's length.
    """
    scalar = np.ndim(lengths) == 0
    n = np.atleast_1d(np.asarray(lengths, np.int64))
    W = int(n.max(initial=0)) if width is None else width
    rng = np.random.default_rng() if rng is None else rng
    B = len(n)
    if noise_density == 0.0 or W == 0:
        mask = np.zeros((B, W), bool)
        return mask[0] if scalar else mask
    # T5 computes with length >= 2 ("avoid degeneracy") and truncates the mask afterwards, so a
    # 1-token row has no noise; rows of length 0 (padding) have none either.
    m = np.maximum(n, 2)
    num_noise, num_spans = noise_counts(m, noise_density, mean_noise_span_length)
    num_nonnoise = m - num_noise
    S = int(num_spans.max())
    noise_lengths = _random_segmentation(num_noise, num_spans, S, rng)  # [B, S]
    nonnoise_lengths = _random_segmentation(num_nonnoise, num_spans, S, rng)  # [B, S]
    # Interleave (non-noise, noise, non-noise, ...); spans past a row's count have length 0.
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=2).reshape(B, 2 * S)
    span_starts = np.cumsum(interleaved, axis=1)[:, :-1]  # [B, 2S-1], real ones strictly increasing
    M = int(m.max())
    start_indicator = np.zeros((B, M + 1), np.int64)  # column M collects the empty spans' starts
    start_indicator[np.arange(B)[:, None], np.minimum(span_starts, M)] = 1
    is_noise = np.cumsum(start_indicator[:, :M], axis=1) % 2 == 1
    is_noise &= np.arange(M) < n[:, None]  # T5's mask[:orig_length]; also clears padding
    mask = np.zeros((B, W), bool)
    k = min(M, W)
    mask[:, :k] = is_noise[:, :k]
    return mask[0] if scalar else mask


def noise_counts(lengths: np.ndarray, noise_density: float, mean_noise_span_length: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(num_noise_tokens, num_noise_spans) [B] of `random_spans_noise_mask` for lengths >= 2 [B]."""
    m = np.asarray(lengths, np.int64)
    # float64, like Python's round() in T5's length helper: TF's float32 product disagrees with it
    # at some lengths (390 * 0.15 is 58.5000023 in float32, 58.4999... in float64).
    num_noise = np.clip(np.rint(m * noise_density).astype(np.int64), 1, m - 1)
    num_spans = np.rint(num_noise / mean_noise_span_length).astype(np.int64)
    return num_noise, np.clip(num_spans, 1, np.minimum(num_noise, m - num_noise))


def _random_segmentation(num_items: np.ndarray, num_segments: np.ndarray, max_segments: int,
                         rng: np.random.Generator) -> np.ndarray:
    """Uniformly random composition of num_items[b] into num_segments[b] positive parts.

    Every set of num_segments - 1 cut points among the num_items - 1 gaps is equally likely, as
    in T5 (a shuffled indicator of the first items of segments). Returns [B, max_segments] int64,
    0 after each row's segments.
    """
    B = len(num_items)
    G = max(int(num_items.max()) - 1, 0)  # gaps between consecutive items
    gaps = np.arange(G)
    keys = np.where(gaps < (num_items - 1)[:, None], rng.random((B, G)), np.inf)
    chosen = np.argsort(keys, axis=1)  # [B, G] gaps in random order; invalid ones last
    is_cut = np.zeros((B, G), bool)
    np.put_along_axis(is_cut, chosen, gaps < (num_segments - 1)[:, None], axis=1)
    # Segment of every item: item 0 in segment 0; item g+1 starts a new one if gap g is a cut.
    segment = np.concatenate([np.zeros((B, 1), np.int64), np.cumsum(is_cut, axis=1)], axis=1)
    valid = np.arange(G + 1) < num_items[:, None]
    flat = (np.arange(B)[:, None] * max_segments + segment)[valid]
    return np.bincount(flat, minlength=B * max_segments).reshape(B, max_segments)


def iid_noise_mask(lengths: np.ndarray, width: int, noise_density: float, rng: np.random.Generator
                   ) -> np.ndarray:
    """T5's `iid_noise_mask`: every token is noise with probability noise_density. [B, width] bool."""
    lengths = np.asarray(lengths)
    return (rng.random((len(lengths), width)) < noise_density) & (np.arange(width) < lengths[:, None])


def random_prefix_split(lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """T5's `random_prefix_noise_mask` split point: uniform in [1, length - 1] per row ([B] int64).

    A row of length 1 (or 0) gets split point 0: everything goes to the targets.
    """
    n = np.asarray(lengths, np.int64)
    high = n - 1
    low = np.minimum(high, 1)
    return np.maximum(rng.integers(low, high + 1), 0)


# ---------------------------------------------------------------------------------------------
# Lengths.
# ---------------------------------------------------------------------------------------------
def compute_input_and_target_lengths(inputs_length: int, noise_density: float = 0.15,
                                     mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """T5's `random_spans_helper` with one sentinel per span: (raw tokens_length, targets_length).

    The longest raw chunk whose span-corrupted inputs (non-noise tokens, one sentinel per noise
    span, EOS) fit in `inputs_length`; for it the inputs are exactly `inputs_length` and the
    targets (one sentinel per span, the noise tokens, EOS) exactly `targets_length`.
    512 -> (568, 114). Python's round(), as in T5 (half to even). The counts are those the mask
    uses (`noise_counts`), clipped as there: T5's helper does not clip, and at short lengths (where
    round(num_noise / mean) = 0) it promises one token fewer than its own mask produces.
    """
    def corrupted_lengths(tokens_length: int) -> tuple[int, int]:
        num_noise, num_spans = (int(x[0]) for x in noise_counts(
            np.array([max(tokens_length, 2)]), noise_density, mean_noise_span_length))
        return tokens_length - num_noise + num_spans + 1, num_noise + num_spans + 1

    tokens_length = inputs_length - 1
    while corrupted_lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = corrupted_lengths(tokens_length)
    # T5's "minor hack": at density 0.5 make the targets no longer than the inputs.
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


# ---------------------------------------------------------------------------------------------
# Inputs and targets from a noise mask.
# ---------------------------------------------------------------------------------------------
def noise_span_to_unique_sentinel(tokens: np.ndarray, lengths: np.ndarray, noise_mask: np.ndarray,
                                  sentinel_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each run of noise tokens -> one sentinel, sentinel_ids[k] for the k-th run of the row.

    tokens, noise_mask: [B, W]; lengths: [B]; sentinel_ids: [K] (runs past K reuse the last).
    Returns (ids [B, W], new lengths [B]), ids 0 after each row's end.
    """
    valid = np.arange(tokens.shape[1]) < np.asarray(lengths)[:, None]
    noise = noise_mask & valid
    prev_noise = np.pad(noise[:, :-1], ((0, 0), (1, 0)))
    first = noise & ~prev_noise
    run = np.minimum(np.cumsum(first, axis=1) - 1, len(sentinel_ids) - 1)
    ids = np.where(first, np.asarray(sentinel_ids)[np.maximum(run, 0)], tokens)
    return compact(ids, valid & ~(noise & prev_noise))


def nonnoise_span_to_unique_sentinel(tokens, lengths, noise_mask, sentinel_ids):
    """T5's span-corruption targets: each run of NON-noise tokens -> one sentinel."""
    return noise_span_to_unique_sentinel(tokens, lengths, ~noise_mask, sentinel_ids)


def drop_tokens(tokens: np.ndarray, lengths: np.ndarray, drop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """T5's `drop_noise_tokens` (drop = noise) / `drop_nonnoise_tokens` (drop = ~noise)."""
    valid = np.arange(tokens.shape[1]) < np.asarray(lengths)[:, None]
    return compact(tokens, valid & ~drop)


def compact(values: np.ndarray, keep: np.ndarray, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Moves the kept entries of each row to its front, in order: ([B, width] int32, counts [B])."""
    counts = keep.sum(axis=1)
    width = values.shape[1] if width is None else width
    col = np.cumsum(keep, axis=1) - 1
    keep = keep & (col < width)
    out = np.zeros((values.shape[0], width), np.int32)
    r, c = np.nonzero(keep)
    out[r, col[r, c]] = values[r, c]
    return out, np.minimum(counts, width)


def append_eos(ids: np.ndarray, lengths: np.ndarray, eos_id: int, max_length: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Trims each row to max_length - 1 tokens and appends EOS (seqio's append_eos_after_trim).

    ids: [B, W] -> ([B, max_length] int32, lengths + 1 capped at max_length).
    """
    B = ids.shape[0]
    n = np.minimum(np.asarray(lengths, np.int64), max_length - 1)
    out = np.zeros((B, max_length), np.int32)
    k = min(ids.shape[1], max_length - 1)
    out[:, :k] = np.where(np.arange(k) < n[:, None], ids[:, :k], 0)
    out[np.arange(B), n] = eos_id
    return out, n + 1
