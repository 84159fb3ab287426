"""The block-sparse splash kernel (models/attention_tpu.py) in Pallas' TPU interpret mode against the reference einsum:
every mask it takes (padding, causal, packed, a two-sided window, a window switched by a traced flag), forward and
gradients; that it skips the blocks its mask empties; which kernel each family's attention takes on a TPU; and the
(query, key) pairs a mask keeps, which the model FLOPs count."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import attention, attention_tpu
from tests.helpers.attention_cases import PB, PH, PK, TOLERANCE, attending, layouts
from tests.helpers.pallas_interpret import tpu_interpret

SL = 384     # 3 blocks of 128: a window of 16 or a causal mask leaves some blocks empty
SW = 16


def splash_masks(length: int = SL, batch: int = PB) -> dict[str, attention.SegmentMask]:
    valid, segments = layouts(length, batch)
    padding = valid.astype(jnp.int32)
    unpadded = jnp.where(segments == 0, segments.max(axis=1, keepdims=True), segments)  # keys: no padding
    return {
        "none": attention.SegmentMask(),
        "padding": attention.SegmentMask(padding, padding),
        "causal": attention.SegmentMask(causal=True),
        "packed causal": attention.SegmentMask(segments, segments, causal=True),
        "packed bidirectional": attention.SegmentMask(segments, segments),
        "window": attention.SegmentMask(window=SW),
        "padding, window": attention.SegmentMask(padding, padding, window=SW),
        "packed, causal window": attention.SegmentMask(segments, segments, causal=True, window=SW),
        "window off by a flag": attention.SegmentMask(segments, segments, window=SW, windowed=jnp.asarray(False)),
        "window on by a flag": attention.SegmentMask(segments, segments, window=SW, windowed=jnp.asarray(True)),
        "cross, padding queries see no key": attention.SegmentMask(segments, unpadded),
    }


def _inputs(dtype, length: int = SL):
    return tuple(jax.random.normal(key, (PB, length, PH, PK), dtype) for key in jax.random.split(jax.random.key(7), 3))


def _loss(mask, implementation, q, k, v):
    """A loss over the queries that attend to something (padding queries are meaningless everywhere)."""
    keep = jnp.asarray(attending(mask.dense(SL, SL), PB, SL))[:, :, None, None]
    out = attention.dot_product_attention(q, k, v, mask, None, scale=PK ** -0.5, implementation=implementation)
    return jnp.sum(jnp.where(keep, out, 0.0).astype(jnp.float32) * jnp.cos(jnp.arange(PK)))


@pytest.mark.parametrize("dtype, mask_name", [("float32", name) for name in splash_masks()]
                         + [("bfloat16", "packed, causal window")])
def test_splash_matches_the_reference(dtype, mask_name):
    q, k, v = _inputs(dtype)
    mask = splash_masks()[mask_name]
    reference = attention.dot_product_attention(q, k, v, mask, None, scale=PK ** -0.5, implementation="einsum")
    with tpu_interpret():
        kernel = attention.dot_product_attention(q, k, v, mask, None, scale=PK ** -0.5, implementation="splash")
    assert kernel.shape == reference.shape and kernel.dtype == q.dtype
    attends = attending(mask.dense(SL, SL), PB, SL)
    difference = np.abs(np.asarray(kernel, np.float32) - np.asarray(reference, np.float32))[attends]
    assert difference.max() <= TOLERANCE[dtype], (mask_name, difference.max())


@pytest.mark.parametrize("mask_name", ["packed causal", "padding, window", "window on by a flag",
                                       "cross, padding queries see no key"])
def test_splash_gradients_match_the_reference(mask_name):
    q, k, v = _inputs("float32")
    mask = splash_masks()[mask_name]
    want = jax.grad(functools.partial(_loss, mask, "einsum"), argnums=(0, 1, 2))(q, k, v)
    with tpu_interpret():
        got = jax.grad(functools.partial(_loss, mask, "splash"), argnums=(0, 1, 2))(q, k, v)
    for name, w, g in zip("qkv", want, got):
        assert np.isfinite(np.asarray(g)).all(), f"{mask_name} d{name}"  # finite where a query sees no key
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5, err_msg=f"{mask_name} d{name}")


def test_splash_computes_only_the_blocks_its_mask_keeps():
    """The kernel's grid, as traced: a window of 64 keys either side over 1,024 tokens visits 3 key blocks of 8 per
    query block (its matmuls, counted per grid point, shrink to 3/8), a full mask all 8."""
    from pretrain.runtime import chips
    q = jnp.zeros((1, 1024, 2, 64), jnp.bfloat16)

    def flops(mask):
        traced = jax.make_jaxpr(lambda q: attention.dot_product_attention(q, q, q, mask, None, scale=1.0,
                                                                         implementation="splash"))(q)
        return chips.matmul_flops(traced, pallas_only=True)
    full, local = flops(attention.SegmentMask()), flops(attention.SegmentMask(window=64))
    assert full == 4 * 2 * 1024 * 1024 * 64  # q.k and p.v over every pair, both heads
    assert local == full * 3 / 8


def test_each_familys_attention_takes_splash_on_a_tpu_but_t5s_biased_attention(monkeypatch):
    """Traced as on a TPU: BERT's, GPT's and ModernBERT's masks are segments, causality and a window (splash); T5's
    self-attention adds its relative-position bias (Pallas' flash kernel), its cross-attention does not (splash)."""
    from models.bert import BertConfig, BertForPreTraining
    from models.gpt import GPT, GPTConfig
    from models.modernbert import ModernBertConfig, ModernBertForMaskedLM
    from models.t5 import T5, T5Config
    taken = []
    monkeypatch.setattr(attention, "platform", lambda: "tpu")
    monkeypatch.setattr(attention, "_tpu_kernel", lambda name, q, *rest: taken.append(name) or jnp.zeros_like(q))
    ids = jnp.ones((2, 128), jnp.int32)
    small = dict(vocab_size=101, num_layers=1, num_heads=2)
    models = {
        "bert": (BertForPreTraining(BertConfig(**small, hidden_size=32, intermediate_size=64)),
                 (ids, jnp.zeros_like(ids), ids, ids[:, :4])),
        "gpt": (GPT(GPTConfig(**small, n_positions=128, d_model=32, d_ff=64)), (ids, ids)),
        "modernbert": (ModernBertForMaskedLM(ModernBertConfig(**small, hidden_size=32, intermediate_size=64)),
                       (ids, None, ids)),
        "t5": (T5(T5Config(vocab_size=101, d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=1,
                           num_decoder_layers=1)), (ids, ids)),
    }
    kernels = {}
    for family, (model, args) in models.items():
        taken.clear()
        jax.eval_shape(model.init, jax.random.key(0), *args)
        kernels[family] = sorted(set(taken))
    assert kernels == {"bert": ["splash"], "gpt": ["splash"], "modernbert": ["splash"], "t5": ["pallas", "splash"]}


@pytest.mark.parametrize("causal, window", [(False, 0), (True, 0), (False, 5), (True, 5), (False, 40)])
def test_kept_pairs_count_the_dense_mask(causal, window):
    mask = attention.SegmentMask(causal=causal, window=window)
    dense = mask.dense(24, 24)
    assert mask.kept_pairs(24, 24) == (24 * 24 if dense is None else int(np.asarray(dense).sum()))
    assert attention.SegmentMask().kept_pairs(24, 56) == 24 * 56  # cross-attention: every pair
    assert attention_tpu.fits(128, 256, 64) and not attention_tpu.fits(120, 256, 64)
