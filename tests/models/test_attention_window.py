"""The sliding window (ModernBERT's local attention, `SegmentMask.window`) through every attention implementation
against the reference's dense band, with padding and packed examples, forward and gradients: XLA natively, cuDNN's
one-sided window only for causal masks, Pallas as its additive input; then a whole ModernBERT across them, looped
and scanned."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import attention, stack
from models.modernbert import ModernBertConfig, ModernBertForMaskedLM
from tests.helpers.attention_cases import B, CASES, H, K, L, PB, PH, PK, PL, TOLERANCE, attending, inputs, layouts


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


def test_a_window_takes_splash_on_a_tpu_where_the_lengths_tile(monkeypatch):
    """With a window, 'auto' takes XLA here; on a TPU the block-sparse splash kernel where the lengths tile (the
    window as its static mask, the segments as ids) and XLA where they do not."""
    from models import attention_tpu
    q, k, v = inputs("float32")
    mask = window_masks()["packed, window"]
    auto = attention.dot_product_attention(q, k, v, mask, None, scale=K ** -0.5, implementation="auto")
    xla = attention.dot_product_attention(q, k, v, mask, None, scale=K ** -0.5, implementation="xla")
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(auto, xla)
    calls = []
    monkeypatch.setattr(attention, "platform", lambda: "tpu")
    monkeypatch.setattr(attention_tpu, "splash", lambda q, *rest: calls.append(rest[3:6]) or jnp.zeros_like(q))
    np.testing.assert_array_equal(
        attention.dot_product_attention(q, k, v, mask, None, scale=K ** -0.5, implementation="auto"), xla)  # 24 tokens
    long_q = jnp.zeros((1, 128, H, K))
    attention.dot_product_attention(long_q, long_q, long_q, attention.SegmentMask(window=W), None, scale=1.0,
                                    implementation="auto")
    assert calls == [(False, W, None)]  # causal, window, windowed


PW = 16  # Pallas' window: well inside its 128-token block, so the band cuts through every tile


@pytest.mark.parametrize("dtype, mask_name", [("float32", name) for name in window_masks()]
                         + [("bfloat16", "packed, window")])
def test_pallas_sliding_window_matches_the_reference(dtype, mask_name):
    """The TPU kernel has no window: the band enters as its additive input, the segments as its segment ids.
    Outputs and gradients against the reference on the dense band."""
    from tests.helpers.pallas_interpret import tpu_interpret
    q, k, v = (jax.random.normal(key, (PB, PL, PH, PK), dtype) for key in jax.random.split(jax.random.key(6), 3))
    mask = window_masks(PL, PB, PW)[mask_name]
    reference = attention.dot_product_attention(q, k, v, mask, None, scale=PK ** -0.5, implementation="einsum")
    with tpu_interpret():
        kernel = attention.dot_product_attention(q, k, v, mask, None, scale=PK ** -0.5, implementation="pallas")
    attends = attending(mask.dense(PL, PL), PB, PL)
    difference = np.abs(np.asarray(kernel, np.float32) - np.asarray(reference, np.float32))[attends]
    assert difference.max() <= TOLERANCE[dtype], (mask_name, difference.max())
    if dtype != "float32":
        return
    want = jax.grad(functools.partial(_window_loss, mask, "einsum", PL), argnums=(0, 1, 2))(q, k, v)
    with tpu_interpret():
        got = jax.grad(functools.partial(_window_loss, mask, "pallas", PL), argnums=(0, 1, 2))(q, k, v)
    for name, w, g in zip("qkv", want, got):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5, err_msg=f"{mask_name} d{name}")


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
    (XLA: local_window_size; Pallas: segment ids, and the band as its additive input; splash: its block-sparse
    window); scanned, the layer's kind is traced and switches the window (modernbert.select): Pallas keeps the
    segment ids and reads the band as an additive input every row shares, splash runs the kind's kernel (a cond)."""
    from tests.helpers.pallas_interpret import tpu_interpret
    length = 128
    config = ModernBertConfig(vocab_size=512, hidden_size=128, num_layers=4, num_heads=2, intermediate_size=256,
                              max_position_embeddings=length, local_attention=8)
    args = _modernbert_inputs(length)
    params = jax.jit(ModernBertForMaskedLM(config).init)(jax.random.key(0), *args)
    reference = jax.jit(ModernBertForMaskedLM(config).apply)(params, *args)["mlm_logits"]
    real = np.asarray(args[2]) > 0  # padding tokens' outputs are meaningless in every implementation
    for name in ("einsum", "xla", "pallas", "splash"):
        for scan in (False, True):
            model = ModernBertForMaskedLM(dataclasses.replace(config, attention=name, scan_layers=scan))
            with tpu_interpret():
                logits = jax.jit(model.apply)(stack.to_layout(params, scan=scan), *args)["mlm_logits"]
            np.testing.assert_allclose(np.asarray(logits)[real], np.asarray(reference)[real], atol=1e-4, rtol=1e-4,
                                       err_msg=f"{name}, scan_layers={scan}")
    # the window acts: the same weights with every layer global differ
    global_ = ModernBertForMaskedLM(dataclasses.replace(config, global_attn_every_n_layers=1))
    unwindowed = jax.jit(global_.apply)(params, *args)["mlm_logits"]
    assert np.abs(np.asarray(unwindowed) - np.asarray(reference))[real].max() > 1e-3


def test_modernbert_gradients_with_splash_scanned_match_the_reference_looped():
    """The backward pass through splash under the scan (each layer's kind traced, both kernels compiled, a cond
    picks one): the parameters' gradients equal the looped reference's."""
    from tests.helpers.pallas_interpret import tpu_interpret
    length = 128
    config = ModernBertConfig(vocab_size=512, hidden_size=128, num_layers=4, num_heads=2, intermediate_size=256,
                              max_position_embeddings=length, local_attention=8)
    args = _modernbert_inputs(length)
    params = jax.jit(ModernBertForMaskedLM(config).init)(jax.random.key(0), *args)
    real = jnp.asarray(args[2] > 0)[..., None]

    def loss(model, params):  # padding tokens' outputs are left out
        logits = model.apply(params, *args)["mlm_logits"]
        return jnp.sum(jnp.where(real, logits, 0.0) * jnp.cos(jnp.arange(logits.shape[-1])))
    want = jax.jit(jax.grad(functools.partial(loss, ModernBertForMaskedLM(config))))(params)
    scanned = ModernBertForMaskedLM(dataclasses.replace(config, attention="splash", scan_layers=True))
    with tpu_interpret():
        got = jax.jit(jax.grad(functools.partial(loss, scanned)))(stack.to_layout(params, scan=True))
    got = dict(jax.tree_util.tree_flatten_with_path(stack.to_layout(got, scan=False))[0])
    for path, w in jax.tree_util.tree_flatten_with_path(want)[0]:
        np.testing.assert_allclose(got[path], w, atol=2e-4, rtol=2e-4, err_msg=jax.tree_util.keystr(path))
