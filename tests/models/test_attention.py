"""Every attention implementation that runs on this machine against the reference einsum, with the masks
the families use (padding, causal, packed segments, prefix LM) and T5's relative-position bias, per dtype;
then whole models built with each implementation."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import attention, gpt, layers
from models.bert import BertConfig, BertForPreTraining
from models.gpt import GPT, GPTConfig
from models.t5 import T5, T5Config
from tests.helpers.attention_cases import (B, CASES, H, K, L, PB, PH, PK, PL, RUNNABLE, TOLERANCE, attending, inputs,
                                           layouts)

# Largest |fused - reference| allowed, relative to the output's scale (values are O(1) here).
def masks(length: int = L, batch: int = B) -> dict[str, jax.Array | None]:
    """The families' masks for `length` tokens, dense."""
    rng = np.random.default_rng(0)
    valid, segments = layouts(length, batch)
    return {
        "none": None,
        "padding": layers.padding_mask(valid, valid),
        "causal": layers.causal_mask(length),
        "packed causal": gpt.attention_mask(length, segment_ids=segments),
        "packed bidirectional": layers.segment_mask(segments, segments),
        "prefix LM": gpt.attention_mask(length, prefix_lengths=jnp.asarray(rng.integers(1, length, batch))),
    }


def segment_masks(length: int = L, batch: int = B) -> dict[str, attention.SegmentMask]:
    """The same masks kept as segment ids (what BERT, GPT without a prefix and T5 build), and T5's packed
    cross-attention mask, where padding queries have no key at all (the keys here are all real)."""
    valid, segments = layouts(length, batch)
    ones = jnp.ones((1, length), jnp.int32)  # [1, L]: broadcast over the batch
    unpadded = jnp.where(segments == 0, segments.max(axis=1, keepdims=True), segments)  # keys: no padding
    return {
        "padding": attention.SegmentMask(valid.astype(jnp.int32), valid.astype(jnp.int32)),
        "causal": attention.SegmentMask(causal=True),
        "causal, segment ids all one": attention.SegmentMask(ones, ones, causal=True),
        "packed causal": attention.SegmentMask(segments, segments, causal=True),
        "packed bidirectional": attention.SegmentMask(segments, segments),
        "cross, padding queries see no key": attention.SegmentMask(segments, unpadded),
    }


def relative_bias(length: int, heads: int = H) -> jax.Array:
    """T5's shared relative-position bias, [1, H, L, L]."""
    positions = jnp.arange(length)[None]
    module = layers.RelativePositionBias(heads)
    return module.apply(module.init(jax.random.key(2), positions, positions), positions, positions)


@pytest.mark.parametrize("implementation, dtype", CASES)
@pytest.mark.parametrize("mask_name", list(masks()))
@pytest.mark.parametrize("with_bias", [False, True])
def test_each_implementation_matches_the_reference(implementation, dtype, mask_name, with_bias):
    q, k, v = inputs(dtype)
    mask = masks()[mask_name]
    bias = relative_bias(L) if with_bias else None
    reference = attention.dot_product_attention(q, k, v, mask, bias, scale=K ** -0.5, implementation="einsum")
    fused = attention.dot_product_attention(q, k, v, mask, bias, scale=K ** -0.5, implementation=implementation)
    assert fused.shape == reference.shape == (B, L, H, K) and fused.dtype == q.dtype
    attends = attending(mask, B, L)
    difference = np.abs(np.asarray(fused, np.float32) - np.asarray(reference, np.float32))[attends]
    assert difference.max() <= TOLERANCE[dtype], (implementation, dtype, mask_name, difference.max())
    assert np.isfinite(np.asarray(fused, np.float32)).all()


@pytest.mark.parametrize("mask_name", ["padding", "causal", "causal, segment ids all one", "packed causal",
                                       "packed bidirectional"])
def test_segment_masks_are_the_dense_masks(mask_name):
    """Kept as parts, each mask means what the dense builders of layers.py and gpt.py build."""
    dense = segment_masks()[mask_name].dense(L, L)
    want = masks()[mask_name.split(",")[0]]
    assert dense.dtype == jnp.bool_
    np.testing.assert_array_equal(np.broadcast_to(dense, (B, 1, L, L)), np.broadcast_to(want, (B, 1, L, L)))


