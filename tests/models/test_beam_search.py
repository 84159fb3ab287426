"""models/decoding.py's beam search on the toy models of tests/helpers/toy_decoders.py (Markov chain and
history model), checked against brute-force enumeration, and greedy + beam search on a real Flax attention
cache."""
from __future__ import annotations

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import decoding
from tests.helpers.toy_decoders import (HistoryModel, brute_force_beams, jit_call, log_softmax, markov_cache,
                                        markov_model, python_greedy)

# ----------------------------------------------------------------------------------------------
# Beam search
# ----------------------------------------------------------------------------------------------

def run_beam_search(model, cache, starts, max_length, eos, beam_size, alpha, **kw):
    sequences, scores = jit_call(
        lambda c, s: decoding.beam_search(model, c, s, max_length, eos, beam_size, alpha, **kw),
        cache, jnp.asarray(starts, jnp.int32))
    return np.asarray(sequences), np.asarray(scores)


def test_beam_search_equals_brute_force_enumeration():
    """V=3 (EOS=2), length 4: at most 2**3 live prefixes, so 8 beams make the search exhaustive.

    Without a length penalty and with GNMT's, whose winner differs here for start token 0.
    """
    vocab, eos, max_length, beams = 3, 2, 4, 8
    model = HistoryModel(vocab, max_length, seed=31)
    starts = jnp.asarray([0, 1, 2], jnp.int32)
    search = jax.jit(lambda cache, alpha: decoding.beam_search(model, cache, starts, max_length, eos, beams, alpha))
    winners = {}
    for alpha in (0.0, 0.6, 2.0):
        sequences, scores = search(model.init_cache(3), jnp.float32(alpha))
        for b, start in enumerate(np.asarray(starts)):
            expected = brute_force_beams(model.reference_logits, int(start), vocab, max_length, eos, alpha)[:beams]
            np.testing.assert_allclose(scores[b], [s for s, _ in expected], rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(sequences[b], [seq for _, seq in expected])
        winners[alpha] = list(np.asarray(sequences[0, 0]))
    assert winners[0.0] != winners[0.6], "pick a seed where the penalty matters, or the test proves less"


def test_beam_search_with_prompts_equals_brute_force():
    vocab, eos, max_length, beams = 3, 2, 5, 8
    model = HistoryModel(vocab, max_length, seed=11)
    prompt = np.array([[1, 1, 0], [0, 2, 1], [1, 0, 1]], np.int32)  # an EOS inside row 1's prompt
    lengths = np.array([0, 2, 3], np.int32)
    sequences, scores = run_beam_search(model, model.init_cache(3), [0, 1, 0], max_length, eos, beams, 0.6,
                                        prompt=jnp.asarray(prompt), prompt_lengths=jnp.asarray(lengths))
    for b, start in enumerate([0, 1, 0]):
        forced = list(prompt[b, :lengths[b]])
        expected = brute_force_beams(model.reference_logits, start, vocab, max_length, eos, 0.6,
                                     prompt=forced)[:beams]
        filled = len(expected)  # fewer finished hypotheses than beams when the prompt is long
        np.testing.assert_allclose(scores[b, :filled], [s for s, _ in expected], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(sequences[b, :filled], [seq for _, seq in expected])
        assert np.all(scores[b, filled:] < decoding.NEG_INF / 2)


def test_beam_size_one_is_greedy():
    """With alpha=0 and EOS unlikely except where greedy takes it, beam 1 keeps the greedy path."""
    vocab, eos, max_length = 6, 5, 8
    rng = np.random.default_rng(12)
    table = rng.normal(size=(vocab, vocab)).astype(np.float32)
    table[:, eos] = -30.0
    table[3, eos] = 10.0  # EOS only after token 3
    starts = np.arange(5, dtype=np.int32)
    greedy = np.asarray(decoding.greedy_search(markov_model(table), markov_cache(5), jnp.asarray(starts),
                                               max_length, eos))
    sequences, _ = run_beam_search(markov_model(table), markov_cache(5), starts, max_length, eos, 1, 0.0)
    np.testing.assert_array_equal(sequences[:, 0], greedy)
    assert (greedy == eos).any(axis=1).any() and not (greedy == eos).any(axis=1).all(), \
        "cover rows that finish and rows that fall back to the live beam"


def test_beam_search_beats_greedy_on_a_crafted_table():
    """Greedy takes A (0.5) then B (0.35) then EOS (0.95): p = 0.166; B then EOS has p = 0.38."""
    eos = 3
    probs = np.array([[1e-6, 0.5, 0.4, 0.1],       # from the start token 0
                      [0.05, 0.3, 0.35, 0.3],      # from A = 1
                      [0.02, 0.02, 0.01, 0.95],    # from B = 2
                      [0.25, 0.25, 0.25, 0.25]])
    table = np.log(probs / probs.sum(1, keepdims=True)).astype(np.float32)
    greedy = np.asarray(decoding.greedy_search(markov_model(table), markov_cache(1), jnp.zeros((1,), jnp.int32),
                                               3, eos))
    np.testing.assert_array_equal(greedy[0], [1, 2, eos])
    sequences, scores = run_beam_search(markov_model(table), markov_cache(1), [0], 3, eos, 2, 0.0)
    np.testing.assert_array_equal(sequences[0, 0], [2, eos, 0])
    np.testing.assert_allclose(scores[0, 0], np.log(0.4 * 0.95), rtol=1e-5)
    assert scores[0, 0] > scores[0, 1]


def test_expand_to_beams_repeats_rows_and_keeps_scalars():
    tree = {"x": jnp.arange(6).reshape(2, 3), "index": jnp.int32(4)}
    expanded = decoding.expand_to_beams(tree, 3)
    np.testing.assert_array_equal(expanded["x"], np.repeat(np.arange(6).reshape(2, 3), 3, axis=0))
    assert expanded["index"].shape == ()


def test_brute_force_reference_is_exhaustive():
    """Guards the reference itself: probabilities of all finished sequences plus unfinished ones sum to 1."""
    vocab, eos, max_length = 3, 2, 3
    model = HistoryModel(vocab, max_length, seed=13)
    finished = brute_force_beams(model.reference_logits, 0, vocab, max_length, eos, 0.0)
    unfinished = 0.0
    for seq in itertools.product([t for t in range(vocab) if t != eos], repeat=max_length):
        fed, logprob = [0], 0.0
        for token in seq:
            logprob += log_softmax(model.reference_logits(fed))[token]
            fed.append(token)
        unfinished += np.exp(logprob)
    assert len(finished) == 1 + 2 + 4
    np.testing.assert_allclose(sum(np.exp(s) for s, _ in finished) + unfinished, 1.0, rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# A real Flax decoder with the 'cache' collection (what T5 and GPT hand to these routines)
# ----------------------------------------------------------------------------------------------

class TinyCausalLM(nn.Module):
    """One causal self-attention layer; decode=True reads and writes Flax's attention cache."""
    vocab: int
    length: int

    @nn.compact
    def __call__(self, ids, positions, decode=False):                # [B, L] -> [B, L, V]
        x = nn.Embed(self.vocab, 16)(ids) + nn.Embed(self.length, 16)(positions)
        mask = None if decode else nn.make_causal_mask(ids)
        x = x + nn.SelfAttention(num_heads=2, qkv_features=16, decode=decode, deterministic=True)(x, mask=mask)
        return 4.0 * nn.Dense(self.vocab)(x)                         # peaky enough to avoid near-ties


@pytest.mark.slow  # ~7 s of CPU, mostly compiling a real attention layer
def test_flax_attention_cache_with_greedy_and_beam_search():
    """Cached one-token decoding (cache leaves [B, 1, L, H, K] plus a scalar index) against full forward passes."""
    vocab, eos, max_length, batch = 3, 2, 4, 2
    model = TinyCausalLM(vocab, max_length + 1)
    full = jnp.zeros((batch, max_length + 1), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), full, full)["params"]
    cache = model.init(jax.random.PRNGKey(0), full, full, decode=True)["cache"]
    assert any(jnp.ndim(leaf) == 0 for leaf in jax.tree_util.tree_leaves(cache))

    def tokens_to_logits(ids, cache, step):
        logits, variables = model.apply({"params": params, "cache": cache}, ids, jnp.full_like(ids, step),
                                        decode=True, mutable=["cache"])
        return logits[:, 0], variables["cache"]

    full_forward = jax.jit(lambda ids: model.apply({"params": params}, ids, jnp.arange(ids.shape[1])[None]))

    def reference_logits(fed):  # causal: the right padding does not change position len(fed) - 1
        ids = np.zeros((1, max_length + 1), np.int32)
        ids[0, :len(fed)] = fed
        return np.asarray(full_forward(jnp.asarray(ids)))[0, len(fed) - 1]

    starts = [0, 1]
    greedy = jit_call(lambda c, s: decoding.greedy_search(tokens_to_logits, c, s, max_length, eos),
                      cache, jnp.asarray(starts, jnp.int32))
    for row, start in zip(np.asarray(greedy), starts):
        np.testing.assert_array_equal(row, python_greedy(reference_logits, start, max_length, eos))
    sequences, scores = run_beam_search(tokens_to_logits, cache, starts, max_length, eos, 8, 0.6)
    for b, start in enumerate(starts):
        expected = brute_force_beams(reference_logits, start, vocab, max_length, eos, 0.6)[:8]
        np.testing.assert_allclose(scores[b], [s for s, _ in expected], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(sequences[b, :3], [seq for _, seq in expected[:3]])
