"""T5 model (models/t5.py) and its layers: incremental decoding, packing, relative position buckets,
causality, dropout and mixed precision."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from models import layers
from models.t5 import T5, T5Config, init_cache, make_tokens_to_logits
from pretrain.training.train_state import unbox
from tests.helpers.random_weights import t5_random_params

VERSIONS = {  # small T5 1.0 and 1.1 models; head_dim * heads != d_model on purpose (as in T5-3B / 11B)
    "1.0": T5Config(vocab_size=96, d_model=48, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
                    num_decoder_layers=2, feed_forward="relu", tie_word_embeddings=True),
    "1.1": T5Config(vocab_size=96, d_model=48, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
                    num_decoder_layers=3, feed_forward="gated-gelu", tie_word_embeddings=False),
}


@functools.lru_cache(maxsize=None)
def _forward(config: T5Config):
    return jax.jit(lambda params, enc, dec, kw: T5(config).apply({"params": params}, enc, dec, **kw)["logits"])


@functools.lru_cache(maxsize=None)
def _encode(config: T5Config):
    return jax.jit(lambda params, enc: T5(config).apply({"params": params}, enc, method=T5.encode))


@functools.lru_cache(maxsize=None)
def _decode_step(config: T5Config):
    def step(params, encoded, encoder_mask, token_ids, cache):
        return make_tokens_to_logits(T5(config), params, encoded, encoder_mask)(token_ids, cache, 0)
    return jax.jit(step)


def random_ids(rng: np.random.Generator, shape, vocab: int = 96) -> np.ndarray:
    return rng.integers(1, vocab, shape).astype(np.int32)  # 0 is padding


def teacher_forced(config, params, encoder_ids, decoder_ids, **kw) -> np.ndarray:
    return np.asarray(_forward(config)(params, jnp.asarray(encoder_ids), jnp.asarray(decoder_ids),
                                       {k: jnp.asarray(v) for k, v in kw.items()}))


def decode_incrementally(config, params, encoder_ids, decoder_ids, cache=None, start=0):
    """Feeds decoder_ids[:, start:] one token at a time -> (logits [B, L - start, V], cache)."""
    encoded = _encode(config)(params, jnp.asarray(encoder_ids))
    if cache is None:
        cache = init_cache(T5(config), params, batch_size=decoder_ids.shape[0], max_decode_len=decoder_ids.shape[1])
    steps = []
    for t in range(start, decoder_ids.shape[1]):
        logits, cache = _decode_step(config)(params, encoded, jnp.asarray(encoder_ids != 0),
                                             jnp.asarray(decoder_ids[:, t:t + 1]), cache)
        steps.append(np.asarray(logits))
    return np.stack(steps, axis=1), cache


@pytest.mark.parametrize("version", list(VERSIONS))
def test_incremental_decoding_matches_the_teacher_forced_pass(version):
    config, rng = VERSIONS[version], np.random.default_rng(0)
    params = t5_random_params(config)
    encoder_ids = random_ids(rng, (3, 10))
    encoder_ids[1, 6:] = 0  # a padded row
    decoder_ids = random_ids(rng, (3, 7))
    decoder_ids[:, 0] = 0
    expected = teacher_forced(config, params, encoder_ids, decoder_ids)
    cache = init_cache(T5(config), params, batch_size=3, max_decode_len=7)
    assert all(leaf.shape[0] == 3 for leaf in jax.tree.leaves(cache))  # beam search gathers along axis 0
    incremental, _ = decode_incrementally(config, params, encoder_ids, decoder_ids)
    assert np.abs(expected).max() > 1.0
    assert np.abs(incremental - expected).max() < 1e-5


def test_reordering_the_cache_rows_reorders_the_decoding():
    """What beam search does: gather every cache leaf along its batch axis, then continue."""
    config, rng = VERSIONS["1.1"], np.random.default_rng(1)
    params = t5_random_params(config)
    encoder_ids, decoder_ids = random_ids(rng, (3, 10)), random_ids(rng, (3, 7))
    order = np.array([2, 2, 0])
    expected = teacher_forced(config, params, encoder_ids[order], decoder_ids[order])
    cache = init_cache(T5(config), params, batch_size=3, max_decode_len=7)
    _, cache = decode_incrementally(config, params, encoder_ids, decoder_ids[:, :2], cache)
    cache = jax.tree.map(lambda x: x[order], cache)
    continued, _ = decode_incrementally(config, params, encoder_ids[order], decoder_ids[order], cache, start=2)
    np.testing.assert_allclose(continued, expected[:, 2:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("version", list(VERSIONS))
def test_packed_examples_compute_what_they_compute_alone(version):
    config, rng = VERSIONS[version], np.random.default_rng(2)
    params = t5_random_params(config)
    examples = [(random_ids(rng, (1, 5)), random_ids(rng, (1, 4))), (random_ids(rng, (1, 7)), random_ids(rng, (1, 3)))]
    for _, decoder in examples:
        decoder[0, 0] = 0  # each packed example's decoder input starts with the start token
    row = {key: np.zeros((1, 16), np.int32) for key in
           ("encoder_input_ids", "encoder_segment_ids", "encoder_positions")}
    row.update({key: np.zeros((1, 9), np.int32) for key in
                ("decoder_input_ids", "decoder_segment_ids", "decoder_positions")})
    enc_at = dec_at = 0
    for segment, (encoder, decoder) in enumerate(examples, start=1):
        for side, ids, at in (("encoder", encoder, enc_at), ("decoder", decoder, dec_at)):
            n = ids.shape[1]
            row[f"{side}_input_ids"][0, at:at + n] = ids[0]
            row[f"{side}_segment_ids"][0, at:at + n] = segment
            row[f"{side}_positions"][0, at:at + n] = np.arange(n)
        enc_at, dec_at = enc_at + encoder.shape[1], dec_at + decoder.shape[1]
    kw = {k: v for k, v in row.items() if not k.endswith("input_ids")}
    packed = teacher_forced(config, params, row["encoder_input_ids"], row["decoder_input_ids"], **kw)
    dec_at = 0
    for encoder, decoder in examples:  # alone = one example per row, right-padded to the same shape (one compile)
        alone_encoder, alone_decoder = np.zeros((1, 16), np.int32), np.zeros((1, 9), np.int32)
        alone_encoder[:, :encoder.shape[1]], alone_decoder[:, :decoder.shape[1]] = encoder, decoder
        alone = teacher_forced(config, params, alone_encoder, alone_decoder)[:, :decoder.shape[1]]
        np.testing.assert_allclose(packed[:, dec_at:dec_at + decoder.shape[1]], alone, atol=1e-5, rtol=0)
        dec_at += decoder.shape[1]
    # The check can fail: without segment ids the two examples see each other.
    unpacked = teacher_forced(config, params, row["encoder_input_ids"], row["decoder_input_ids"])
    assert np.abs(unpacked[:, :4] - packed[:, :4]).max() > 1e-3
    # Segment ids alone suffice (what objectives/denoising.py feeds): within a segment, row offsets
    # give the relative bias the same distances as restarted positions.
    segments_only = {k: v for k, v in kw.items() if k.endswith("segment_ids")}
    np.testing.assert_allclose(teacher_forced(config, params, row["encoder_input_ids"], row["decoder_input_ids"],
                                              **segments_only), packed, atol=1e-5, rtol=0)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 40), (8, 20)])
def test_relative_position_buckets_match_transformers(bidirectional, num_buckets, max_distance):
    relative = np.arange(-600, 601)[:, None] + np.arange(-3, 4)[None]  # every distance, both directions
    expected = T5Attention._relative_position_bucket(torch.tensor(relative), bidirectional, num_buckets, max_distance)
    ours = layers.relative_position_bucket(jnp.asarray(relative), bidirectional, num_buckets, max_distance)
    np.testing.assert_array_equal(np.asarray(ours), expected.numpy())
    assert len(np.unique(np.asarray(ours))) >= num_buckets - 1  # the grid reaches (nearly) every bucket


def test_relative_position_bias_uses_positions_not_indices():
    bias = layers.RelativePositionBias(num_heads=2, bidirectional=True)
    table_params = bias.init(jax.random.key(0), jnp.zeros((1, 3), jnp.int32), jnp.zeros((1, 3), jnp.int32))
    positions = jnp.array([[0, 1, 2, 0, 1]])  # two packed examples: same bias pattern within each
    out = np.asarray(bias.apply(table_params, positions, positions))          # [1, H, 5, 5]
    np.testing.assert_array_equal(out[:, :, 3:, 3:], out[:, :, :2, :2])
    table = np.asarray(unbox(table_params)["params"]["embedding"])          # [buckets, H]
    np.testing.assert_array_equal(out[0, :, 0, 2], table[16 + 2])            # key 2 after the query: bucket 16 + 2


def test_relative_position_bias_gradient_is_a_contraction_not_a_scatter():
    bias = layers.RelativePositionBias(num_heads=4, bidirectional=True)
    positions = jnp.arange(64)[None]
    params = bias.init(jax.random.key(0), positions, positions)

    def loss(p):
        return jnp.sum(bias.apply(p, positions, positions) ** 2)
    gradient = str(jax.make_jaxpr(jax.grad(loss))(params))
    assert "scatter" not in gradient and "dot_general" in gradient


@pytest.mark.parametrize("version", list(VERSIONS))
def test_decoder_is_causal(version):
    config, rng = VERSIONS[version], np.random.default_rng(3)
    params = t5_random_params(config)
    encoder_ids, decoder_ids = random_ids(rng, (3, 10)), random_ids(rng, (3, 7))
    before = teacher_forced(config, params, encoder_ids, decoder_ids)
    changed = decoder_ids.copy()
    changed[:, 5] = (changed[:, 5] % 95) + 1
    after = teacher_forced(config, params, encoder_ids, changed)
    np.testing.assert_array_equal(after[:, :5], before[:, :5])
    assert np.abs(after[:, 5:] - before[:, 5:]).max(axis=-1).min() > 1e-3  # the changed position and later move


def test_dropout_is_active_only_in_training():
    config, rng = VERSIONS["1.1"], np.random.default_rng(5)
    params = t5_random_params(config)
    encoder_ids, decoder_ids = random_ids(rng, (3, 10)), random_ids(rng, (3, 7))
    train = jax.jit(lambda p, key: T5(config).apply({"params": p}, encoder_ids, decoder_ids, deterministic=False,
                                                    rngs={"dropout": key})["logits"])
    # rbg keys compile ~3x faster than threefry on CPU; dropout does not care which generator it gets
    first, second = (np.asarray(train(params, jax.random.key(seed, impl="rbg"))) for seed in (0, 1))
    evaluation = teacher_forced(config, params, encoder_ids, decoder_ids)
    assert np.abs(first - second).max() > 1e-2 and np.abs(first - evaluation).max() > 1e-2


def test_bfloat16_compute_keeps_float32_params_and_logits():
    config = VERSIONS["1.1"]
    bf16 = dataclasses.replace(config, dtype="bfloat16")
    rng = np.random.default_rng(6)
    params = t5_random_params(bf16)
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    encoder_ids, decoder_ids = random_ids(rng, (3, 10)), random_ids(rng, (3, 7))
    reference = teacher_forced(config, params, encoder_ids, decoder_ids)
    mixed = teacher_forced(bf16, params, encoder_ids, decoder_ids)
    assert mixed.dtype == np.float32
    assert np.abs(mixed - reference).max() < 0.05 * np.abs(reference).max()


def test_rmsnorm_and_gated_mlp_follow_their_definitions():
    x = jnp.asarray(np.random.default_rng(7).standard_normal((2, 3, 8)), jnp.float32)
    norm = layers.RMSNorm()
    y = norm.apply(norm.init(jax.random.key(0), x), x)
    np.testing.assert_allclose(np.asarray(y), x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + 1e-6), rtol=1e-5)
    mlp = layers.MLP(16, layers.tanh_gelu, use_bias=False, gated=True)
    p = unbox(mlp.init(jax.random.key(0), x))["params"]
    expected = (layers.tanh_gelu(x @ p["intermediate"]["kernel"]) * (x @ p["intermediate_linear"]["kernel"])
                ) @ p["output"]["kernel"]
    np.testing.assert_allclose(np.asarray(mlp.apply({"params": p}, x)), np.asarray(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # compiling the initialiser takes ~15 s on a loaded CPU
def test_initialiser_follows_mesh_tensorflow_t5():
    """N(0, factor^2 / fan_in) per Mesh TF / Hugging Face's T5._init_weights; the query also / sqrt(head_dim)."""
    config = T5Config(vocab_size=256, d_model=64, num_heads=4, head_dim=32, d_ff=256, num_encoder_layers=1,
                      num_decoder_layers=1, feed_forward="gated-gelu", tie_word_embeddings=False,
                      initializer_factor=2.0)
    ids = jnp.ones((1, 4), jnp.int32)
    params = unbox(jax.jit(T5(config).init)(jax.random.key(0), ids, ids)["params"])
    attention = params["decoder"]["layer_0"]["self_attention"]
    expected = {  # leaf -> std
        "embedding": (params["shared"]["embedding"], 2.0),
        "query": (attention["query"]["kernel"], 2.0 / np.sqrt(64 * 32)),
        "key": (attention["key"]["kernel"], 2.0 / 8),
        "out": (attention["out"]["kernel"], 2.0 / np.sqrt(4 * 32)),
        "mlp output": (params["encoder"]["layer_0"]["mlp"]["output"]["kernel"], 2.0 / 16),
        "lm_head": (params["lm_head"]["kernel"], 2.0 / 8),
        "relative bias": (params["encoder"]["relative_position_bias"]["embedding"], 2.0 / 8),
    }
    for name, (leaf, std) in expected.items():
        leaf = np.asarray(leaf)
        tolerance = 4 * std / np.sqrt(2 * leaf.size)  # 4 standard errors of a sample std
        assert abs(leaf.std() - std) < tolerance, name
    assert np.all(np.asarray(params["encoder"]["final_norm"]["scale"]) == 1.0)
