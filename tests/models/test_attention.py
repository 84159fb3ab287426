"""Every attention implementation that runs on this machine against the reference einsum, with the masks
the families use (padding, causal, packed segments, prefix LM) and T5's relative-position bias, per dtype;
then whole models built with each implementation."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import attention, gpt, layers, stack
from models.bert import BertConfig, BertForPreTraining
from models.gpt import GPT, GPTConfig
from models.modernbert import ModernBertConfig, ModernBertForMaskedLM
from models.t5 import T5, T5Config

# Largest |fused - reference| allowed, relative to the output's scale (values are O(1) here).
TOLERANCE = {"float32": 2e-6, "bfloat16": 2e-2}
RUNNABLE = ["xla"] + (["cudnn"] if jax.default_backend() == "gpu" else [])
B, L, H, K = 3, 24, 4, 16


def layouts(length: int = L, batch: int = B) -> tuple[jax.Array, jax.Array]:
    """[B, L] padding (True = real token) and packed segment ids (0 = padding), drawn for 24 tokens, stretched."""
    at = lambda position: position * length // 24  # noqa: E731
    lengths = np.array([length, at(17), at(5)])[:batch]
    valid = jnp.asarray(np.arange(length)[None] < lengths[:, None])
    segments = np.zeros((batch, length), np.int32)
    for row, cuts in enumerate(([0, 10, 24], [0, 3, 15, 20], [0, 24])[:batch]):
        for number, (start, end) in enumerate(zip(cuts, cuts[1:]), 1):
            segments[row, at(start):at(end)] = number
    if batch > 1:
        segments[1, at(20):] = 0  # padding after the packed examples
    return valid, jnp.asarray(segments)


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


def attending(mask, batch: int, length: int) -> np.ndarray:
    """[B, L]: queries with at least one key (padding queries are meaningless in every implementation)."""
    if mask is None:
        return np.ones((batch, length), bool)
    return np.asarray(jnp.broadcast_to(mask, (batch, 1, length, length)).any(-1))[:, 0]


def inputs(dtype):
    q, k, v = (jax.random.normal(key, (B, L, H, K), dtype) for key in jax.random.split(jax.random.key(1), 3))
    return q, k, v


# cuDNN takes half precision only: it is compared in bfloat16
CASES = [(implementation, dtype) for implementation in RUNNABLE for dtype in TOLERANCE
         if not (implementation == "cudnn" and dtype == "float32")]


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


W = 4  # the sliding window (ModernBERT's local attention): keys within 4 positions either side of 24 tokens


def window_masks(length: int = L, batch: int = B, window: int = W) -> dict[str, attention.SegmentMask]:
    """Sliding-window masks over sequences longer than the window: alone, with padding, with packed examples."""
    valid, segments = layouts(length, batch)
    return {
        "window": attention.SegmentMask(window=window),
        "padding, window": attention.SegmentMask(valid.astype(jnp.int32), valid.astype(jnp.int32), window=window),
        "packed, window": attention.SegmentMask(segments, segments, window=window),
    }


def _window_loss(mask, implementation, length, q, k, v):
    """A loss over the queries that attend to something (padding queries are meaningless everywhere)."""
    keep = jnp.asarray(attending(mask.dense(length, length), q.shape[0], length))[:, :, None, None]
    out = attention.dot_product_attention(q, k, v, mask, None, scale=q.shape[-1] ** -0.5,
                                          implementation=implementation)
    return jnp.sum(jnp.where(keep, out, 0.0).astype(jnp.float32) * jnp.cos(jnp.arange(q.shape[-1])))


@pytest.mark.parametrize("mask_name", list(window_masks()))
def test_window_masks_are_the_band_inside_each_example(mask_name):
    mask = window_masks()[mask_name]
    dense = np.broadcast_to(mask.dense(L, L), (B, 1, L, L))[:, 0]
    positions = np.arange(L)
    band = np.abs(positions[:, None] - positions[None]) <= W
    valid, segments = (np.asarray(x) for x in layouts())
    ids = {"window": np.ones((B, L), int), "padding, window": valid.astype(int), "packed, window": segments}[mask_name]
    same = (ids[:, :, None] == ids[:, None, :]) & (ids != 0)[:, :, None]
    np.testing.assert_array_equal(dense, band[None] & same)
    assert W < L and not band.all()  # the window cuts: a sequence longer than it


@pytest.mark.parametrize("implementation, dtype", CASES)
@pytest.mark.parametrize("mask_name", list(window_masks()))
def test_sliding_window_matches_the_reference(implementation, dtype, mask_name):
    """XLA (and cuDNN) take the window natively (`local_window_size`) beside the segments' mask: outputs and
    gradients equal the reference's on its dense band."""
    q, k, v = inputs(dtype)
    mask = window_masks()[mask_name]
    dense = mask.dense(L, L)
    reference = attention.dot_product_attention(q, k, v, dense, None, scale=K ** -0.5, implementation="einsum")
    fused = attention.dot_product_attention(q, k, v, mask, None, scale=K ** -0.5, implementation=implementation)
    attends = attending(dense, B, L)
    difference = np.abs(np.asarray(fused, np.float32) - np.asarray(reference, np.float32))[attends]
    assert difference.max() <= TOLERANCE[dtype], (implementation, mask_name, difference.max())
    unwindowed = attention.dot_product_attention(q, k, v, mask.replace(window=0), None, scale=K ** -0.5,
                                                 implementation=implementation)
    assert np.abs(np.asarray(unwindowed, np.float32) - np.asarray(fused, np.float32)).max() > 0.1  # the window acts
    if dtype != "float32":
        return
    want = jax.grad(functools.partial(_window_loss, mask, "einsum", L), argnums=(0, 1, 2))(q, k, v)
    got = jax.grad(functools.partial(_window_loss, mask, implementation, L), argnums=(0, 1, 2))(q, k, v)
    for name, w, g in zip("qkv", want, got):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5, err_msg=f"{implementation} {mask_name} d{name}")


