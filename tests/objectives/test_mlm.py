"""Tests for objectives/mlm.py: BERT masking statistics and invariants, and the MLM loss."""
import jax.numpy as jnp
import numpy as np
import pytest

from objectives.mlm import mask_tokens, mlm_loss

PAD, CLS, SEP, MASK, EXTRA = 0, 1, 2, 3, 4  # EXTRA: an arbitrary additional special id
SPECIALS = (PAD, CLS, SEP, MASK, EXTRA)
V = 50_000


def make_batch(rng, batch=512, length=128, extra_prob=0.02):
    """[CLS] A [SEP] B [SEP] pad..., with random lengths and a few EXTRA specials inside."""
    ids = rng.integers(10, V, (batch, length)).astype(np.int32)
    n = rng.integers(length // 2, length + 1, batch)  # real length incl. specials
    sep1 = rng.integers(2, n - 2)
    cols = np.arange(length)
    ids[rng.random((batch, length)) < extra_prob] = EXTRA
    ids[:, 0] = CLS
    ids[np.arange(batch), sep1] = SEP
    ids[np.arange(batch), n - 1] = SEP
    ids[cols >= n[:, None]] = PAD
    return ids


def run(ids, seed=0, **kw):
    kw = {"vocab_size": V, "mask_id": MASK, "special_ids": SPECIALS, "max_predictions": 128,
          **kw}
    return mask_tokens(ids, np.random.default_rng(seed), **kw)


def selected_mask(out, shape):
    sel = np.zeros(shape, bool)
    r, c = np.nonzero(out["masked_lm_weights"])
    sel[r, out["masked_lm_positions"][r, c]] = True
    return sel


def test_statistics_and_invariants():
    ids = make_batch(np.random.default_rng(1), batch=2048)
    orig = ids.copy()
    out = run(ids)
    np.testing.assert_array_equal(ids, orig)  # input not mutated
    cand = ~np.isin(ids, SPECIALS)
    assert cand.sum() >= 100_000
    pos, w, lab = out["masked_lm_positions"], out["masked_lm_weights"], out["masked_lm_ids"]
    assert pos.dtype == np.int32 and lab.dtype == np.int32 and w.dtype == np.float32
    assert out["input_ids"].dtype == np.int32 and out["input_ids"].shape == ids.shape
    sel = selected_mask(out, ids.shape)
    assert sel.sum() == w.sum()  # no position appears twice

    # Budget per row exactly as BERT: min(P, max(1, round(n * 0.15))), Python's round.
    expect = [min(128, max(1, round(n * 0.15))) for n in cand.sum(1)]
    np.testing.assert_array_equal(w.sum(1), expect)
    assert abs(sel.sum() / cand.sum() - 0.15) < 0.005
    assert not (sel & ~cand).any()  # specials ([CLS], [SEP], pad, EXTRA) never selected

    # Positions ascending and real first; padding is position 0 with weight 0, label 0.
    assert (np.diff(w, axis=1) <= 0).all()
    assert ((np.diff(pos, axis=1) > 0) | (w[:, 1:] == 0)).all()
    assert (pos[w == 0] == 0).all() and (lab[w == 0] == 0).all()
    np.testing.assert_array_equal(lab, np.where(w > 0, np.take_along_axis(ids, pos, 1), 0))
    np.testing.assert_array_equal(out["input_ids"][~sel], ids[~sel])  # the rest is untouched

    new, old = out["input_ids"][sel], ids[sel]
    masked, kept = new == MASK, new == old
    rand = ~masked & ~kept  # a random id equal to the original (p = 1/V) counts as kept
    assert abs(masked.mean() - 0.8) < 0.01
    assert abs(rand.mean() - 0.1) < 0.01
    assert abs(kept.mean() - 0.1) < 0.01
    # Random replacements come from the whole vocabulary, uniformly.
    r = new[rand]
    assert r.min() >= 0 and r.max() < V and abs(r.mean() / V - 0.5) < 0.02


def test_max_predictions_cap_and_no_candidates():
    ids = make_batch(np.random.default_rng(2), batch=64)
    ids[0, 1:] = PAD  # a row with no candidate at all
    out = run(ids, max_predictions=5)
    assert out["masked_lm_positions"].shape == (64, 5)
    w = out["masked_lm_weights"]
    assert w[0].sum() == 0 and (w[1:].sum(1) == 5).all()  # >= 34 candidates per row: capped
    # P wider than the sequence: outputs still [B, P], padded.
    out = run(ids[:, :8], max_predictions=20, mask_prob=1.0)
    assert out["masked_lm_positions"].shape == (64, 20)
    np.testing.assert_array_equal(out["masked_lm_weights"].sum(1),
                                  (~np.isin(ids[:, :8], SPECIALS)).sum(1))


def test_dynamic_masking_and_determinism():
    ids = make_batch(np.random.default_rng(3), batch=32)
    a, b, c = run(ids, seed=0), run(ids, seed=0), run(ids, seed=1)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["masked_lm_positions"], c["masked_lm_positions"])
    assert not np.array_equal(a["input_ids"], c["input_ids"])


