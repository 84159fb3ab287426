"""Transformer building blocks shared by every model family (BERT, T5; GPT reuses them).

Every weight carries logical axis names (`embed`, `mlp`, `heads`, `kv`, `vocab`, ...) so that
`pretrain/runtime/partitioning.py` can map them onto a device mesh without the model knowing about it.
Shapes use B = batch, L = query length, S = key length, D = embed, H = heads, K = head dim.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import attention, ops, stack

Dtype = Any
Initializer = Callable[..., jax.Array]


def truncated_normal(stddev: float) -> Initializer:
    """BERT's initializer: N(0, stddev) truncated at two standard deviations."""
    return nn.initializers.truncated_normal(stddev=stddev)


def partitioned(init: Initializer, axes: tuple[str | None, ...]) -> Initializer:
    return nn.with_logical_partitioning(init, axes)


def stacked_init(inits: tuple[Initializer, ...], axis: int) -> Initializer:
    """The initializer of a kernel holding len(inits) projections along `axis` (fused qkv [D, 3, H, K]): each
    slice drawn by its own initializer, with its own key, so it has the distribution of the separate kernel."""
    def init(key, shape, dtype=jnp.float32):
        if shape[axis] != len(inits):
            raise ValueError(f"a kernel of shape {shape} holds {shape[axis]} projections on axis {axis}, not "
                             f"{len(inits)}")
        part = shape[:axis] + shape[axis + 1:]
        keys = jax.random.split(key, len(inits))
        return jnp.stack([f(k, part, dtype) for f, k in zip(inits, keys)], axis=axis)
    return init


class Sublayers(nn.Module):
    """A layer passing each sub-layer's output [B, L, D] (dropped out, before the residual add) through
    `sublayer_output(name, h)`, the identity: a named point for a caller's Flax method interceptor (name: "attention",
    "cross_attention", "mlp")."""

    def sublayer_output(self, name: str, h: jax.Array) -> jax.Array:  # [B, L, D] -> [B, L, D]
        return h


