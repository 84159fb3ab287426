"""Tests for objectives/span_corruption.py against the T5 library's semantics (t5/data/preprocessors.py)."""
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from objectives import span_corruption as sc

V = 32_100  # t5-base: 32,000 pieces + 100 sentinels
EOS = 1
SENTINELS = np.array([V - 1 - k for k in range(100)])  # <extra_id_k> = V - 1 - k


def random_rows(rng, batch, width, lengths=None):
    """Plain text ids (never EOS, pad or a sentinel) and their lengths."""
    tokens = rng.integers(3, V - 100, (batch, width)).astype(np.int32)
    lengths = np.full(batch, width) if lengths is None else np.asarray(lengths)
    tokens[np.arange(width) >= lengths[:, None]] = 0
    return tokens, lengths


def runs(mask_row):
    """[(is_noise, length), ...] of a 1-D bool array."""
    return [(bool(k), len(list(g))) for k, g in itertools.groupby(mask_row)]


# ---------------------------------------------------------------------------------------------
# random_spans_helper
# ---------------------------------------------------------------------------------------------
def test_lengths_of_the_t5_paper():
    # Raffel et al.: 512 inputs come from 568 raw tokens (85 noise tokens in 28 spans), and the
    # targets are 85 + 28 sentinels + EOS = 114.
    assert sc.compute_input_and_target_lengths(512, 0.15, 3.0) == (568, 114)
    # By hand: 141 tokens -> round(21.15) = 21 noise in round(7.0) = 7 spans, inputs 120 + 7 + 1 = 128;
    # 142 tokens -> 21 noise, 7 spans, inputs 129 > 128. Targets 21 + 7 + 1 = 29.
    assert sc.compute_input_and_target_lengths(128, 0.15, 3.0) == (141, 29)
    # t5.1.1 / mT5 use the same helper; 1024 inputs (by hand: 1137 -> 171 noise, 57 spans).
    assert sc.compute_input_and_target_lengths(1024, 0.15, 3.0) == (1137, 229)


@pytest.mark.parametrize("density,mean_span", [(0.15, 3.0), (0.3, 8.0), (0.5, 3.0), (0.15, 1.0)])
def test_lengths_are_exact_for_raw_chunks(density, mean_span):
    """Corrupting a raw chunk of the helper's length gives exactly inputs_length / targets_length at
    every length (T5's own helper and mask disagree at some: float32 rounding, short lengths)."""
    rng = np.random.default_rng(0)
    for inputs_length in range(8, 1100, 7):
        raw, targets_length = sc.compute_input_and_target_lengths(inputs_length, density, mean_span)
        if density == 0.5 and targets_length + 1 > inputs_length:  # T5's "minor hack" dropped a token
            continue
        tokens, lengths = random_rows(rng, 2, raw)
        mask = sc.random_spans_noise_mask(lengths, density, mean_span, rng)
        _, n_in = sc.noise_span_to_unique_sentinel(tokens, lengths, mask, SENTINELS)
        _, n_tg = sc.nonnoise_span_to_unique_sentinel(tokens, lengths, mask, SENTINELS)
        np.testing.assert_array_equal(n_in + 1, inputs_length, err_msg=f"inputs_length={inputs_length}")
        np.testing.assert_array_equal(n_tg + 1, targets_length, err_msg=f"inputs_length={inputs_length}")


# ---------------------------------------------------------------------------------------------
# random_spans_noise_mask
# ---------------------------------------------------------------------------------------------
def test_noise_mask_structure_per_row():
    rng = np.random.default_rng(1)
    lengths = rng.integers(2, 700, 3000)
    mask = sc.random_spans_noise_mask(lengths, 0.15, 3.0, rng)
    assert mask.shape == (3000, lengths.max()) and mask.dtype == bool
    for row, n in zip(mask, lengths):
        assert not row[n:].any()
        num_noise = min(max(round(n * 0.15), 1), n - 1)
        num_spans = max(1, round(num_noise / 3.0))
        r = runs(row[:n])
        assert row[:n].sum() == num_noise
        # Alternating, starting with non-noise and ending with noise: 2 * num_spans runs.
        assert [k for k, _ in r] == [False, True] * num_spans


