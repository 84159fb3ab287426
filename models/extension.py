"""The model families' generic extension points: where a fine-tuning method attaches without the family naming it
(models/peft/ attaches the parameter-efficient methods here).

An extension comes with a model's config as a Flax method interceptor (`config.interceptor`,
models/config_base.py; flax.linen.intercept_methods). A model's entry methods (any that `Module.apply` may name)
are `@attached`: they run under it, installed once however they nest. It runs inside each intercepted module's
own call, so it may create parameters and submodules there, and acts, by method and module name, at:
- `Sublayers.sublayer_output(name, h)`: a layer's sub-layer output [B, L, D] (dropped out) on its way into the
  residual stream; the identity. The sub-layers: "attention", "cross_attention" (T5's decoder), "mlp".
- `Leading.leading_tokens(batch, decode)`: tokens in front of the input, as embeddings [B, P, D] that lead the
  sequence (at positions 0..P-1, the input's moved up by P), or as keys and values [layers, 2, P, H, K] that
  every self-attention layer attends to before the sequence's own (the input's positions start at P);
  (None, None) here. A compact method: what attaches there may create the model's own children.
- any module's `__call__`: e.g. the projections (layers.Dense) under layers.MultiHeadAttention and layers.MLP,
  by their names (query, key, value, qkv, out, intermediate, output).
"""
from __future__ import annotations

import contextvars
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

SUBLAYER_OUTPUT = "sublayer_output"
LEADING_TOKENS = "leading_tokens"
_ATTACHED: contextvars.ContextVar[tuple] = contextvars.ContextVar("attached_interceptors", default=())


def attached(method: Callable) -> Callable:
    """Decorates a model's entry method: it runs under its config's interceptor, if any; once, however entry
    methods nest (T5.__call__ runs encode and decode; an interceptor installed twice would act twice)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        interceptor = self.config.interceptor
        if interceptor is None or interceptor in _ATTACHED.get():
            return method(self, *args, **kwargs)
        token = _ATTACHED.set(_ATTACHED.get() + (interceptor,))
        try:
            with nn.intercept_methods(interceptor):
                return method(self, *args, **kwargs)
        finally:
            _ATTACHED.reset(token)
    return run


class Sublayers(nn.Module):
    """A Transformer layer whose sub-layers' outputs are extension points."""

    def sublayer_output(self, name: str, h: jax.Array) -> jax.Array:  # [B, L, D] -> [B, L, D]
        """Sub-layer `name`'s output, dropped out, where it joins the residual stream: as it is."""
        return h


class Leading(nn.Module):
    """A model that takes tokens in front of its input from an extension."""

    @nn.compact
    def leading_tokens(self, batch: int, decode: bool = False) -> tuple[jax.Array | None, jax.Array | None]:
        """-> (embeddings [B, P, D] | None, keys and values [layers, 2, P, H, K] | None): none here. decode: the
        input comes one token per call against a cache (which holds no leading embeddings)."""
        return None, None


def intercepts(context, method_name: str, module_class: type) -> bool:
    """Whether an interceptor's `context` is a call of `method_name` on a `module_class` (the extension point it
    acts at); every other call passes through."""
    return context.method_name == method_name and isinstance(context.module, module_class)


def sublayer_output_inputs(name: str, h: jax.Array) -> tuple[str, jax.Array]:
    """A `sublayer_output` call's arguments, however they were passed (for an interceptor)."""
    return name, h


def leading_tokens_inputs(batch: int, decode: bool = False) -> tuple[int, bool]:
    """A `leading_tokens` call's arguments, however they were passed (for an interceptor)."""
    return batch, decode


def leading_count(embeddings: jax.Array | None, keys_values: jax.Array | None) -> int:
    """P: the positions the leading tokens take in front of the input (0: none)."""
    if embeddings is not None:
        return embeddings.shape[1]
    return 0 if keys_values is None else keys_values.shape[2]


def prepend_positions(positions: jax.Array, length: int) -> jax.Array:
    """[B|1, L] positions -> [B|1, P + L]: the P leading positions 0..P-1 first, the input's moved up by P."""
    virtual = jnp.broadcast_to(jnp.arange(length, dtype=positions.dtype), positions.shape[:1] + (length,))
    return jnp.concatenate([virtual, positions + length], axis=1)
