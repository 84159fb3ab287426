"""GPT model (models/gpt.py): causality, packed documents, the prefix-LM mask, incremental decoding,
logical axes and user errors. Parity with transformers' GPT-2 is in tests/models/test_hf_gpt2.py."""
from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import decoding
from models.gpt import GPT, GPTConfig, attention_mask, init_cache, make_tokens_to_logits
from pretrain.training.train_state import unbox
from tests.helpers.random_weights import gpt_random_params, gpt_shapes

CONFIG = GPTConfig(vocab_size=96, n_positions=32, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                   dropout_rate=0.0, attention_dropout_rate=0.0)
TOLERANCE = 1e-5


@functools.lru_cache(maxsize=None)
def _forward(config: GPTConfig):
    return jax.jit(lambda params, ids, kw: GPT(config).apply({"params": params}, ids, **kw)["logits"])


def logits(params, ids, **kw) -> np.ndarray:
    return np.asarray(_forward(CONFIG)(params, jnp.asarray(ids), {k: jnp.asarray(v) for k, v in kw.items()}))


def random_ids(shape, seed=0):
    return np.random.default_rng(seed).integers(0, CONFIG.vocab_size, shape).astype(np.int32)


@pytest.fixture(scope="module")
def params():
    return gpt_random_params(CONFIG)


def test_a_future_token_never_changes_earlier_logits(params):
    ids = random_ids((2, 12))
    changed = ids.copy()
    changed[:, 7] = (changed[:, 7] + 1) % CONFIG.vocab_size
    before, after = logits(params, ids), logits(params, changed)
    np.testing.assert_allclose(after[:, :7], before[:, :7], atol=TOLERANCE, rtol=0)
    assert np.abs(after[:, 7:] - before[:, 7:]).max(axis=-1).min() > 1e-3  # and every later position sees it


def test_each_packed_document_equals_the_document_alone(params):
    first, second = random_ids((1, 5), seed=1), random_ids((1, 4), seed=2)
    length = 12  # 5 + 4 tokens, then 3 of padding
    packed = np.concatenate([first, second, random_ids((1, 3), seed=3)], axis=1)  # padding ids are arbitrary
    segments = np.array([[1] * 5 + [2] * 4 + [0] * 3], np.int32)
    positions = np.array([list(range(5)) + list(range(4)) + [0] * 3], np.int32)
    out = logits(params, packed, segment_ids=segments, positions=positions)
    np.testing.assert_allclose(out[:, :5], logits(params, first), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(out[:, 5:9], logits(params, second), atol=TOLERANCE, rtol=0)
    assert out.shape == (1, length, CONFIG.vocab_size) and np.all(np.isfinite(out))  # padding rows stay finite


def test_prefix_tokens_see_each_other_and_the_rest_stays_causal(params):
    ids = random_ids((2, 10))
    prefix = np.array([4, 6], np.int32)
    out = logits(params, ids, prefix_lengths=prefix)
    for row, n in enumerate(prefix):
        in_prefix, after_prefix = ids.copy(), ids.copy()
        in_prefix[row, n - 1] = (in_prefix[row, n - 1] + 1) % CONFIG.vocab_size   # the prefix's last token
        after_prefix[row, n + 1] = (after_prefix[row, n + 1] + 1) % CONFIG.vocab_size
        seen = logits(params, in_prefix, prefix_lengths=prefix)[row]
        assert np.abs(seen[: n - 1] - out[row, : n - 1]).max(axis=-1).min() > 1e-3  # earlier prefix tokens see it
        unseen = logits(params, after_prefix, prefix_lengths=prefix)[row]
        np.testing.assert_allclose(unseen[: n + 1], out[row, : n + 1], atol=TOLERANCE, rtol=0)  # causal after it
    mask = np.arange(10)[None] < prefix[:, None]
    np.testing.assert_allclose(logits(params, ids, bidirectional_mask=mask), out, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(logits(params, ids, prefix_lengths=np.zeros(2, np.int32)), logits(params, ids),
                               atol=TOLERANCE, rtol=0)


def test_attention_mask_is_the_definition():
    """mask[b, q, k] = same nonzero segment and (k <= q or both inside the prefix), pair by pair."""
    rng = np.random.default_rng(0)
    segments = np.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 0, 0]], np.int32)
    bidirectional = rng.random(segments.shape) < 0.5
    mask = np.asarray(attention_mask(8, jnp.asarray(segments), bidirectional_mask=jnp.asarray(bidirectional)))
    for b in range(2):
        for q in range(8):
            for k in range(8):
                allowed = segments[b, q] != 0 and segments[b, q] == segments[b, k] and (
                    k <= q or (bidirectional[b, q] and bidirectional[b, k]))
                assert mask[b, 0, q, k] == allowed, (b, q, k)


def test_cached_decoding_equals_the_full_pass(params):
    ids = random_ids((3, 9), seed=4)
    model = GPT(CONFIG)
    step = jax.jit(make_tokens_to_logits(model, params))
    cache = init_cache(model, params, 3, 16)
    assert all(leaf.shape[0] == 3 for leaf in jax.tree.leaves(cache))  # beam search gathers along axis 0
    cached = []
    for i in range(ids.shape[1]):
        out, cache = step(jnp.asarray(ids[:, i:i + 1]), cache, i)
        cached.append(np.asarray(out))
    np.testing.assert_allclose(np.stack(cached, axis=1), logits(params, ids), atol=TOLERANCE, rtol=0)


