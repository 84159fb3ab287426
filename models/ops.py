"""Two operations shaped for what XLA compiles well, used by every layer: `contract` (a Dense's matmul) and
`Dropout` (nn.Dropout with a cheaper mask). Both are exact: they change how, not what, is computed."""
from __future__ import annotations

import math

import flax.linen as nn
import jax
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
    the train step's logical-axis rules and abstract mesh (pretrain/core/train_state.jit_train_step), and
    inside a shard_map, where each device already holds its own rows.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and jax.sharding.AxisType.Manual in mesh.axis_types:
        return x
    return nn.with_logical_constraint(x, ("batch",) + (None,) * (x.ndim - 2) + (last,))


class Dropout(nn.Module):
    """nn.Dropout (same fields, call and "dropout" rng stream) whose keep mask, on a CPU, compares 16 random bits per
    element with round(keep * 2^16) instead of a 32-bit uniform float with keep: the rate is exact to 2^-16 and
    the mask costs half the random bits. Threefry, JAX's default generator, is counter-based arithmetic that a CPU
    runs at several ns per 32 bits: BERT's attention-probability masks alone cost a fine-tuning step of
    MiniLM on 2 cores 0.3-0.7 s in 32 bits (rbg's generator is slower still there)."""
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
        mask = keep_mask(self.make_rng(self.rng_collection) if rng is None else rng, keep, x.shape)
        return jax.lax.select(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros_like(x))


def keep_mask(rng: jax.Array, keep: float, shape: tuple[int, ...]) -> jax.Array:
    """[shape] bool, True with probability `keep`. On a CPU from 16 random bits per element (each 32-bit draw gives
    two; the probability is round(keep * 2^16) / 2^16); elsewhere jax.random.bernoulli's 32 bits, as nn.Dropout
    (an accelerator's threefry is cheap beside its step: BERT-Base's v5e estimate moved by 0.5% with rbg keys)."""
    if attention.platform() != "cpu":
        return jax.random.bernoulli(rng, keep, shape)
    count = math.prod(shape)
    bits = jax.random.bits(rng, (-(-count // 2),), jnp.uint32)
    halves = jax.lax.bitcast_convert_type(bits, jnp.uint16).reshape(-1)[:count].reshape(shape)
    return halves.astype(jnp.uint32) < jnp.uint32(round(keep * 65536))