@pytest.mark.parametrize("implementation, dtype", [("einsum", "float32")] + CASES)
@pytest.mark.parametrize("mask_name", list(segment_masks()))
def test_segment_mask_through_every_implementation(implementation, dtype, mask_name):
    """A SegmentMask (XLA and cuDNN: its causal part as is_causal) gives what its dense mask gives the
    reference, T5's bias included."""
    q, k, v = inputs(dtype)
    mask = segment_masks()[mask_name]
    dense = mask.dense(L, L)
    reference = attention.dot_product_attention(q, k, v, dense, relative_bias(L), scale=K ** -0.5,
                                                implementation="einsum")
    with_parts = attention.dot_product_attention(q, k, v, mask, relative_bias(L), scale=K ** -0.5,
                                                 implementation=implementation)
    difference = np.abs(np.asarray(with_parts, np.float32) - np.asarray(reference, np.float32))[attending(dense, B, L)]
    assert difference.max() <= TOLERANCE[dtype], (implementation, mask_name, difference.max())


def test_the_tolerances_can_fail():
    """A masked-out key that leaked in would exceed the float32 tolerance by orders of magnitude."""
    q, k, v = inputs("float32")
    mask = masks()["causal"]
    reference = attention.dot_product_attention(q, k, v, mask, None, scale=K ** -0.5, implementation="einsum")
    unmasked = attention.dot_product_attention(q, k, v, None, None, scale=K ** -0.5, implementation="xla")
    assert np.abs(np.asarray(unmasked - reference)).max() > 100 * TOLERANCE["float32"]


def test_auto_picks_per_platform_and_dropout():
    assert attention.choose("auto", jnp.float32, 64, dropout_active=False) == "xla"  # cuDNN: half precision only
    assert attention.choose("auto", jnp.bfloat16, 64, dropout_active=False) == (
        "cudnn" if jax.default_backend() == "gpu" else "xla")
    assert attention.choose("auto", jnp.bfloat16, 64, dropout_active=True) == "einsum"
    assert attention.choose("einsum", jnp.bfloat16, 64, dropout_active=False) == "einsum"
    with pytest.raises(ValueError, match="attention_dropout_rate=0"):
        attention.choose("xla", jnp.float32, 64, dropout_active=True)
    with pytest.raises(ValueError, match="not one of auto, einsum, xla, cudnn, pallas, splash"):
        attention.choose("flash", jnp.float32, 64, dropout_active=False)
    with pytest.raises(ValueError, match="tiles queries and keys by 128: lengths 24 x 24"):
        attention.choose("pallas", jnp.float32, 64, False, q_len=24, kv_len=24)
    with pytest.raises(ValueError, match="attention_dropout_rate=0"):
        attention.choose("pallas", jnp.float32, 64, True, q_len=128, kv_len=128)
    assert attention.choose("pallas", jnp.float32, 64, False, q_len=256, kv_len=128) == "pallas"
    on_tpu = jax.default_backend() == "tpu"
    assert attention.choose("auto", jnp.float32, 64, False, q_len=128, kv_len=512) == ("pallas" if on_tpu else "xla")
    assert attention.choose("auto", jnp.float32, 64, False, 128, 512, mask_in_parts=True) == (
        "splash" if on_tpu else "xla")
    with pytest.raises(ValueError, match="attention='splash' takes masks of segments, causality and a window only"):
        attention.choose("splash", jnp.float32, 64, False, q_len=128, kv_len=128)
    assert attention.choose("auto", jnp.float32, 64, False, q_len=114, kv_len=512) == "xla"  # T5's targets

# Pallas' TPU kernel, run by its TPU interpreter on this CPU (tests/helpers/attention_cases.py: PB, PL, PH, PK).
def _pallas_case(dtype, mask_name, with_bias, parts=False):
    q, k, v = (jax.random.normal(key, (PB, PL, PH, PK), dtype) for key in jax.random.split(jax.random.key(5), 3))
    mask = (segment_masks if parts else masks)(PL, PB)[mask_name]
    return q, k, v, mask, relative_bias(PL, PH) if with_bias else None


# dense masks enter the kernel as its additive input; SegmentMasks ("parts") as its segment ids and causal flag
PALLAS_CASES = ([("float32", name, False) for name in masks()] + [("bfloat16", "packed causal", False)]
                + [("float32", name, True) for name in segment_masks()] + [("bfloat16", "packed causal", True)])


@pytest.mark.parametrize("dtype, mask_name, parts", PALLAS_CASES)
def test_pallas_kernel_matches_the_reference(dtype, mask_name, parts):
    from tests.helpers.pallas_interpret import tpu_interpret
    q, k, v, mask, bias = _pallas_case(dtype, mask_name, with_bias=mask_name != "none", parts=parts)
    reference = attention.dot_product_attention(q, k, v, mask, bias, scale=PK ** -0.5, implementation="einsum")
    with tpu_interpret():
        kernel = attention.dot_product_attention(q, k, v, mask, bias, scale=PK ** -0.5, implementation="pallas")
    assert kernel.shape == reference.shape and kernel.dtype == q.dtype
    attends = attending(attention.dense_mask(mask, PL, PL), PB, PL)
    difference = np.abs(np.asarray(kernel, np.float32) - np.asarray(reference, np.float32))[attends]
    assert difference.max() <= TOLERANCE[dtype], (mask_name, difference.max())