class Dense(nn.Module):
    """y = x . kernel + bias over the `axis` input dimensions; kernel and bias carry logical axes.

    kernel: [*x.shape[axis], *features], e.g. [D, H, K] for an attention projection. `deterministic` is for what
    intercepts a Dense (a Flax method interceptor installed by its caller) and drops out; the layer has no dropout.
    """
    features: int | tuple[int, ...]
    kernel_axes: tuple[str | None, ...]
    axis: int | tuple[int, ...] = -1
    use_bias: bool = True
    kernel_init: Initializer = truncated_normal(0.02)
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.nowrap
    def contracted(self, ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """-> (the input axes contracted, as non-negative indices into an input of `ndim` dims; the features)."""
        features = self.features if isinstance(self.features, tuple) else (self.features,)
        axis = self.axis if isinstance(self.axis, tuple) else (self.axis,)
        return tuple(a % ndim for a in axis), features

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        del deterministic  # see the class docstring
        axis, features = self.contracted(x.ndim)
        kernel = self.param("kernel", partitioned(self.kernel_init, self.kernel_axes),
                            tuple(x.shape[a] for a in axis) + features, self.param_dtype)
        y = ops.contract(x.astype(self.dtype), jnp.asarray(kernel, self.dtype), axis)
        if self.use_bias:
            bias = self.param("bias", partitioned(nn.initializers.zeros_init(), self.kernel_axes[-len(features):]),
                              features, self.param_dtype)
            y = y + jnp.asarray(bias, self.dtype)
        return y


class LayerNorm(nn.Module):
    """LayerNorm with statistics in float32 (bf16 ones are too coarse), output in `dtype`.
    use_bias=False: scale only (nanoGPT's bias=False models). Off a CPU the variance is E[x^2] - E[x]^2, one
    reduction (libtpu's estimate of BERT-Base's v5e step: 4.6 ms of 76 fewer); on a CPU E[(x - E[x])^2]."""
    epsilon: float = 1e-12
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    use_bias: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        scale = self.param("scale", partitioned(nn.initializers.ones_init(), ("embed",)), (features,),
                           self.param_dtype)
        x = x.astype(jnp.float32)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        if attention.platform() == "cpu":  # two passes over x: a CPU run's numbers as they always were
            var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        else:  # both sums in one pass, as flax's nn.LayerNorm (use_fast_variance): one reduction kernel, not two
            var = jnp.maximum(jnp.mean(jnp.square(x), axis=-1, keepdims=True) - jnp.square(mean), 0.0)
        y = (x - mean) * jax.lax.rsqrt(var + self.epsilon) * scale.astype(jnp.float32)
        if self.use_bias:
            y = y + self.param("bias", partitioned(nn.initializers.zeros_init(), ("embed",)), (features,),
                               self.param_dtype).astype(jnp.float32)
        return y.astype(self.dtype)


class RMSNorm(nn.Module):
    """T5's "LayerNorm" (Zhang & Sennrich 2019, RMSNorm): x / rms(x) * scale, no mean, no bias.

    Statistics in float32 (as Hugging Face's T5LayerNorm and t5x do), output in `dtype`.
    """
    epsilon: float = 1e-6
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", partitioned(nn.initializers.ones_init(), ("embed",)), (x.shape[-1],),
                           self.param_dtype)
        x = x.astype(jnp.float32)
        y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.epsilon)
        return (y * scale.astype(jnp.float32)).astype(self.dtype)


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

    def attend(self, x: jax.Array) -> jax.Array:  # [B, ..., D] -> [B, ..., num_embeddings]
        logits = ops.contract(x, jnp.asarray(self.embedding, self.dtype).T, (x.ndim - 1,))  # as a Dense contracts
        # Split over the batch like the input, whatever the table's sharding: left to itself, XLA's partitioner
        # gathered GPT-2 medium's whole [240, 1024, 50257] logits on every chip of a v5e:4x4 (50 GB each).
        return ops.split_rows(logits, "vocab")


def padding_mask(query_valid: jax.Array, key_valid: jax.Array) -> jax.Array:
    """[B, L] and [B, S] booleans -> [B, 1, L, S] mask (True = may attend)."""
    return query_valid[:, None, :, None] & key_valid[:, None, None, :]


# The dense segment and causal masks live beside attention.SegmentMask, which builds them from its parts.
segment_mask = attention.segment_mask
causal_mask = attention.causal_mask


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool = True, num_buckets: int = 32,
                             max_distance: int = 128) -> jax.Array:
    """T5's bucketing of relative positions (Mesh TensorFlow `_relative_position_bucket`): relative_position =
    key position - query position (ints, any shape) -> bucket ids in [0, num_buckets). Bidirectional: separate halves
    for keys before and after the query. Unidirectional (causal decoder): every key after the query falls in bucket 0
    (it is masked). Within a half, the first half of the buckets are the exact distances 0, 1, ...; the rest are
    logarithmically wider bins up to max_distance, beyond which all distances share the last bucket."""
    buckets = jnp.zeros(relative_position.shape, jnp.int32)
    if bidirectional:
        num_buckets //= 2
        buckets = (relative_position > 0).astype(jnp.int32) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        distance = jnp.maximum(-relative_position, 0)
    max_exact = num_buckets // 2
    # float32 like the reference implementations, so the bins agree at their edges; the maximum only
    # keeps log() away from 0 where the exact branch is taken anyway.
    scaled = (jnp.log(jnp.maximum(distance, max_exact).astype(jnp.float32) / max_exact)
              / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    large = jnp.minimum(max_exact + scaled.astype(jnp.int32), num_buckets - 1)
    return buckets + jnp.where(distance < max_exact, distance, large).astype(jnp.int32)


class RelativePositionBias(nn.Module):
    """T5's learned relative position bias (Raffel et al. 2020, Section 2.1): a scalar per head and bucket. The
    [buckets, H] table belongs to a whole stack: call this once and give the bias to every layer, as T5 does. It takes
    positions rather than indices so that packed rows, whose positions restart at 0 for each example, bucket by the
    distance inside their example."""
    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True
    embedding_init: Initializer = nn.initializers.normal(1.0)
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, query_positions: jax.Array,   # [B|1, L] int
                 key_positions: jax.Array) -> jax.Array:  # [B|1, S] int -> [B|1, H, L, S]
        table = self.param("embedding", partitioned(self.embedding_init, ("relpos_buckets", "heads")),
                           (self.num_buckets, self.num_heads), self.param_dtype)
        relative = key_positions[:, None, :] - query_positions[:, :, None]   # [B, L, S]
        buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        # A contraction with the one-hot buckets rather than a gather, as t5x does: the gather's gradient is a
        # scatter-add of every (query, key) pair into the same few buckets x H cells, which accelerators
        # serialise; the contraction's is a matmul. Each output sums one table entry times 1.0: exact.
        one_hot = jax.nn.one_hot(buckets, self.num_buckets, dtype=self.dtype)  # [B, L, S, buckets]
        return jnp.einsum("blsn,nh->bhls", one_hot, jnp.asarray(table, self.dtype))


