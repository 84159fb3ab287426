"""Two operations shaped for what XLA compiles well, used by every layer: `contract` (a Dense's matmul) and
`Dropout` (nn.Dropout with a cheaper mask), and HASH, the counter-hash PRNG implementation a TPU run's dropout
draws from (pretrain/training/prng.py). `contract` is exact; the masks are other draws of the same distribution."""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.extend.random
import jax.numpy as jnp

from models import attention


def contract(x: jax.Array, kernel: jax.Array, axis: tuple[int, ...]) -> jax.Array:
    """x [..., *in] . kernel [*in, *out] over x's `axis` dims -> [..., *out] (the other dims of x kept in order).

    On a CPU, contracting the trailing dims runs as one 2-D matmul [N, in] . [in, out] whose kernel gradient is
    computed as (dy^T . x)^T (`_matmul`): with the batch dims contracted in place, XLA's CPU backend transposes
    the cotangent for the kernel gradient and fuses the cotangent's whole elementwise producer chain (layer
    norms' and GELU's backward, across the residual stream) into that transposed copy, which its loop emitter
    runs element by element: a third of a small GPT step, growing with depth. Elsewhere: one dot_general.
    """
    trailing = axis == tuple(range(x.ndim - len(axis), x.ndim))
    if not trailing or attention.platform() != "cpu":
        return jax.lax.dot_general(x, kernel, ((axis, tuple(range(len(axis)))), ((), ())))
    rows = x.shape[:x.ndim - len(axis)]
    out = kernel.shape[len(axis):]
    y = _matmul(x.reshape(math.prod(rows), -1), kernel.reshape(math.prod(kernel.shape[:len(axis)]), -1))
    return y.reshape(rows + out)


@jax.custom_vjp
def _matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:  # [N, I] . [I, O] -> [N, O]
    return x @ kernel


def _matmul_forward(x, kernel):
    return x @ kernel, (x, kernel)


def _matmul_backward(saved, dy):  # dy [N, O]
    x, kernel = saved
    return dy @ kernel.T, (dy.T @ x).T


_matmul.defvjp(_matmul_forward, _matmul_backward)


def split_rows(x: jax.Array, last: str | None = None) -> jax.Array:
    """An activation [B, ..., F] split over the batch axes, its last axis by the rules' `last` (None: whole).

    Without it XLA's partitioner can follow the weights' sharding (embed over fsdp) instead: T5-Base's decoder
    on a v5e:2x2 ran all 128 rows on every chip, split along d_model, every matmul all-reduced. A no-op outside
    the train step's logical-axis rules and abstract mesh (pretrain/training/train_state.jit_train_step), and
    inside a shard_map, where each device already holds its own rows.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and jax.sharding.AxisType.Manual in mesh.axis_types:
        return x
    return nn.with_logical_constraint(x, ("batch",) + (None,) * (x.ndim - 2) + (last,))


class Dropout(nn.Module):
    """nn.Dropout (same fields, call and "dropout" rng stream) whose keep mask comes from `keep_mask`: on a CPU a
    threefry key's mask is a counter hash instead of threefry's bits for every element (threefry is counter-based
    arithmetic a CPU runs at about 13 ns per 32 bits: BERT's attention-probability masks alone cost a fine-tuning
    step of MiniLM on 2 cores about 0.5 s; XLA's rbg and Philox generators are no faster there)."""
    rate: float
    deterministic: bool | None = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool | None = None, rng: jax.Array | None = None) -> jax.Array:
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if self.rate == 0.0 or deterministic:
            return x
        if self.rate == 1.0:
            return jnp.zeros_like(x)
        keep = 1.0 - self.rate
        mask = keep_mask(self.make_rng(self.rng_collection) if rng is None else rng, keep, shape=x.shape)
        return jax.lax.select(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros_like(x))


def keep_mask(rng: jax.Array, keep: float, shape: tuple[int, ...]) -> jax.Array:
    """[shape] bool, True with probability `keep` (to 2^-32). A threefry key on a CPU: threefry gives the mask 64
    bits of key and each element's 32 bits are `hash_bits` of its index under them, about 10 integer operations per
    element against threefry's 120. Any other key or platform: jax.random.bernoulli, as nn.Dropout, with the bits
    of the key's implementation (threefry, rbg, or HASH: the same hash, a PRNG implementation of its own;
    pretrain/training/prng.py picks one per platform)."""
    if attention.platform() != "cpu" or str(jax.random.key_impl(rng)) != "threefry2x32":
        return jax.random.bernoulli(rng, keep, shape)
    seed = jax.random.bits(rng, (2,), jnp.uint32)
    return hash_bits(seed, shape) < jnp.uint32(min(round(keep * 2.0 ** 32), 2 ** 32 - 1))


def hash_bits(seed: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """[shape] uint32 from a [2] uint32 seed: each element's bits a hash of its index, murmur3's 32-bit finalizer
    twice over a Weyl sequence (SplitMix's construction). Dropout needs independent, unbiased bits per element,
    not a cryptographic stream; different seeds differ in both hashes' keys. Elementwise on an iota, so XLA
    partitions it with the tensor it masks and fuses it into its consumer: no bits are stored."""
    index = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
    return _fmix32(_fmix32(index * jnp.uint32(0x9E3779B9) + seed[0]) ^ seed[1])


def _hash_random_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
    """HASH's random_bits: `hash_bits` of the key's two words, cut to 8 or 16 bits or paired into 64."""
    if bit_width == 64:
        high, low = hash_bits(key, (2, *shape))
        return (high.astype(jnp.uint64) << 32) | low.astype(jnp.uint64)
    return hash_bits(key, shape).astype(jnp.dtype(f"uint{bit_width}"))


# The counter hash as a JAX PRNG implementation: seed, split and fold_in are threefry's on the same two words, the
# bits are `hash_bits`. jax.random.bernoulli(key, ...) with such a key draws a mask that XLA partitions and fuses.
HASH = jax.extend.random.define_prng_impl(
    key_shape=(2,), seed=jax.extend.random.threefry_prng_impl.seed,
    split=jax.extend.random.threefry_prng_impl.split, fold_in=jax.extend.random.threefry_prng_impl.fold_in,
    random_bits=_hash_random_bits, name="hash", tag="hash")


def _fmix32(h: jax.Array) -> jax.Array:
    """murmur3's finalizer: a bijection of uint32 whose every output bit depends on every input bit."""
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def prepend_positions(positions: jax.Array, length: int) -> jax.Array:
    """[B|1, L] positions -> [B|1, P + L]: P leading positions 0..P-1 first (embeddings or past keys in front of
    the input), the input's moved up by P."""
    leading = jnp.broadcast_to(jnp.arange(length, dtype=positions.dtype), positions.shape[:1] + (length,))
    return jnp.concatenate([leading, positions + length], axis=1)