def test_noise_fraction_and_mean_span_length():
    rng = np.random.default_rng(2)
    mask = sc.random_spans_noise_mask(np.full(4000, 568), 0.15, 3.0, rng)
    np.testing.assert_array_equal(mask.sum(1), 85)  # round(568 * 0.15), every row
    span_lengths = [n for row in mask[:500] for k, n in runs(row) if k]
    assert len(span_lengths) == 500 * 28
    assert abs(np.mean(span_lengths) - 85 / 28) < 1e-9
    assert abs(mask.mean() - 0.15) < 0.001
    # No position bias beyond T5's own: the last token is always noise, the first never; the
    # middle of the sequence is noise at about the overall rate.
    per_position = mask.mean(0)
    assert per_position[-1] == 1.0 and per_position[0] == 0.0
    assert abs(per_position[100:460].mean() - 0.15) < 0.01
    # Another density / span length: the mean span length follows the configuration.
    mask = sc.random_spans_noise_mask(np.full(2000, 1000), 0.3, 8.0, rng)
    spans = [n for row in mask[:200] for k, n in runs(row) if k]
    assert abs(np.mean(spans) - 300 / 38) < 1e-9  # round(300 / 8) = 38 spans of 300 tokens


def test_all_masks_equally_likely():
    """T5: subject to the counts, all masks are equally likely. Length 40: 6 noise tokens in 2 spans
    (5 compositions) and 34 non-noise tokens in 2 spans (33) -> 165 masks, each 1/165."""
    rng = np.random.default_rng(3)
    n_samples = 165 * 200
    mask = sc.random_spans_noise_mask(np.full(n_samples, 40), 0.15, 3.0, rng)
    _, counts = np.unique(np.packbits(mask, axis=1), axis=0, return_counts=True)
    assert len(counts) == 165
    assert stats.chisquare(counts).pvalue > 1e-4


def test_degenerate_lengths_follow_t5():
    rng = np.random.default_rng(4)
    mask = sc.random_spans_noise_mask(np.array([0, 1, 2, 3, 30]), 0.15, 3.0, rng)
    # Length 0/1: no noise (T5 pads to 2 and truncates). 2, 3: one noise token, at the end.
    # 30: round(4.5) = 4 noise tokens (half to even) in one span: the last 4 tokens.
    assert mask[:2].sum() == 0
    assert mask[2].tolist()[:2] == [False, True] and mask[3].tolist()[:3] == [False, False, True]
    assert mask[4].tolist() == [False] * 26 + [True] * 4
    assert sc.random_spans_noise_mask(10, 0.15, 3.0, rng).shape == (10,)  # scalar length
    assert not sc.random_spans_noise_mask(np.array([50]), 0.0, 3.0, rng).any()


def test_random_segmentation_is_uniform():
    rng = np.random.default_rng(5)
    seg = sc._random_segmentation(np.full(36_000, 10), np.full(36_000, 3), 3, rng)
    np.testing.assert_array_equal(seg.sum(1), 10)
    assert seg.min() >= 1
    _, counts = np.unique(seg, axis=0, return_counts=True)
    assert len(counts) == math.comb(9, 2)  # compositions of 10 into 3 positive parts
    assert stats.chisquare(counts).pvalue > 1e-4


# ---------------------------------------------------------------------------------------------
# Sentinels
# ---------------------------------------------------------------------------------------------
def reference_noise_span_to_unique_sentinel(tokens, noise_mask, vocab_size):
    """T5's noise_span_to_unique_sentinel, one 1-D example, written as a plain loop."""
    out, sentinel, prev = [], vocab_size - 1, False
    for t, noise in zip(tokens, noise_mask):
        if noise and not prev:
            out.append(sentinel)
            sentinel -= 1
        elif not noise:
            out.append(t)
        prev = noise
    return out