class MultiHeadAttention(nn.Module):
    """Dot-product attention with per-head projections (self- or cross-attention), BERT or T5 style.

    BERT (the defaults): biases, queries scaled by 1/sqrt(K). T5 (Raffel et al. 2020, Mesh
    TensorFlow): use_bias=False, scale_query=False (the scaling is folded into the query
    initialiser) and a relative position `bias`. decode=True is incremental self-attention against
    a key/value cache in the 'cache' collection (the Flax examples / t5x pattern): see __call__.
    `attention` picks the implementation of softmax(q.k) . v (models/attention.py). fused_qkv: self-attention's
    query, key and value are one Dense `qkv` [D, 3, H, K], one matmul (models/qkv_layout.py converts weights).
    """
    num_heads: int
    head_dim: int
    dropout_rate: float = 0.0
    use_bias: bool = True
    scale_query: bool = True
    attention: str = "auto"
    kernel_init: Initializer = truncated_normal(0.02)   # all projections, unless given below
    query_kernel_init: Initializer | None = None
    out_kernel_init: Initializer | None = None
    fused_qkv: bool = False          # self-attention only: cross-attention's keys and values read another sequence
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array,                 # [B, L, D]
                 context: jax.Array | None = None,   # [B, S, D]; None = self-attention
                 mask: jax.Array | attention.SegmentMask | None = None,  # [B|1, 1, L, S] bool
                 bias: jax.Array | None = None,      # [B|1, H, L, S] additive (relative positions)
                 deterministic: bool = True,
                 decode: bool = False,
                 extra_keys_values: jax.Array | None = None,  # [2, P, H, K]: attended to first (past keys and values)
                 return_weights: bool = False,
                 rotary: tuple[jax.Array, jax.Array] | None = None,  # cos, sin [B|1, L, K]: RoPE on q and k
                 ) -> jax.Array | tuple[jax.Array, dict[str, jax.Array]]:
        """-> [B, L, D]. decode=True (self-attention only): when the cache does not exist yet (model.init, or an
        apply with mutable=['cache'] on a full-length [B, S_max, D] input) it is created empty with
        room for S_max keys and the call computes as usual. Every later call takes one token
        x [B, 1, D], stores its key/value at the row's cache index, and attends to keys 0..index
        (then `mask` and `bias` are [B|1, ., 1, S_max]).
        return_weights: -> ([B, L, D], {'scores' [B, H, L, S], 'probs' [B, H, L, S], 'values' [B, S, H, K]}), computed
        by the reference whatever `attention` says (attention.attention_with_weights): what distillation reads.
        rotary (self-attention, ModernBERT): rotary position embeddings (`rotary_embedding`) applied to the queries
        and keys, before any extra keys and values join (those have no position).
        """
        self_attention = context is None
        q, k, v = self._projections(x, x if self_attention else context, deterministic)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if decode and self_attention:
            k, v, mask = self._cached_keys_values(k, v, mask)
        if extra_keys_values is not None:  # P more keys and values, seen by every query (a dense mask)
            mask = attention.dense_mask(mask, q.shape[1], k.shape[1])
            k, v, mask, bias = attention.prepend_keys_values(k, v, mask, bias, extra_keys_values)

        dropout = None
        if self.dropout_rate > 0 and not deterministic:
            dropout = functools.partial(ops.Dropout(self.dropout_rate), deterministic=False)
        scale = self.head_dim ** -0.5 if self.scale_query else 1.0
        if return_weights:
            out, scores, probs = attention.attention_with_weights(q, k, v, mask, bias, scale=scale, dropout=dropout)
        else:
            out = attention.dot_product_attention(q, k, v, mask, bias, scale=scale, implementation=self.attention,
                                                  dropout=dropout)  # [B, L, H, K]
        out = self._dense("out", ("heads", "kv", "embed"), x.shape[-1], self.out_kernel_init, deterministic,
                          axis=(-2, -1))(out)
        return (out, {"scores": scores, "probs": probs, "values": v}) if return_weights else out

    def _dense(self, name: str, axes: tuple[str | None, ...], features, init: Initializer | None,
               deterministic: bool, **kwargs):
        module = Dense(features, axes, use_bias=self.use_bias, kernel_init=init or self.kernel_init, dtype=self.dtype,
                       param_dtype=self.param_dtype, name=name, **kwargs)
        return functools.partial(module, deterministic=deterministic)

    def _projections(self, x: jax.Array, context: jax.Array, deterministic: bool):
        """-> q [B, L, H, K], k and v [B, S, H, K]: three Dense layers, or with fused_qkv one (x is context)."""
        heads = (self.num_heads, self.head_dim)
        if not self.fused_qkv:
            return (self._dense("query", ("embed", "heads", "kv"), heads, self.query_kernel_init, deterministic)(x),
                    self._dense("key", ("embed", "heads", "kv"), heads, None, deterministic)(context),
                    self._dense("value", ("embed", "heads", "kv"), heads, None, deterministic)(context))
        if context is not x:
            raise ValueError("fused_qkv is for self-attention: give cross-attention separate projections")
        inits = (self.query_kernel_init or self.kernel_init, self.kernel_init, self.kernel_init)
        qkv = self._dense("qkv", ("embed", None, "heads", "kv"), (3, *heads), stacked_init(inits, axis=1),
                          deterministic)(x)
        return tuple(qkv[..., i, :, :] for i in range(3))  # [B, L, 3, H, K] -> three [B, L, H, K]

    def _cached_keys_values(self, k: jax.Array, v: jax.Array, mask: jax.Array | None):
        """k, v [B, 1, H, K] of the new token -> all cached keys/values [B, S_max, H, K] and the mask.

        The index is per row ([B]) so that beam search can gather every cache leaf along its batch axis.
        """
        initialized = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        index = self.variable("cache", "cache_index", lambda: jnp.zeros(k.shape[:1], jnp.int32))
        if not initialized:  # sizing call: nothing is stored
            return k, v, mask
        if k.shape[1] != 1:
            raise ValueError(f"decode=True takes one token per call, got {k.shape[1]} (run the full sequence "
                             "with decode=False)")
        slots = jnp.arange(cached_key.value.shape[1])[None, :]           # [1, S_max]
        here = (slots == index.value[:, None])[:, :, None, None]          # [B, S_max, 1, 1]
        if isinstance(mask, attention.SegmentMask):  # its causal part would mean positions of a full sequence
            raise ValueError("decode=True takes a dense [B|1, 1, 1, S_max] mask or None, not a SegmentMask")
        cached_key.value = jnp.where(here, k.astype(cached_key.value.dtype), cached_key.value)
        cached_value.value = jnp.where(here, v.astype(cached_value.value.dtype), cached_value.value)
        seen = (slots <= index.value[:, None])[:, None, None, :]           # [B, 1, 1, S_max]
        index.value = index.value + 1
        return cached_key.value, cached_value.value, seen if mask is None else mask & seen