@pytest.mark.parametrize("mask_name, parts", [("packed causal", False), ("packed causal", True),
                                              ("cross, padding queries see no key", True)])
def test_pallas_gradients_match_the_reference_bias_included(mask_name, parts):
    """The kernel's backward pass, the relative-position bias's gradient (T5 learns it) among them; finite
    where a padding query has no key to attend to."""
    from tests.helpers.pallas_interpret import tpu_interpret
    q, k, v, mask, bias = _pallas_case("float32", mask_name, with_bias=True, parts=parts)
    # padding queries' outputs are left out of the loss
    keep = jnp.asarray(attending(attention.dense_mask(mask, PL, PL), PB, PL))[:, :, None, None]

    def loss(implementation, q, k, v, bias):
        out = attention.dot_product_attention(q, k, v, mask, bias, scale=PK ** -0.5, implementation=implementation)
        return jnp.sum(jnp.where(keep, out, 0.0) * jnp.cos(jnp.arange(PK)))

    reference = jax.grad(functools.partial(loss, "einsum"), argnums=(0, 1, 2, 3))(q, k, v, bias)
    with tpu_interpret():
        kernel = jax.grad(functools.partial(loss, "pallas"), argnums=(0, 1, 2, 3))(q, k, v, bias)
    for name, want, got in zip("q k v bias".split(), reference, kernel):
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5, err_msg=name)
    assert float(jnp.abs(reference[3]).max()) > 1e-3  # the bias's gradient is not trivially zero


def _bert(attention_name):
    config = BertConfig(vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                        max_position_embeddings=32, attention=attention_name)
    ids = jax.random.randint(jax.random.key(3), (2, 16), 1, 101)
    mask = (jnp.arange(16)[None] < jnp.array([[16], [9]])).astype(jnp.int32)
    args = (ids, jnp.zeros_like(ids), mask, jnp.array([[1, 2], [3, 4]]))
    return BertForPreTraining(config), args


def _gpt(attention_name):
    config = GPTConfig(vocab_size=101, n_positions=32, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                       attention=attention_name)
    ids = jax.random.randint(jax.random.key(3), (2, 16), 1, 101)
    segments = jnp.array([[1] * 9 + [2] * 7, [1] * 12 + [0] * 4])
    return GPT(config), (ids, segments)


def _t5(attention_name):
    config = T5Config(vocab_size=101, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
                      num_decoder_layers=2, attention=attention_name)
    ids = jax.random.randint(jax.random.key(3), (2, 16), 1, 101).at[1, 10:].set(0)
    return T5(config), (ids, jax.random.randint(jax.random.key(4), (2, 8), 1, 101))


@pytest.mark.parametrize("build", [_bert, _gpt, _t5], ids=["bert", "gpt", "t5"])
def test_whole_models_agree_across_implementations(build):
    reference_model, args = build("einsum")
    params = jax.jit(reference_model.init)(jax.random.key(0), *args)
    reference = jax.jit(reference_model.apply)(params, *args)
    for name in RUNNABLE:
        model, _ = build(name)
        outputs = jax.jit(model.apply)(params, *args)  # the same parameter tree: the implementation holds no weights
        for key in reference:
            np.testing.assert_allclose(outputs[key], reference[key], atol=2e-5, rtol=2e-5, err_msg=f"{name} {key}")


@pytest.mark.parametrize("platform, expected", [("gpu", "cudnn"), ("tpu", "pallas")])  # splash: test_attention_splash
@pytest.mark.parametrize("config_arg, fused", [
    ("configs/gpt2.py:size=small", True), ("configs/t5.py:size=base", True), ("configs/t5.py:size=base,version=1.1", True),
    ("configs/bert.py:size=base,recipe=cram", True), ("configs/bert.py:size=base", False),
    ("configs/modernbert.py:size=base", True)])  # the paper's 0.1 on attention
def test_which_kernel_each_familys_default_pretraining_command_takes(monkeypatch, platform, expected, config_arg, fused):
    from configs import common
    model = common.load(config_arg).model
    rate = model.get("attention_dropout_rate", model.get("dropout_rate"))  # T5 drops attention out at dropout_rate
    head_dim = model.get("head_dim") or model.get("hidden_size", model.get("d_model", 0)) // model.num_heads
    monkeypatch.setattr(attention, "platform", lambda: platform)
    path = attention.choose(model.attention, "bfloat16", head_dim, dropout_active=rate > 0, q_len=512, kv_len=512)
    assert path == (expected if fused else "einsum")