@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_gets_a_two_sided_window_in_its_mask(monkeypatch, causal):
    """cuDNN's window is one-sided (JAX raises for a right window without is_causal): a causal window goes as
    `local_window_size`, ModernBERT's two-sided band in the dense mask. The call cuDNN would get, run by XLA,
    gives the reference's output (no GPU here: the arguments are what is checked)."""
    q, k, v = inputs("bfloat16")
    mask = window_masks()["packed, window"].replace(causal=causal)
    calls = []
    real = jax.nn.dot_product_attention
    monkeypatch.setattr(jax.nn, "dot_product_attention",
                        lambda *a, **kw: calls.append(kw) or real(*a, **{**kw, "implementation": "xla"}))
    out = attention.dot_product_attention(q, k, v, mask, None, scale=K ** -0.5, implementation="cudnn")
    assert calls[0]["implementation"] == "cudnn" and calls[0]["is_causal"] == causal
    assert calls[0]["local_window_size"] == ((W, W) if causal else None)
    reference = attention.dot_product_attention(q, k, v, mask, None, scale=K ** -0.5, implementation="einsum")
    attends = attending(mask.dense(L, L), B, L)
    difference = np.abs(np.asarray(out, np.float32) - np.asarray(reference, np.float32))[attends]
    assert difference.max() <= TOLERANCE["bfloat16"]


def test_a_window_leaves_the_choice_of_implementation_alone(monkeypatch):
    """`choose` reads shapes, dtype and dropout, never the mask: with a window, 'auto' still takes XLA here, Pallas
    on a TPU where the lengths tile (the band as its additive input) and XLA where they do not."""
    q, k, v = inputs("float32")
    mask = window_masks()["packed, window"]
    auto = attention.dot_product_attention(q, k, v, mask, None, scale=K ** -0.5, implementation="auto")
    xla = attention.dot_product_attention(q, k, v, mask, None, scale=K ** -0.5, implementation="xla")
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(auto, xla)
    calls = []
    monkeypatch.setattr(attention, "platform", lambda: "tpu")
    monkeypatch.setattr(attention, "_pallas", lambda q, *rest: calls.append(rest[2]) or jnp.zeros_like(q))
    np.testing.assert_array_equal(
        attention.dot_product_attention(q, k, v, mask, None, scale=K ** -0.5, implementation="auto"), xla)  # 24 tokens
    long_q = jnp.zeros((1, 128, H, K))
    long_mask = attention.SegmentMask(window=W)
    attention.dot_product_attention(long_q, long_q, long_q, long_mask, None, scale=1.0, implementation="auto")
    assert calls == [long_mask]