def rotary_embedding(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """RoPE (Su et al. 2021), in the half-split layout of GPT-NeoX and Hugging Face: [B|1, L] positions ->
    cos, sin [B|1, L, K] in float32, frequency theta^(-2i/K) for i < K/2, each repeated for both halves."""
    inverse_frequency = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))  # [K/2]
    angles = positions.astype(jnp.float32)[..., None] * inverse_frequency                            # [B, L, K/2]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, L, H, K] rotated by cos, sin [B|1, L, K] (rotary_embedding): x cos + rotate_half(x) sin, with
    rotate_half(x) = [-x2, x1] for x's halves x1, x2; in x's dtype, as Hugging Face's apply_rotary_pos_emb casts
    cos and sin to it (in float32 a bf16 model's rotation was a fifth of ModernBERT-base's v5e step)."""
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    rotated = _rotate_half(x)  # first, as always: in another order XLA's CPU fusion rounds the sum differently
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


def _rotate_half(x: jax.Array) -> jax.Array:
    """[-x2, x1] for the halves x1, x2 of x's last axis: by slicing on a CPU; elsewhere as a matmul with the +-1
    permutation [[0, I], [-I, 0]] (exact), which a TPU runs on its matrix units instead of cutting its vectors'
    lanes in two (ModernBERT-base's v5e step: 1.59 -> 1.37 s by libtpu's estimates)."""
    half = x.shape[-1] // 2
    if attention.platform() == "cpu":  # a CPU run's numbers as they always were
        return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    eye, zero = jnp.eye(half, dtype=x.dtype), jnp.zeros((half, half), x.dtype)
    return jnp.einsum("blhk,kj->blhj", x, jnp.block([[zero, eye], [-eye, zero]]))


class MLP(nn.Module):
    """Position-wise feed-forward block D -> mlp_dim -> D; `gated` is the GLU variant.

    Gated (Shazeer 2020, "GLU Variants Improve Transformer"; T5 1.1's gated-GELU):
    activation(x W_intermediate) * (x W_intermediate_linear), then the output projection.
    Dropout on the hidden activations is T5's; BERT has none there (dropout_rate=0).
    """
    mlp_dim: int
    activation: Callable[[jax.Array], jax.Array] = nn.gelu
    use_bias: bool = True
    gated: bool = False
    dropout_rate: float = 0.0
    kernel_init: Initializer = truncated_normal(0.02)
    output_kernel_init: Initializer | None = None   # default: kernel_init
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:  # [B, L, D]
        kw = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype)
        h = Dense(self.mlp_dim, ("embed", "mlp"), kernel_init=self.kernel_init, name="intermediate", **kw)(
            x, deterministic)
        h = stack.mlp_activation(self.activation(h))
        if self.gated:
            h = h * Dense(self.mlp_dim, ("embed", "mlp"), kernel_init=self.kernel_init,
                          name="intermediate_linear", **kw)(x)
        h = ops.Dropout(self.dropout_rate)(h, deterministic=deterministic)
        return Dense(x.shape[-1], ("mlp", "embed"), kernel_init=self.output_kernel_init or self.kernel_init,
                     name="output", **kw)(h, deterministic)


def exact_gelu(x: jax.Array) -> jax.Array:
    """BERT's GELU is the erf form, not the tanh approximation."""
    return nn.gelu(x, approximate=False)


def tanh_gelu(x: jax.Array) -> jax.Array:
    """GELU's tanh approximation: T5 1.1's gated-GELU (Hugging Face calls it "gelu_new")."""
    return nn.gelu(x, approximate=True)


ACTIVATIONS = {"gelu": exact_gelu, "gelu_new": tanh_gelu}  # Hugging Face's hidden_act names -> the function
