"""Transformer building blocks shared by every model family (BERT now; T5 and GPT reuse them).

Every weight carries logical axis names (`embed`, `mlp`, `heads`, `kv`, `vocab`, ...) so that
`pretrain/partitioning.py` can map them onto a device mesh without the model knowing about it.
Shapes use B = batch, L = query length, S = key length, D = embed, H = heads, K = head dim.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any
Initializer = Callable[..., jax.Array]


def truncated_normal(stddev: float) -> Initializer:
    """BERT's initializer: N(0, stddev) truncated at two standard deviations."""
    return nn.initializers.truncated_normal(stddev=stddev)


def partitioned(init: Initializer, axes: tuple[str | None, ...]) -> Initializer:
    return nn.with_logical_partitioning(init, axes)


class Dense(nn.Module):
    """y = x . kernel + bias over the `axis` input dimensions; kernel and bias carry logical axes.

    kernel: [*x.shape[axis], *features], e.g. [D, H, K] for an attention projection.
    """
    features: int | tuple[int, ...]
    kernel_axes: tuple[str | None, ...]
    axis: int | tuple[int, ...] = -1
    use_bias: bool = True
    kernel_init: Initializer = truncated_normal(0.02)
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = self.features if isinstance(self.features, tuple) else (self.features,)
        axis = self.axis if isinstance(self.axis, tuple) else (self.axis,)
        axis = tuple(a % x.ndim for a in axis)
        kernel = self.param("kernel", partitioned(self.kernel_init, self.kernel_axes),
                            tuple(x.shape[a] for a in axis) + features, self.param_dtype)
        y = jax.lax.dot_general(x.astype(self.dtype), jnp.asarray(kernel, self.dtype),
                                ((axis, tuple(range(len(axis)))), ((), ())))
        if self.use_bias:
            bias = self.param("bias", partitioned(nn.initializers.zeros_init(), self.kernel_axes[-len(features):]),
                              features, self.param_dtype)
            y = y + jnp.asarray(bias, self.dtype)
        return y


class LayerNorm(nn.Module):
    """LayerNorm with statistics in float32 (bf16 ones are too coarse), output in `dtype`."""
    epsilon: float = 1e-12
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        scale = self.param("scale", partitioned(nn.initializers.ones_init(), ("embed",)), (features,),
                           self.param_dtype)
        bias = self.param("bias", partitioned(nn.initializers.zeros_init(), ("embed",)), (features,),
                          self.param_dtype)
        x = x.astype(jnp.float32)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.epsilon)
        return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(self.dtype)


class Embed(nn.Module):
    """Token (or position / segment) embedding table [num_embeddings, D]; `attend` ties outputs."""
    num_embeddings: int
    features: int
    table_axis: str = "vocab"
    embedding_init: Initializer = truncated_normal(0.02)
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    def setup(self):
        self.embedding = self.param(
            "embedding", partitioned(self.embedding_init, (self.table_axis, "embed")),
            (self.num_embeddings, self.features), self.param_dtype)

    def __call__(self, ids: jax.Array) -> jax.Array:  # [...] int -> [..., D]
        return jnp.take(jnp.asarray(self.embedding, self.dtype), ids, axis=0)

    def attend(self, x: jax.Array) -> jax.Array:  # [..., D] -> [..., num_embeddings]
        return jnp.einsum("...d,vd->...v", x, jnp.asarray(self.embedding, self.dtype))


def padding_mask(query_valid: jax.Array, key_valid: jax.Array) -> jax.Array:
    """[B, L] and [B, S] booleans -> [B, 1, L, S] mask (True = may attend)."""
    return query_valid[:, None, :, None] & key_valid[:, None, None, :]


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention with per-head projections (self- or cross-attention)."""
    num_heads: int
    head_dim: int
    dropout_rate: float = 0.0
    use_bias: bool = True
    kernel_init: Initializer = truncated_normal(0.02)
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array,                 # [B, L, D]
                 context: jax.Array | None = None,   # [B, S, D]; None = self-attention
                 mask: jax.Array | None = None,      # [B|1, 1, L, S] bool
                 bias: jax.Array | None = None,      # [B|1, H, L, S] additive (relative positions)
                 deterministic: bool = True) -> jax.Array:  # [B, L, D]
        context = x if context is None else context
        dense = lambda name, axes, features, axis=-1: Dense(  # noqa: E731
            features, axes, axis=axis, use_bias=self.use_bias, kernel_init=self.kernel_init,
            dtype=self.dtype, param_dtype=self.param_dtype, name=name)
        heads = (self.num_heads, self.head_dim)
        q = dense("query", ("embed", "heads", "kv"), heads)(x)          # [B, L, H, K]
        k = dense("key", ("embed", "heads", "kv"), heads)(context)      # [B, S, H, K]
        v = dense("value", ("embed", "heads", "kv"), heads)(context)    # [B, S, H, K]

        q = q / jnp.sqrt(self.head_dim).astype(self.dtype)
        logits = jnp.einsum("blhk,bshk->bhls", q, k).astype(jnp.float32)  # softmax in float32
        if bias is not None:
            logits = logits + bias.astype(jnp.float32)
        if mask is not None:
            logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
        weights = nn.Dropout(self.dropout_rate)(weights, deterministic=deterministic)
        out = jnp.einsum("bhls,bshk->blhk", weights, v)                  # [B, L, H, K]
        return dense("out", ("heads", "kv", "embed"), x.shape[-1], axis=(-2, -1))(out)


class MLP(nn.Module):
    """Position-wise feed-forward block: D -> mlp_dim -> D."""
    mlp_dim: int
    activation: Callable[[jax.Array], jax.Array] = nn.gelu
    use_bias: bool = True
    kernel_init: Initializer = truncated_normal(0.02)
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [B, L, D]
        kw = dict(use_bias=self.use_bias, kernel_init=self.kernel_init,
                  dtype=self.dtype, param_dtype=self.param_dtype)
        h = Dense(self.mlp_dim, ("embed", "mlp"), name="intermediate", **kw)(x)
        h = self.activation(h)
        return Dense(x.shape[-1], ("mlp", "embed"), name="output", **kw)(h)


def exact_gelu(x: jax.Array) -> jax.Array:
    """BERT's GELU is the erf form, not the tanh approximation."""
    return nn.gelu(x, approximate=False)
