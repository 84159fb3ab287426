"""models/decoding.py on toy models whose answers a plain Python loop or brute force can give (the Markov
chain and history model of tests/helpers/toy_decoders.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import decoding
from models.errors import ModelInputError
from tests.helpers.toy_decoders import (HistoryModel, jit_call, markov_cache, markov_logits_of, markov_model,
                                        python_greedy, softmax)

# ----------------------------------------------------------------------------------------------
# Greedy
# ----------------------------------------------------------------------------------------------

def test_greedy_matches_python_argmax_chain_and_stops_rows_independently():
    vocab, eos, max_length = 7, 6, 9
    table = np.random.default_rng(0).normal(size=(vocab, vocab)).astype(np.float32) * 0.5
    for token, successor in {0: 1, 1: 2, 2: eos, 3: 4, 4: 3, 5: eos, 6: 0}.items():
        table[token, successor] += 3.0  # 3 <-> 4 never stops; the others stop after 0 to 3 steps
    starts = np.arange(vocab, dtype=np.int32)
    tokens = jit_call(lambda c, s: decoding.greedy_search(markov_model(table), c, s, max_length, eos),
                      markov_cache(vocab), jnp.asarray(starts))
    expected = [python_greedy(markov_logits_of(table), int(s), max_length, eos) for s in starts]
    np.testing.assert_array_equal(np.asarray(tokens), expected)
    stopped = [eos in row for row in expected]
    assert any(stopped) and not all(stopped), "the table must stop some rows and not others"
    lengths = {row.index(eos) for row in expected if eos in row}
    assert len(lengths) > 1, "rows should stop at different steps"


def test_greedy_on_history_model_and_multiple_stop_ids():
    model = HistoryModel(vocab=5, max_length=8, seed=3)
    starts = jnp.asarray([0, 1, 2, 3, 4], jnp.int32)
    stop_ids = (3, 4)
    tokens = np.asarray(jit_call(lambda c, s: decoding.greedy_search(model, c, s, 8, stop_ids=stop_ids),
                                 model.init_cache(5), starts))
    for row, start in zip(tokens, np.asarray(starts)):
        expected = python_greedy(model.reference_logits, int(start), 8, None)
        stop = next((i for i, t in enumerate(expected) if t in stop_ids), None)
        if stop is not None:
            expected = expected[:stop + 1] + [0] * (7 - stop)
        np.testing.assert_array_equal(row, expected)


def test_loop_ends_when_every_row_has_stopped():
    vocab, eos = 4, 3
    table = np.full((vocab, vocab), -5.0, np.float32)
    table[0, 1] = table[1, 2] = table[2, eos] = 5.0  # 0 -> 1 -> 2 -> EOS for every row
    calls = []

    def counting_model(ids, cache, step):
        jax.debug.callback(lambda s: calls.append(int(s)), step)
        return markov_model(table)(ids, cache, step)

    tokens = jit_call(lambda c, s: decoding.greedy_search(counting_model, c, s, 12, eos),
                      markov_cache(2), jnp.zeros((2,), jnp.int32))
    np.testing.assert_array_equal(np.asarray(tokens), [[1, 2, 3] + [0] * 9] * 2)
    assert calls == [0, 1, 2]


def test_prompts_of_different_lengths_are_forced():
    vocab, eos, max_length = 6, 5, 8
    table = np.random.default_rng(1).normal(size=(vocab, vocab)).astype(np.float32)
    table[:, eos] -= 3.0  # long continuations
    table[eos, 0] = -9.0  # after the EOS inside row 1's prompt the model picks a non-pad token
    prompt = np.array([[4, 4, 4, 4], [2, eos, 0, 0], [1, 3, 2, 1]], np.int32)
    lengths = np.array([0, 2, 4], np.int32)
    starts = np.array([1, 0, 3], np.int32)
    tokens = np.asarray(jit_call(
        lambda c, s: decoding.greedy_search(markov_model(table), c, s, max_length, eos,
                                            prompt=jnp.asarray(prompt), prompt_lengths=jnp.asarray(lengths)),
        markov_cache(3), jnp.asarray(starts)))
    for b in range(3):
        expected = python_greedy(markov_logits_of(table), int(starts[b]), max_length, eos,
                                 prompt=list(prompt[b, :lengths[b]]))
        np.testing.assert_array_equal(tokens[b], expected)
    assert tokens[1, 1] == eos and tokens[1, 2] == np.argmax(table[eos]) != 0, \
        "an EOS inside the prompt must not stop the row"


def test_split_prompts_continues_a_decoder_only_prompt():
    vocab = 6
    table = np.random.default_rng(2).normal(size=(vocab, vocab)).astype(np.float32)
    prompts = np.array([[3, 1, 4, 0], [2, 5, 0, 0]], np.int32)
    lengths = np.array([3, 1], np.int32)
    start, prompt, prompt_lengths = decoding.split_prompts(prompts, lengths)
    tokens = np.asarray(decoding.greedy_search(markov_model(table), markov_cache(2), start, 5,
                                               prompt=prompt, prompt_lengths=prompt_lengths))
    np.testing.assert_array_equal(tokens[0, :2], [1, 4])
    assert tokens[0, 2] == np.argmax(table[4])
    assert tokens[1, 0] == np.argmax(table[2])


# ----------------------------------------------------------------------------------------------
# Logit filters
# ----------------------------------------------------------------------------------------------

def test_top_k_filter_keeps_exactly_the_k_largest():
    logits = jnp.asarray(np.random.default_rng(4).normal(size=(3, 5, 11)), jnp.float32)
    filtered = np.asarray(decoding.top_k_filter(logits, 4))
    kept = np.isfinite(filtered)
    np.testing.assert_array_equal(kept.sum(-1), 4)
    top4 = np.argsort(-np.asarray(logits), axis=-1)[..., :4]
    np.testing.assert_array_equal(np.take_along_axis(kept, top4, -1), True)
    np.testing.assert_array_equal(filtered[kept], np.asarray(logits)[kept])
    assert decoding.top_k_filter(logits, 0) is logits


@pytest.mark.parametrize("p, kept", [(1e-6, {2}), (0.5, {2}), (0.51, {2, 0}), (0.79, {2, 0}),
                                     (0.81, {2, 0, 3}), (1.0, {0, 1, 2, 3})])
def test_top_p_filter_keeps_the_smallest_nucleus(p, kept):
    probs = np.array([0.3, 0.05, 0.5, 0.15])  # sorted: 2 (0.5), 0 (0.3), 3 (0.15), 1 (0.05)
    filtered = np.asarray(decoding.top_p_filter(jnp.log(jnp.asarray(probs, jnp.float32)), p))
    assert set(np.flatnonzero(np.isfinite(filtered))) == kept


def test_top_p_filter_matches_numpy_on_random_rows():
    logits = np.random.default_rng(5).normal(size=(50, 9)).astype(np.float32) * 2
    for p in (0.3, 0.7, 0.95):
        filtered = np.asarray(decoding.top_p_filter(jnp.asarray(logits), jnp.float32(p)))
        for row, out in zip(logits, filtered):
            order = np.argsort(-row)
            mass = np.cumsum(softmax(row)[order])
            size = int(np.searchsorted(mass, p - 1e-6) + 1)  # first prefix whose mass reaches p
            assert set(np.flatnonzero(np.isfinite(out))) == set(order[:size])


# ----------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------

def sample_two_steps(logits_row: np.ndarray, samples: int, seed: int, **kw) -> np.ndarray:
    """Every state has the same next-token logits, so the two tokens are i.i.d. -> [samples, 2]."""
    vocab = logits_row.shape[0]
    table = np.tile(logits_row, (vocab, 1))
    tokens = jit_call(lambda c, s, r: decoding.sample(markov_model(table), c, s, 2, r, **kw),
                      markov_cache(samples), jnp.zeros((samples,), jnp.int32), jax.random.PRNGKey(seed))
    return np.asarray(tokens)


def first_token_frequencies(logits_row: np.ndarray, samples: int, seed: int, **kw) -> np.ndarray:
    return np.bincount(sample_two_steps(logits_row, samples, seed, **kw)[:, 0], minlength=len(logits_row)) / samples


def assert_frequencies(freq: np.ndarray, probs: np.ndarray, samples: int):
    tolerance = 4.5 * np.sqrt(probs * (1 - probs) / samples) + 1e-3
    assert np.all(np.abs(freq - probs) <= tolerance), (freq, probs)


LOGITS_ROW = np.array([1.0, 0.2, -0.5, 2.0, 0.0, -1.5, 1.4, 0.7], np.float32)
SAMPLES = 20000


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampling_frequencies_match_the_tempered_softmax(temperature):
    """Both steps follow softmax(logits / T), independently (each step draws fresh randomness)."""
    tokens = sample_two_steps(LOGITS_ROW, SAMPLES, seed=0, temperature=temperature)
    probs = softmax(LOGITS_ROW / temperature)
    for step in range(2):
        assert_frequencies(np.bincount(tokens[:, step], minlength=len(probs)) / SAMPLES, probs, SAMPLES)
    same = np.sum(probs ** 2)
    assert_frequencies(np.mean(tokens[:, 0] == tokens[:, 1]), same, SAMPLES)


def test_top_k_and_top_p_sampling_renormalise_over_the_kept_tokens():
    probs = softmax(LOGITS_ROW)
    top3 = np.argsort(-LOGITS_ROW)[:3]
    expected = np.zeros_like(probs)
    expected[top3] = probs[top3] / probs[top3].sum()
    assert_frequencies(first_token_frequencies(LOGITS_ROW, SAMPLES, seed=1, top_k=3), expected, SAMPLES)

    order = np.argsort(-LOGITS_ROW)
    nucleus = order[:int(np.searchsorted(np.cumsum(probs[order]), 0.8) + 1)]
    expected = np.zeros_like(probs)
    expected[nucleus] = probs[nucleus] / probs[nucleus].sum()
    assert_frequencies(first_token_frequencies(LOGITS_ROW, SAMPLES, seed=2, top_p=0.8), expected, SAMPLES)


@pytest.mark.parametrize("filter_kw", [{"top_k": 3}, {"top_p": 0.6}, {"top_k": 4, "top_p": 0.5}])
def test_every_sampled_token_lies_in_the_filtered_set(filter_kw):
    vocab, rows, max_length = 10, 400, 8
    table = np.random.default_rng(6).normal(size=(vocab, vocab)).astype(np.float32) * 1.5
    starts = jnp.asarray(np.arange(rows) % vocab, jnp.int32)
    tokens = np.asarray(jit_call(
        lambda c, s, r: decoding.sample(markov_model(table), c, s, max_length, r, **filter_kw),
        markov_cache(rows), starts, jax.random.PRNGKey(7)))
    allowed = np.isfinite(np.asarray(decoding.top_p_filter(decoding.top_k_filter(
        jnp.asarray(table), filter_kw.get("top_k", 0)), filter_kw.get("top_p", 1.0))))
    previous = np.concatenate([np.asarray(starts)[:, None], tokens[:, :-1]], axis=1)
    assert allowed[previous, tokens].all()
    assert len(np.unique(tokens[:, 0][np.asarray(starts) == 0])) > 1, "sampling should not collapse to argmax"


@pytest.mark.parametrize("temperature", [0.0, jnp.float32(0.0)])
def test_temperature_zero_is_greedy(temperature):
    model = HistoryModel(vocab=6, max_length=7, seed=8)
    starts = jnp.arange(6, dtype=jnp.int32)
    greedy = decoding.greedy_search(model, model.init_cache(6), starts, 7, eos_id=5)
    sampled = decoding.sample(model, model.init_cache(6), starts, 7, jax.random.PRNGKey(0),
                              temperature=temperature, top_k=3, eos_id=5)
    np.testing.assert_array_equal(np.asarray(sampled), np.asarray(greedy))


def test_sampling_is_a_function_of_the_rng_and_respects_prompts_and_eos():
    vocab, eos, max_length = 6, 5, 10
    table = np.random.default_rng(9).normal(size=(vocab, vocab)).astype(np.float32)
    prompt = jnp.asarray([[1, 2, 3]] * 64, jnp.int32)
    lengths = jnp.asarray(np.arange(64) % 4, jnp.int32)

    sampler = jax.jit(lambda rng: decoding.sample(
        markov_model(table), markov_cache(64), jnp.zeros((64,), jnp.int32), max_length, rng, eos_id=eos,
        prompt=prompt, prompt_lengths=lengths))

    def draw(seed):
        return np.asarray(sampler(jax.random.PRNGKey(seed)))
    first, again, other = draw(0), draw(0), draw(1)
    np.testing.assert_array_equal(first, again)
    assert (first != other).any()
    for row, n in zip(first, np.asarray(lengths)):
        np.testing.assert_array_equal(row[:n], [1, 2, 3][:n])
        generated = list(row[n:])
        if eos in generated:
            stop = generated.index(eos)
            assert not any(generated[stop + 1:]), "after EOS a row must emit pad 0"
    assert sum(eos in list(row) for row in first) > 10, "the table should make EOS common"


def test_bad_arguments_raise_user_errors():
    model = markov_model(np.zeros((3, 3), np.float32))
    with pytest.raises(ModelInputError, match="temperature"):
        decoding.sample(model, markov_cache(1), jnp.zeros((1,), jnp.int32), 3, jax.random.PRNGKey(0),
                        temperature=-1.0)
    with pytest.raises(ModelInputError, match="max_length"):
        decoding.greedy_search(model, markov_cache(1), jnp.zeros((1,), jnp.int32), 2,
                               prompt=jnp.zeros((1, 3), jnp.int32))
    with pytest.raises(ModelInputError, match="leading axis"):
        decoding.beam_search(model, {"calls": jnp.zeros((5,), jnp.int32)}, jnp.zeros((2,), jnp.int32), 3, 2)
