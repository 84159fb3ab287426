"""Scaled dot-product attention, one function over several implementations (`model.attention`).

- "einsum": the reference: explicit logits, float32 softmax, dropout on the probabilities. The oracle the
  tests compare every other implementation against, and the only one that drops attention probabilities
  out (the fused kernels keep no [B, H, L, S] matrix to drop from).
- "xla": `jax.nn.dot_product_attention(implementation="xla")`: JAX's own composition, which XLA fuses;
  logits in float32 as here.
- "cudnn": the same function with `implementation="cudnn"`: cuDNN's flash attention (GPU only; float16
  or bfloat16 inputs, head dim a multiple of 8 up to 128).
- "auto": the fastest that applies: cuDNN on a GPU in half precision, XLA elsewhere; the reference
  wherever attention dropout is active (training with `attention_dropout_rate > 0`).

Shapes: B = batch, L = query length, S = key length, H = heads, K = head dim.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("auto", "einsum", "xla", "cudnn")


def choose(implementation: str, dtype, head_dim: int, dropout_active: bool) -> str:
    """`model.attention` -> the implementation that runs for this call (resolved at trace time)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    if dropout_active:
        if implementation in ("xla", "cudnn"):
            raise ValueError(f"attention={implementation!r} cannot drop attention probabilities out: set "
                             "attention_dropout_rate=0 or attention='auto' (which uses the reference einsum then)")
        return "einsum"
    if implementation != "auto":
        return implementation
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    if jax.default_backend() == "gpu" and half and head_dim % 8 == 0 and head_dim <= 128:
        return "cudnn"
    return "xla"


def dot_product_attention(q: jax.Array,                 # [B, L, H, K]
                          k: jax.Array,                 # [B, S, H, K]
                          v: jax.Array,                 # [B, S, H, K]
                          mask: jax.Array | None,       # [B|1, 1, L, S] bool, True = may attend
                          bias: jax.Array | None,       # [B|1, H, L, S] additive (T5's relative positions)
                          *, scale: float,
                          implementation: str = "auto",
                          dropout: Callable[[jax.Array], jax.Array] | None = None,  # on [B, H, L, S] weights
                          ) -> jax.Array:               # [B, L, H, K] in q's dtype
    """softmax(scale * q.k + bias, masked) . v with the implementation `choose` picks."""
    implementation = choose(implementation, q.dtype, q.shape[-1], dropout is not None)
    if implementation == "einsum":
        return _reference(q, k, v, mask, bias, scale, dropout)
    if bias is not None:
        bias = bias.astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                        implementation=implementation).astype(q.dtype)


def _reference(q, k, v, mask, bias, scale, dropout):
    if scale != 1.0:  # divide, as BERT and Hugging Face do, so that float32 results match theirs bit for bit
        q = q / jnp.asarray(1.0 / scale, q.dtype)
    logits = jnp.einsum("blhk,bshk->bhls", q, k).astype(jnp.float32)  # softmax in float32
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(q.dtype)
    if dropout is not None:
        weights = dropout(weights)
    return jnp.einsum("bhls,bshk->blhk", weights, v)
