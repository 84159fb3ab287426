"""Tests for objectives/span_masking.py: SpanBERT span masking statistics and invariants."""
import numpy as np
import pytest
from scipy import stats

from objectives.span_masking import mask_spans, ngram_length_pmf, span_length_pmf

PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIALS = (PAD, CLS, SEP, MASK)
V = 50_000


def run(ids, seed=0, **kw):
    kw = {"vocab_size": V, "mask_id": MASK, "special_ids": SPECIALS, "max_predictions": 512, **kw}
    return mask_spans(ids, np.random.default_rng(seed), **kw)


def full_rows(batch, length, rng):
    """[CLS] tokens... [SEP], no padding."""
    ids = rng.integers(10, V, (batch, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = CLS, SEP
    return ids


def pair_rows(batch, length, rng):
    """[CLS] A [SEP] B [SEP] pad..., random lengths; returns ids and input_mask."""
    ids = full_rows(batch, length, rng)
    n = rng.integers(6, length + 1, batch)
    sep1 = rng.integers(2, n - 2)
    ids[np.arange(batch), sep1] = SEP
    ids[np.arange(batch), n - 1] = SEP
    real = np.arange(length) < n[:, None]
    ids[~real] = PAD
    return ids, real.astype(np.int32)


def spans_of(out):
    """[(row, first token, last token, left boundary, right boundary)], one per span."""
    w = out["masked_lm_weights"] > 0
    r, c = np.nonzero(w)
    left, right = out["span_left_boundary"][r, c], out["span_right_boundary"][r, c]
    keys = np.unique(np.stack([r, left, right], 1), axis=0)
    return [(b, lft + 1, rgt - 1, lft, rgt) for b, lft, rgt in keys]


def selected_mask(out, shape):
    sel = np.zeros(shape, bool)
    r, c = np.nonzero(out["masked_lm_weights"])
    sel[r, out["masked_lm_positions"][r, c]] = True
    return sel


def expected_observed_counts(budget, pmf):
    """Expected number of spans of each observed length per row when every word is one token.

    The process as specified: lengths are drawn i.i.d. from pmf until the budget is spent, and the
    span that reaches the budget keeps only what fits. E_r[x] = sum_l pmf(l) ([min(l, r) = x] +
    [l < r] E_{r-l}[x]), with r the tokens still to mask.
    """
    n = len(pmf)
    E = np.zeros((budget + 1, n + 1))
    for r in range(1, budget + 1):
        for ell in range(1, n + 1):
            E[r, min(ell, r)] += pmf[ell - 1]
            if ell < r:
                E[r] += pmf[ell - 1] * E[r - ell]
    return E[budget, 1:]


def test_span_length_pmf_is_the_clipped_geometric_of_the_paper():
    pmf = span_length_pmf(0.2, 10)
    raw = np.array([0.2 * 0.8 ** (k - 1) for k in range(1, 11)])
    np.testing.assert_allclose(pmf, raw / raw.sum())
    mean = (np.arange(1, 11) * pmf).sum()
    assert abs(mean - 3.8) < 0.01  # "mean span length 3.8" (Joshi et al., 2020, Section 3.1)


def test_span_lengths_follow_the_clipped_geometric():
    """One-token words: the histogram of span lengths over ~20k spans matches the pmf, with the
    budget truncation of each row's last span accounted for exactly."""
    rows, length = 2000, 256
    ids = full_rows(rows, length, np.random.default_rng(0))
    out = run(ids, seed=1)
    budget = round((length - 2) * 0.15)  # 38 candidates' worth
    np.testing.assert_array_equal(out["masked_lm_weights"].sum(1), budget)
    lengths = np.array([last - first + 1 for _, first, last, _, _ in spans_of(out)])
    assert len(lengths) > 15_000
    observed = np.bincount(lengths, minlength=11)[1:]
    assert observed.sum() == len(lengths) and lengths.max() <= 10

    expected = expected_observed_counts(budget, span_length_pmf(0.2, 10))
    expected = expected / expected.sum() * observed.sum()
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    np.testing.assert_allclose(observed / observed.sum(), expected / expected.sum(), atol=0.01)
    # The test can fail: the same spans reject a slightly different p, or no clipping.
    for wrong in (span_length_pmf(0.25, 10), span_length_pmf(0.2, 14)):
        alt = expected_observed_counts(budget, wrong)
        padded = np.pad(observed, (0, len(alt) - len(observed)))
        assert stats.chisquare(padded, alt / alt.sum() * observed.sum()).pvalue < 1e-6
    # Mean length: the pmf's 3.8 words, less a little for the truncated last spans.
    truncated_mean = (np.arange(1, 11) * expected).sum() / expected.sum()
    assert 3.5 < truncated_mean < 3.8
    assert abs(lengths.mean() - truncated_mean) < 0.05


def test_whole_words_budget_boundaries_and_specials():
    rng = np.random.default_rng(2)
    rows, length = 1500, 96
    ids, input_mask = pair_rows(rows, length, rng)
    word_starts = rng.random(ids.shape) < 0.7  # words of 1-4+ pieces
    orig = ids.copy()
    out = run(ids, seed=3, word_starts=word_starts, input_mask=input_mask, max_predictions=20)
    np.testing.assert_array_equal(ids, orig)  # input not mutated
    for k in ("input_ids", "masked_lm_positions", "masked_lm_ids", "span_left_boundary",
              "span_right_boundary", "span_position"):
        assert out[k].dtype == np.int32, k
    assert out["masked_lm_positions"].shape == (rows, 20)

    cand = ~np.isin(ids, SPECIALS)
    sel = selected_mask(out, ids.shape)
    assert sel.sum() == out["masked_lm_weights"].sum()  # no position twice
    assert not (sel & ~cand).any()  # [CLS], [SEP], padding never masked

    # Budget: never over it; under it by less than one word (whole words only).
    budget = np.minimum(20, np.maximum(1, np.rint(cand.sum(1) * 0.15)))
    count = sel.sum(1)
    assert (count <= budget).all()
    starts = word_starts | ~cand
    starts[:, 1:] |= ~cand[:, :-1]
    word = np.cumsum(starts, axis=1)
    longest_word = np.array([np.bincount(word[b][cand[b]]).max() if cand[b].any() else 1 for b in range(rows)])
    assert (budget - count < longest_word).all()
    assert 0.135 < count.sum() / cand.sum() <= 0.15 + 0.5 / 10

    n_spans = 0
    for b, first, last, left, right in spans_of(out):
        n_spans += 1
        assert left == first - 1 and right == last + 1
        assert input_mask[b, left] and input_mask[b, right]  # boundaries are real tokens ...
        assert not sel[b, left] and not sel[b, right]        # ... outside any span
        assert sel[b, first:last + 1].all() and cand[b, first:last + 1].all()  # contiguous, no special
        assert starts[b, first] and starts[b, right]          # starts and ends on word edges
        slots = (out["span_left_boundary"][b] == left) & (out["masked_lm_weights"][b] > 0)
        np.testing.assert_array_equal(out["masked_lm_positions"][b][slots], np.arange(first, last + 1))
        np.testing.assert_array_equal(out["span_position"][b][slots], np.arange(1, last - first + 2))
    assert n_spans > 2500
    # Padding slots are all zeros.
    pad = out["masked_lm_weights"] == 0
    for k in ("masked_lm_positions", "masked_lm_ids", "span_left_boundary", "span_right_boundary",
              "span_position"):
        assert (out[k][pad] == 0).all(), k


def test_each_span_is_corrupted_as_a_unit_80_10_10():
    ids = full_rows(1000, 256, np.random.default_rng(4))
    out = run(ids, seed=5)
    kinds = []
    for b, first, last, _, _ in spans_of(out):
        new, old = out["input_ids"][b, first:last + 1], ids[b, first:last + 1]
        np.testing.assert_array_equal(out["masked_lm_ids"][b][out["span_left_boundary"][b] == first - 1][:len(old)],
                                      old)
        if (new == MASK).all():
            kinds.append("mask")
        elif (new == old).all():
            kinds.append("keep")
        elif (new != MASK).all() and (new != old).all():
            kinds.append("random")
        else:
            kinds.append("mixed")  # only when a random id happens to be [MASK] or the original
    kinds = np.array(kinds)
    assert len(kinds) > 8000
    assert (kinds == "mixed").mean() < 2e-3
    assert abs((kinds == "mask").mean() - 0.8) < 0.015
    assert abs((kinds == "random").mean() - 0.1) < 0.012
    assert abs((kinds == "keep").mean() - 0.1) < 0.012
    # Tokens outside spans are untouched.
    sel = selected_mask(out, ids.shape)
    np.testing.assert_array_equal(out["input_ids"][~sel], ids[~sel])


def test_short_and_degenerate_rows():
    ids = np.array([[CLS, SEP, PAD, PAD, PAD],      # no candidates: nothing to predict
                    [CLS, 11, SEP, PAD, PAD],       # one token: budget max(1, .) = 1
                    [12, 13, 14, 15, 16]],          # no specials: the edge words have no boundary
                   np.int32)
    mask = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    for seed in range(20):
        out = run(ids, seed=seed, input_mask=mask, max_predictions=4)
        w = out["masked_lm_weights"]
        assert w[0].sum() == 0
        assert w[1].sum() == 1 and out["masked_lm_positions"][1, 0] == 1
        assert (out["span_left_boundary"][1, 0], out["span_right_boundary"][1, 0]) == (0, 2)
        assert w[2].sum() == 1 and 1 <= out["masked_lm_positions"][2, 0] <= 3  # never 0 or 4


def test_dynamic_masking_and_determinism():
    ids = full_rows(8, 128, np.random.default_rng(6))
    a, b, c = run(ids, seed=7), run(ids, seed=7), run(ids, seed=8)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["masked_lm_positions"], c["masked_lm_positions"])


@pytest.mark.parametrize("bad", [dict(replace_with_mask=0.95, replace_with_random=0.1),
                                 dict(span_lengths=[0.5, 0.6]), dict(span_lengths=[]),
                                 dict(span_lengths=[1.5, -0.5])])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        run(full_rows(2, 16, np.random.default_rng(0)), **bad)
    with pytest.raises(ValueError, match="batch, length"):
        run(np.zeros(5, np.int32))


# ----- ALBERT's n-grams: the same placement, lengths P(n) ~ 1/n -----
def test_ngram_length_pmf_is_albert_one_over_n():
    """ALBERT's create_pretraining_data.py: pvals = 1 / arange(1, ngram + 1), normalised; ngram = 3."""
    np.testing.assert_allclose(ngram_length_pmf(3), [6 / 11, 3 / 11, 2 / 11])
    np.testing.assert_allclose(ngram_length_pmf(1), [1.0])


def test_ngram_lengths_in_whole_words_follow_one_over_n():
    """Words of two tokens each, so a length in words is half the span's tokens and the budget (38 tokens) is 19
    words: the histogram of n-gram lengths in words matches 6/11, 3/11, 2/11 with each row's last n-gram cut to
    what is left of the budget, as expected_observed_counts computes it. The same n-grams reject P(n) ~ n
    (ALBERT's favor_shorter_ngram=False) and a uniform P(n)."""
    rows, words = 2000, 128
    ids = full_rows(rows, 2 * words + 2, np.random.default_rng(10))
    word_starts = np.zeros(ids.shape, bool)
    word_starts[:, 1::2] = True                # tokens 1, 3, 5, ... start the words of two tokens
    out = run(ids, seed=11, word_starts=word_starts, span_lengths=ngram_length_pmf(3))
    budget = round(2 * words * 0.15)           # 38 tokens = 19 words
    np.testing.assert_array_equal(out["masked_lm_weights"].sum(1), budget)
    tokens = np.array([last - first + 1 for _, first, last, _, _ in spans_of(out)])
    assert len(tokens) > 20_000 and (tokens % 2 == 0).all()  # whole words only
    observed = np.bincount(tokens // 2, minlength=4)[1:]
    assert observed.sum() == len(tokens)        # never longer than 3 words

    expected = expected_observed_counts(budget // 2, ngram_length_pmf(3))
    expected = expected / expected.sum() * observed.sum()
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    np.testing.assert_allclose(observed / observed.sum(), expected / expected.sum(), atol=0.01)
    # The cut shortens about one n-gram in twelve: the shares stay within 0.03 of the drawn 6/11, 3/11, 2/11.
    np.testing.assert_allclose(observed / observed.sum(), [6 / 11, 3 / 11, 2 / 11], atol=0.03)
    for wrong in (ngram_length_pmf(3)[::-1], np.full(3, 1 / 3)):
        alt = expected_observed_counts(budget // 2, wrong)
        assert stats.chisquare(observed, alt / alt.sum() * observed.sum()).pvalue < 1e-6