def test_greedy_search_continues_prompts_of_different_lengths(params):
    """decoding.greedy_search over the cache gives, for each row, the argmax continuation of the full pass."""
    prompts, lengths, new_tokens = random_ids((2, 5), seed=5), np.array([5, 2]), 4
    model = GPT(CONFIG)
    start, prompt, prompt_lengths = decoding.split_prompts(prompts, lengths)
    total = prompts.shape[1] - 1 + new_tokens
    cache = init_cache(model, params, 2, total)
    tokens = np.asarray(decoding.greedy_search(make_tokens_to_logits(model, params), cache, start, total,
                                               prompt=prompt, prompt_lengths=prompt_lengths))
    for row, n in enumerate(lengths):
        sequence = list(prompts[row, :n])
        for _ in range(new_tokens):
            sequence.append(int(logits(params, np.array([sequence], np.int32))[0, -1].argmax()))
        np.testing.assert_array_equal(tokens[row, : n - 1 + new_tokens], sequence[1:])


def test_every_weight_has_logical_axes_and_the_output_is_tied():
    boxed = gpt_shapes(CONFIG)
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert leaves and all(isinstance(leaf, nn.Partitioned) and len(leaf.names) == leaf.value.ndim for leaf in leaves)
    flat = {"/".join(k.key for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(unbox(boxed))}
    assert flat["token_embedding/embedding"].shape == (CONFIG.vocab_size, CONFIG.d_model)
    assert [name for name, leaf in flat.items() if CONFIG.vocab_size in leaf.shape] == ["token_embedding/embedding"]


def test_initialiser_scales_the_residual_projections():
    """GPT-2 (Radford et al. 2019, Section 2.3): N(0, 0.02), output projections N(0, 0.02 / sqrt(2 * layers))."""
    config = GPTConfig(vocab_size=256, n_positions=16, d_model=64, num_layers=8, num_heads=4, d_ff=256)
    params = unbox(jax.jit(GPT(config).init)(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"])
    np.testing.assert_allclose(np.std(params["token_embedding"]["embedding"]), 0.02, rtol=0.05)
    np.testing.assert_allclose(np.std(params["layer_0"]["mlp"]["intermediate"]["kernel"]), 0.02, rtol=0.05)
    np.testing.assert_allclose(np.std(params["layer_0"]["mlp"]["output"]["kernel"]), 0.02 / 4, rtol=0.05)
    np.testing.assert_allclose(np.std(params["layer_0"]["attention"]["out"]["kernel"]), 0.02 / 4, rtol=0.1)


def test_dropout_is_active_only_when_not_deterministic(params):
    config = dataclasses.replace(CONFIG, dropout_rate=0.2, attention_dropout_rate=0.2)
    ids = jnp.asarray(random_ids((2, 6)))
    apply = jax.jit(lambda p, rng, det: GPT(config).apply({"params": p}, ids, deterministic=det,
                                                          rngs={"dropout": rng})["logits"], static_argnums=2)
    eval_a, eval_b = apply(params, jax.random.key(0), True), apply(params, jax.random.key(1), True)
    np.testing.assert_array_equal(eval_a, eval_b)
    assert np.abs(apply(params, jax.random.key(0), False) - apply(params, jax.random.key(1), False)).max() > 1e-3


def test_user_errors_name_the_fix(params):
    model = GPT(CONFIG)
    with pytest.raises(ValueError, match="not both"):
        attention_mask(4, prefix_lengths=jnp.ones(1, jnp.int32), bidirectional_mask=jnp.ones((1, 4), bool))
    with pytest.raises(ValueError, match="n_positions"):
        init_cache(model, params, 1, CONFIG.n_positions + 1)
    with pytest.raises(ValueError, match="segment ids"):
        model.apply({"params": params}, jnp.ones((1, 1), jnp.int32), segment_ids=jnp.ones((1, 1), jnp.int32),
                    decode=True, mutable=["cache"])
    with pytest.raises(ValueError, match="multiple of num_heads"):
        GPTConfig(d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="crop or split"):  # rather than NaN from positions past the table
        model.apply({"params": params}, jnp.ones((1, CONFIG.n_positions + 1), jnp.int32))


def test_bias_free_variant_drops_every_bias_and_equals_zero_biases():
    """use_bias=False (nanoGPT's bias=False) is the biased model with every bias at zero; GPT-2's export refuses it."""
    from models.convert.hf_gpt2 import gpt_config_to_hf
    config = dataclasses.replace(CONFIG, use_bias=False)
    free = gpt_random_params(config, seed=3)
    names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(free)]
    assert names and not any("bias" in n for n in names)
    biased = gpt_random_params(CONFIG, seed=4)
    zeroed = jax.tree_util.tree_map_with_path(
        lambda p, v: np.zeros_like(v) if "bias" in jax.tree_util.keystr(p) else v, biased)
    for path, leaf in jax.tree_util.tree_leaves_with_path(free):  # same weights where both have them
        node = zeroed
        for key in path:
            node = node[key.key]
        node[...] = leaf
    ids = random_ids((2, 12), seed=5)
    ours = np.asarray(GPT(config).apply({"params": free}, jnp.asarray(ids))["logits"])
    np.testing.assert_allclose(ours, logits(zeroed, ids), atol=TOLERANCE)
    with pytest.raises(ValueError, match="use_bias=True"):
        gpt_config_to_hf(config)