@pytest.mark.parametrize("kind", ["spans", "iid"])
def test_sentinels_match_the_t5_reference(kind):
    rng = np.random.default_rng(6)
    tokens, lengths = random_rows(rng, 300, 200, lengths=rng.integers(1, 201, 300))
    if kind == "spans":
        mask = sc.random_spans_noise_mask(lengths, 0.15, 3.0, rng, width=200)
    else:  # may start with noise and end with non-noise
        mask = sc.iid_noise_mask(lengths, 200, 0.3, rng)
    inputs, n_in = sc.noise_span_to_unique_sentinel(tokens, lengths, mask, SENTINELS)
    targets, n_tg = sc.nonnoise_span_to_unique_sentinel(tokens, lengths, mask, SENTINELS)
    assert inputs.dtype == np.int32
    for b in range(300):
        n = lengths[b]
        assert inputs[b, :n_in[b]].tolist() == reference_noise_span_to_unique_sentinel(tokens[b, :n], mask[b, :n], V)
        assert targets[b, :n_tg[b]].tolist() == reference_noise_span_to_unique_sentinel(
            tokens[b, :n], ~mask[b, :n], V)
        assert not inputs[b, n_in[b]:].any() and not targets[b, n_tg[b]:].any()


def test_span_corruption_reconstructs_the_text():
    """Replacing each sentinel of the inputs by its span in the targets gives back the text."""
    rng = np.random.default_rng(7)
    tokens, lengths = random_rows(rng, 200, 568, lengths=np.r_[np.full(150, 568), rng.integers(2, 568, 50)])
    mask = sc.random_spans_noise_mask(lengths, 0.15, 3.0, rng)
    inputs, n_in = sc.noise_span_to_unique_sentinel(tokens, lengths, mask, SENTINELS)
    targets, n_tg = sc.nonnoise_span_to_unique_sentinel(tokens, lengths, mask, SENTINELS)
    inputs, n_in = sc.append_eos(inputs, n_in, EOS, 512)
    targets, n_tg = sc.append_eos(targets, n_tg, EOS, 114)
    for b in range(200):
        inp, tgt = inputs[b, :n_in[b]].tolist(), targets[b, :n_tg[b]].tolist()
        assert inp[-1] == EOS and tgt[-1] == EOS and EOS not in inp[:-1] + tgt[:-1]
        in_sentinels = [t for t in inp if t >= V - 100]
        # Descending from V - 1 in order of appearance, and the targets open with <extra_id_0>.
        assert in_sentinels == list(range(V - 1, V - 1 - len(in_sentinels), -1))
        assert tgt[0] == V - 1 and [t for t in tgt if t >= V - 100] == in_sentinels
        spans, current = {}, None
        for t in tgt[:-1]:
            if t >= V - 100:
                current = spans.setdefault(t, [])
            else:
                current.append(t)
        rebuilt = [x for t in inp[:-1] for x in (spans[t] if t >= V - 100 else [t])]
        assert rebuilt == tokens[b, :lengths[b]].tolist()
        if lengths[b] == 568:
            assert len(inp) == 512 and len(tgt) == 114


def test_too_many_spans_reuse_the_last_sentinel():
    tokens, lengths = random_rows(np.random.default_rng(8), 1, 20)
    mask = np.array([[i % 2 == 1 for i in range(20)]])  # 10 noise spans
    inputs, n = sc.noise_span_to_unique_sentinel(tokens, lengths, mask, SENTINELS[:3])
    assert inputs[0, 1:n[0]:2].tolist() == [V - 1, V - 2] + [V - 3] * 8


# ---------------------------------------------------------------------------------------------
# i.i.d. noise, prefix split, EOS
# ---------------------------------------------------------------------------------------------
def test_iid_noise_rate():
    rng = np.random.default_rng(9)
    lengths = rng.integers(100, 512, 2000)
    mask = sc.iid_noise_mask(lengths, 512, 0.15, rng)
    assert not mask[np.arange(512) >= lengths[:, None]].any()
    assert abs(mask.sum() / lengths.sum() - 0.15) < 0.003


def test_prefix_split_is_uniform():
    rng = np.random.default_rng(10)
    split = sc.random_prefix_split(np.full(40_000, 21), rng)
    assert split.min() == 1 and split.max() == 20  # [1, length - 1]
    assert stats.chisquare(np.bincount(split)[1:]).pvalue > 1e-4
    np.testing.assert_array_equal(sc.random_prefix_split(np.array([0, 1, 2]), rng), [0, 0, 1])


def test_append_eos_trims_and_keeps_eos():
    ids = np.array([[5, 6, 7, 8, 9], [5, 6, 0, 0, 0]], np.int32)
    out, n = sc.append_eos(ids, np.array([5, 2]), EOS, 4)
    assert out.tolist() == [[5, 6, 7, EOS], [5, 6, EOS, 0]] and n.tolist() == [4, 3]