def test_whole_word_masking():
    rng = np.random.default_rng(4)
    ids = make_batch(rng, batch=1024, length=64)
    special = np.isin(ids, SPECIALS)
    starts = rng.random(ids.shape) < 0.4  # words of ~2.5 sub-tokens
    starts |= special
    starts[:, 1:] |= special[:, :-1]  # the token after a special starts a word
    starts[:, 0] = True
    out = run(ids, max_predictions=10, word_starts=starts)
    sel = selected_mask(out, ids.shape)
    assert not (sel & special).any()

    word = np.cumsum(starts, axis=1) - 1
    budget = np.minimum(10, np.maximum(1, np.rint((~special).sum(1) * 0.15)))
    for b in range(len(ids)):
        real = ~special[b]
        n_words = word[b].max() + 1
        size = np.bincount(word[b][real], minlength=n_words)
        hit = np.bincount(word[b][real], weights=sel[b][real], minlength=n_words)
        assert ((hit == 0) | (hit == size)).all(), "a word was selected partially"
        left = budget[b] - sel[b].sum()
        assert left >= 0
        # BERT's greedy skips a word only if it no longer fits: every unselected word is too long.
        assert (size[(hit == 0) & (size > 0)] > left).all()
    assert sel.sum() > 0.9 * budget.sum()


def test_mlm_loss_matches_numpy():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(4, 6, 11)).astype(np.float32) * 3
    targets = rng.integers(0, 11, (4, 6))
    targets[0, :3] = logits[0, :3].argmax(-1)  # some correct predictions
    weights = (rng.random((4, 6)) < 0.7).astype(np.float32)
    weights[1] = 0  # padding rows; their (arbitrary) targets must not count

    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    ce = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    want = (ce * weights).sum() / weights.sum()
    want_acc = ((logits.argmax(-1) == targets) * weights).sum() / weights.sum()

    loss, m = mlm_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights))
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(m["mlm_loss"], want, rtol=1e-5)
    np.testing.assert_allclose(m["mlm_accuracy"], want_acc, rtol=1e-6)
    assert m["mlm_accuracy"] > 0

    loss16, _ = mlm_loss(jnp.asarray(logits, jnp.bfloat16), jnp.asarray(targets),
                         jnp.asarray(weights))
    assert loss16.dtype == jnp.float32
    np.testing.assert_allclose(loss16, want, rtol=2e-2)
    zero, m0 = mlm_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.zeros((4, 6)))
    assert float(zero) == 0.0 and float(m0["mlm_accuracy"]) == 0.0


@pytest.mark.parametrize("bad", [{"replace_with_mask": 0.95, "replace_with_random": 0.1}])
def test_bad_arguments(bad):
    with pytest.raises(ValueError, match="replace_with_mask"):
        run(make_batch(np.random.default_rng(6), batch=2), **bad)