def test_auto_picks_per_platform_and_dropout():
    assert attention.choose("auto", jnp.float32, 64, dropout_active=False) == "xla"  # cuDNN: half precision only
    assert attention.choose("auto", jnp.bfloat16, 64, dropout_active=False) == (
        "cudnn" if jax.default_backend() == "gpu" else "xla")
    assert attention.choose("auto", jnp.bfloat16, 64, dropout_active=True) == "einsum"
    assert attention.choose("einsum", jnp.bfloat16, 64, dropout_active=False) == "einsum"
    with pytest.raises(ValueError, match="attention_dropout_rate=0"):
        attention.choose("xla", jnp.float32, 64, dropout_active=True)
    with pytest.raises(ValueError, match="not one of auto, einsum, xla, cudnn, pallas"):
        attention.choose("flash", jnp.float32, 64, dropout_active=False)
    with pytest.raises(ValueError, match="tiles queries and keys by 128: lengths 24 x 24"):
        attention.choose("pallas", jnp.float32, 64, False, q_len=24, kv_len=24)
    with pytest.raises(ValueError, match="attention_dropout_rate=0"):
        attention.choose("pallas", jnp.float32, 64, True, q_len=128, kv_len=128)
    assert attention.choose("pallas", jnp.float32, 64, False, q_len=256, kv_len=128) == "pallas"
    on_tpu = jax.default_backend() == "tpu"
    assert attention.choose("auto", jnp.float32, 64, False, q_len=128, kv_len=512) == ("pallas" if on_tpu else "xla")
    assert attention.choose("auto", jnp.float32, 64, False, q_len=114, kv_len=512) == "xla"  # T5's targets


# Pallas' TPU kernel, run by its TPU interpreter on this CPU (slow: one shape, B=2, 128 tokens, 2 heads).
PB, PL, PH, PK = 2, 128, 2, 32


def _pallas_case(dtype, mask_name, with_bias, parts=False):
    q, k, v = (jax.random.normal(key, (PB, PL, PH, PK), dtype) for key in jax.random.split(jax.random.key(5), 3))
    mask = (segment_masks if parts else masks)(PL, PB)[mask_name]
    return q, k, v, mask, relative_bias(PL, PH) if with_bias else None


# dense masks enter the kernel as its additive input; SegmentMasks ("parts") as its segment ids and causal flag
PALLAS_CASES = ([("float32", name, False) for name in masks()] + [("bfloat16", "packed causal", False)]
                + [("float32", name, True) for name in segment_masks()] + [("bfloat16", "packed causal", True)])


@pytest.mark.parametrize("dtype, mask_name, parts", PALLAS_CASES)
def test_pallas_kernel_matches_the_reference(dtype, mask_name, parts):
    from jax.experimental.pallas import tpu as pltpu
    q, k, v, mask, bias = _pallas_case(dtype, mask_name, with_bias=mask_name != "none", parts=parts)
    reference = attention.dot_product_attention(q, k, v, mask, bias, scale=PK ** -0.5, implementation="einsum")
    with pltpu.force_tpu_interpret_mode():
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
    from jax.experimental.pallas import tpu as pltpu
    q, k, v, mask, bias = _pallas_case("float32", mask_name, with_bias=True, parts=parts)
    # padding queries' outputs are left out of the loss
    keep = jnp.asarray(attending(attention.dense_mask(mask, PL, PL), PB, PL))[:, :, None, None]

    def loss(implementation, q, k, v, bias):
        out = attention.dot_product_attention(q, k, v, mask, bias, scale=PK ** -0.5, implementation=implementation)
        return jnp.sum(jnp.where(keep, out, 0.0) * jnp.cos(jnp.arange(PK)))

    reference = jax.grad(functools.partial(loss, "einsum"), argnums=(0, 1, 2, 3))(q, k, v, bias)
    with pltpu.force_tpu_interpret_mode():
        kernel = jax.grad(functools.partial(loss, "pallas"), argnums=(0, 1, 2, 3))(q, k, v, bias)
    for name, want, got in zip("q k v bias".split(), reference, kernel):
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5, err_msg=name)
    assert float(jnp.abs(reference[3]).max()) > 1e-3  # the bias's gradient is not trivially zero


PW = 16  # Pallas' window: well inside its 128-token block, so the band cuts through every tile


