"""models/ops.py's CPU-shaped pieces: `contract` (Dense's 2-D matmul with its own kernel gradient) equals
jax.lax.dot_general in values and gradients, and `Dropout`'s hashed keep mask keeps the fraction it says, scales
what it keeps, draws the same mask for the same key and masks that look independent across elements and keys."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import ops


def _reference(x, kernel, axis):
    return jax.lax.dot_general(x, kernel, ((axis, tuple(range(len(axis)))), ((), ())))


@pytest.mark.parametrize("x_shape, kernel_shape, axis", [
    ((3, 5, 8), (8, 2, 4), (2,)),          # an attention projection [D] -> [H, K]
    ((3, 5, 2, 4), (2, 4, 8), (2, 3)),     # the output projection [H, K] -> [D]
    ((3, 5, 8), (8, 6), (2,)),             # an MLP layer
    ((8, 3, 5), (8, 6), (0,)),             # a leading axis: the dot_general path
])
def test_contract_matches_dot_general_values_and_gradients(x_shape, kernel_shape, axis):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=kernel_shape), jnp.float32)
    ours, theirs = ops.contract(x, kernel, axis), _reference(x, kernel, axis)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)

    def loss(fn):
        return lambda x, k: jnp.sum(jnp.sin(fn(x, k, axis)))
    ours = jax.grad(loss(ops.contract), argnums=(0, 1))(x, kernel)
    theirs = jax.grad(loss(_reference), argnums=(0, 1))(x, kernel)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_contract_under_jit_takes_the_matmul_path_on_this_cpu():
    jaxpr = jax.make_jaxpr(lambda x, k: ops.contract(x, k, (2,)))(jnp.ones((2, 3, 4)), jnp.ones((4, 5)))
    assert "custom_vjp_call" in str(jaxpr)  # the 2-D matmul with its own backward, not a bare dot_general


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_dropout_keeps_the_fraction_of_its_rate_and_scales_what_it_keeps(rate):
    x = jnp.ones((64, 128, 129))
    out = ops.Dropout(rate).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(3)})
    kept = np.asarray(out) != 0
    assert abs(kept.mean() - (1 - rate)) < 4 * np.sqrt(rate * (1 - rate) / kept.size)
    np.testing.assert_allclose(np.asarray(out)[kept], 1 / (1 - rate), rtol=1e-6)


def test_dropout_mask_is_a_function_of_the_key_and_off_when_deterministic():
    x = jnp.arange(1000, dtype=jnp.float32).reshape(10, 100) + 1
    drop = ops.Dropout(0.3)
    first, again, other = (drop.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(k)}) for k in (1, 1, 2))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first != 0, other != 0)
    np.testing.assert_array_equal(drop.apply({}, x, deterministic=True), x)
    assert not np.any(np.asarray(ops.Dropout(1.0).apply({}, x, deterministic=False)))


def test_keep_masks_are_uncorrelated_between_neighbours_and_between_keys():
    n = 1 << 20
    first, second = (np.asarray(ops.keep_mask(jax.random.key(k), 0.5, (n,)), np.float64) for k in (1, 2))
    bound = 5 / np.sqrt(n)  # five standard errors of a correlation of n independent pairs
    assert abs(np.corrcoef(first[:-1], first[1:])[0, 1]) < bound
    assert abs(np.corrcoef(first[:-128], first[128:])[0, 1]) < bound  # a row apart in a [.., 128] tensor
    assert abs(np.corrcoef(first, second)[0, 1]) < bound


def test_each_position_is_kept_at_the_rate_across_keys():
    masks = np.stack([np.asarray(ops.keep_mask(jax.random.key(k), 0.8, (64, 64))) for k in range(400)])
    per_position = masks.mean(axis=0)  # [64, 64]: each position's keep frequency over 400 keys
    assert abs(per_position.mean() - 0.8) < 0.005
    assert np.abs(per_position - 0.8).max() < 5.5 * np.sqrt(0.8 * 0.2 / 400)  # no position is favoured


def test_keep_mask_has_the_shape_asked_for_whatever_its_element_count():
    for shape in ((3, 7), (1,), (2, 3, 5)):
        mask = ops.keep_mask(jax.random.key(0), 0.75, shape)
        assert mask.shape == shape and mask.dtype == jnp.bool_


def test_dropout_is_a_flax_module_named_like_flax_dropout():
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return ops.Dropout(0.5)(x, deterministic=False)
    variables = Block().init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, jnp.ones((2, 2)))
    assert variables == {}  # no parameters; its auto-name (Dropout_0) and rng stream are nn.Dropout's


def test_keep_mask_off_a_cpu_is_bernoullis(monkeypatch):
    monkeypatch.setattr(ops.attention, "platform", lambda: "tpu")
    key = jax.random.key(5)
    np.testing.assert_array_equal(ops.keep_mask(key, 0.9, (4, 33)), jax.random.bernoulli(key, 0.9, (4, 33)))


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_layer_norm_matches_torchs_on_each_platforms_path(monkeypatch, platform):
    """Two passes over x on a CPU, one (E[x^2] - E[x]^2, as flax's fast variance) elsewhere: both torch's LayerNorm
    within 1e-4, on rows whose mean is up to ~12 standard deviations from zero (the one-pass error grows as
    float32's epsilon x (mean / std)^2)."""
    import torch

    from models import layers
    monkeypatch.setattr(ops.attention, "platform", lambda: platform)
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(4, 16, 768)) * rng.uniform(0.5, 3, size=(4, 16, 1)) + rng.normal(size=(4, 16, 1)) * 2)
    x = x.astype(np.float32)
    norm = layers.LayerNorm(1e-12)
    ours = norm.apply(norm.init(jax.random.key(0), jnp.asarray(x)), jnp.asarray(x))
    theirs = torch.nn.functional.layer_norm(torch.from_numpy(x), (768,), eps=1e-12).numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


def test_layer_norm_on_a_cpu_keeps_its_two_pass_numbers(monkeypatch):
    """The CPU path is the same program as before the one-pass variance existed: bit for bit."""
    from models import layers
    x = jnp.asarray(np.random.default_rng(1).normal(3, 2, size=(8, 96)), jnp.float32)
    norm = layers.LayerNorm(1e-12)
    ours = norm.apply(norm.init(jax.random.key(0), x), x)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    expected = (x - mean) * jax.lax.rsqrt(jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True) + 1e-12)
    np.testing.assert_array_equal(ours, expected)
