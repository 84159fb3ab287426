"""pretrain/training/prng.py and models/ops.HASH: `auto` picks per platform, threefry leaves a run's key (and so its
CPU losses) as it was, and every implementation's dropout masks keep their rate, with no correlation between
neighbours, rows, steps or positions."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import ops
from pretrain.training import prng

IMPLEMENTATIONS = ("threefry", "rbg", "unsafe_rbg", "hash")


@pytest.fixture
def on_a_tpu(monkeypatch):
    """The masks as a TPU program draws them: jax.random.bernoulli with the key's own bits."""
    monkeypatch.setattr(ops.attention, "platform", lambda: "tpu")


def test_auto_takes_the_hash_on_a_tpu_and_threefry_elsewhere():
    assert prng.resolve("auto", "tpu") == "hash"
    assert prng.resolve("auto", "cpu") == prng.resolve("auto", "gpu") == "threefry"
    assert prng.resolve("rbg", "cpu") == "rbg"


def test_threefry_leaves_the_seed_key_as_it_was():
    key = jax.random.key(7)
    assert prng.dropout_key(key, "auto", "cpu") is key and prng.dropout_key(key, "threefry", "tpu") is key


@pytest.mark.parametrize("impl, name", [("rbg", "rbg"), ("unsafe_rbg", "unsafe_rbg"), ("hash", "hash")])
def test_each_choice_makes_a_key_of_its_implementation_and_seeds_differ(impl, name):
    keys = [prng.dropout_key(jax.random.key(seed), impl, "tpu") for seed in (0, 1)]
    assert str(jax.random.key_impl(keys[0])) == name
    assert not np.array_equal(jax.random.key_data(keys[0]), jax.random.key_data(keys[1]))


def _masks(impl: str, keep: float, shape: tuple[int, ...], steps: int) -> np.ndarray:
    """[steps, *shape] keep masks of a dropout layer, one per training step (fold_in(key, step), as the loop)."""
    key = prng.dropout_key(jax.random.key(0), impl, "tpu")
    draw = jax.jit(lambda k: ops.keep_mask(k, keep, shape))
    return np.stack([np.asarray(draw(jax.random.fold_in(key, step))) for step in range(steps)])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("keep", [0.9, 0.5])
def test_masks_keep_their_rate(on_a_tpu, impl, keep):
    masks = _masks(impl, keep, (64, 128, 96), steps=2)
    assert abs(masks.mean() - keep) < 4 * np.sqrt(keep * (1 - keep) / masks.size)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_masks_are_uncorrelated_between_neighbours_rows_and_steps(on_a_tpu, impl):
    first, second = _masks(impl, 0.5, (1 << 20,), steps=2).astype(np.float64)
    bound = 5 / np.sqrt(first.size)  # five standard errors of a correlation of n independent pairs
    assert abs(np.corrcoef(first[:-1], first[1:])[0, 1]) < bound
    assert abs(np.corrcoef(first[:-128], first[128:])[0, 1]) < bound  # a row apart in a [.., 128] tensor
    assert abs(np.corrcoef(first, second)[0, 1]) < bound              # the next step's mask


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_no_position_is_favoured_across_steps(on_a_tpu, impl):
    per_position = _masks(impl, 0.8, (32, 64), steps=300).mean(axis=0)  # each position's keep frequency
    assert abs(per_position.mean() - 0.8) < 0.006
    assert np.abs(per_position - 0.8).max() < 5.5 * np.sqrt(0.8 * 0.2 / 300)


def test_the_hash_implementation_draws_every_bit_width_jax_asks_for():
    key = jax.random.key(3, impl=ops.HASH)
    for width, dtype in ((8, jnp.uint8), (16, jnp.uint16), (32, jnp.uint32)):
        bits = jax.random.bits(key, (5, 7), dtype)
        assert bits.shape == (5, 7) and bits.dtype == dtype and len(np.unique(np.asarray(bits))) > 20
    left, right = jax.random.split(key)
    assert not np.array_equal(jax.random.bits(left, (64,)), jax.random.bits(right, (64,)))