@pytest.mark.parametrize("dtype, mask_name", [("float32", name) for name in window_masks()]
                         + [("bfloat16", "packed, window")])
def test_pallas_sliding_window_matches_the_reference(dtype, mask_name):
    """The TPU kernel has no window: the band enters as its additive input, the segments as its segment ids.
    Outputs and gradients against the reference on the dense band."""
    from jax.experimental.pallas import tpu as pltpu
    q, k, v = (jax.random.normal(key, (PB, PL, PH, PK), dtype) for key in jax.random.split(jax.random.key(6), 3))
    mask = window_masks(PL, PB, PW)[mask_name]
    reference = attention.dot_product_attention(q, k, v, mask, None, scale=PK ** -0.5, implementation="einsum")
    with pltpu.force_tpu_interpret_mode():
        kernel = attention.dot_product_attention(q, k, v, mask, None, scale=PK ** -0.5, implementation="pallas")
    attends = attending(mask.dense(PL, PL), PB, PL)
    difference = np.abs(np.asarray(kernel, np.float32) - np.asarray(reference, np.float32))[attends]
    assert difference.max() <= TOLERANCE[dtype], (mask_name, difference.max())
    if dtype != "float32":
        return
    want = jax.grad(functools.partial(_window_loss, mask, "einsum", PL), argnums=(0, 1, 2))(q, k, v)
    with pltpu.force_tpu_interpret_mode():
        got = jax.grad(functools.partial(_window_loss, mask, "pallas", PL), argnums=(0, 1, 2))(q, k, v)
    for name, w, g in zip("qkv", want, got):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5, err_msg=f"{mask_name} d{name}")


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


def _modernbert_inputs(length: int) -> tuple[jax.Array, ...]:
    """Row 0: two packed examples then padding (positions restart in each example); row 1: one, then padding."""
    ids = jax.random.randint(jax.random.key(3), (2, length), 1, 512)
    cut, end = 3 * length // 8, 7 * length // 8
    segments = np.zeros((2, length), np.int32)
    segments[0, :cut], segments[0, cut:end], segments[1, :end - 9] = 1, 2, 1
    positions = np.arange(length)[None].repeat(2, 0)
    positions[0, cut:] -= cut
    return ids, None, jnp.asarray(segments), None, True, jnp.asarray(positions)


def test_modernbert_agrees_across_implementations_looped_and_scanned():
    """configs/modernbert.py's tiny shape (4 layers here: global, local, local, global) with an 8-token window
    (4 either side) over 128 tokens, Pallas' shortest tile: looped, each layer takes its kernel's native mask
    (XLA: local_window_size; Pallas: segment ids, and the band as its additive input); scanned, the layer's kind
    is traced and the mask is dense (modernbert.select), which Pallas takes as its additive input too."""
    from jax.experimental.pallas import tpu as pltpu
    length = 128
    config = ModernBertConfig(vocab_size=512, hidden_size=128, num_layers=4, num_heads=2, intermediate_size=256,
                              max_position_embeddings=length, local_attention=8)
    args = _modernbert_inputs(length)
    params = jax.jit(ModernBertForMaskedLM(config).init)(jax.random.key(0), *args)
    reference = jax.jit(ModernBertForMaskedLM(config).apply)(params, *args)["mlm_logits"]
    real = np.asarray(args[2]) > 0  # padding tokens' outputs are meaningless in every implementation
    for name in ("einsum", "xla", "pallas"):
        for scan in (False, True):
            model = ModernBertForMaskedLM(dataclasses.replace(config, attention=name, scan_layers=scan))
            with pltpu.force_tpu_interpret_mode():
                logits = jax.jit(model.apply)(stack.to_layout(params, scan=scan), *args)["mlm_logits"]
            np.testing.assert_allclose(np.asarray(logits)[real], np.asarray(reference)[real], atol=1e-4, rtol=1e-4,
                                       err_msg=f"{name}, scan_layers={scan}")
    # the window acts: the same weights with every layer global differ
    global_ = ModernBertForMaskedLM(dataclasses.replace(config, global_attn_every_n_layers=1))
    unwindowed = jax.jit(global_.apply)(params, *args)["mlm_logits"]
    assert np.abs(np.asarray(unwindowed) - np.asarray(reference))[real].max() > 1e-3


@pytest.mark.parametrize("platform, expected", [("gpu", "cudnn"), ("tpu", "pallas")])
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
