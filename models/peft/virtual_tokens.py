"""Prefix-tuning and prompt tuning: P virtual tokens in front of the input.

- prefix (Li & Liang 2021, "Prefix-Tuning"): every attention layer attends to P extra key/value pairs
  before the sequence's own. During training they come from a reparameterization (Section 4.3):
  P' [P, D] -> Linear(D, hidden) -> tanh -> Linear(hidden, layers * 2 * H * K); hidden_size=0 trains the
  key/value table itself.
- prompt (Lester et al. 2021, "The Power of Scale for Parameter-Efficient Prompt Tuning"): P trainable
  input embeddings before the token embeddings; the rest of the model sees a longer input.

`VirtualTokenInterceptor` attaches either at a model's `leading_tokens` (models/extension.py `Leading`): the
model's child `prefix_encoder` gives the keys and values, its child `prompt` the embeddings; the model
does the rest (positions, segments, masks: models/bert.py, gpt.py, t5.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models import extension
from models.errors import ModelInputError
from models.layers import Dense


class PrefixEncoder(nn.Module):
    """-> [layers, 2, P, H, K]: each layer's P prefix keys ([:, 0]) and values ([:, 1]).

    As Li & Liang's code and peft's PrefixEncoder: with hidden_size > 0 an embedding [P, D] goes through
    Linear(D, hidden) -> tanh -> Linear(hidden, layers * 2 * H * K); otherwise the embedding is
    [P, layers * 2 * H * K] itself. The flat last axis is ordered (layer, key/value, head, head dim),
    peft's order, so its weights load as they are.
    """
    length: int
    num_layers: int
    num_heads: int
    head_dim: int
    width: int                 # D, the reparameterization's input width
    hidden_size: int = 0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self) -> jax.Array:
        out = self.num_layers * 2 * self.num_heads * self.head_dim
        init = nn.initializers.normal(1.0)  # torch.nn.Embedding's init, as peft's
        if self.hidden_size:
            table = self.param("embedding", nn.with_logical_partitioning(init, (None, "embed")),
                               (self.length, self.width), self.param_dtype)
            kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
            h = Dense(self.hidden_size, ("embed", "mlp"), name="transform", **kw)(jnp.asarray(table, self.dtype))
            h = jnp.tanh(h)
            flat = Dense(out, ("mlp", None), name="output", **kw)(h)
        else:
            flat = jnp.asarray(self.param("embedding", nn.with_logical_partitioning(init, (None, None)),
                                          (self.length, out), self.param_dtype), self.dtype)
        flat = flat.reshape(self.length, self.num_layers, 2, self.num_heads, self.head_dim)
        return jnp.transpose(flat, (1, 2, 0, 3, 4))


class Prompt(nn.Module):
    """The P trainable input embeddings [P, D] of prompt tuning. Initialized N(0, 1) here; fine-tuning from a
    pretrained model replaces them by embeddings of sampled vocabulary entries (Lester et al. 2021, Section
    3: "initialize each prompt token to an embedding drawn from the model's vocabulary"), `sample_vocabulary`."""
    length: int
    width: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, batch: int) -> jax.Array:  # -> [B, P, D]
        table = self.param("embedding", nn.with_logical_partitioning(nn.initializers.normal(1.0), (None, "embed")),
                           (self.length, self.width), self.param_dtype)
        return jnp.broadcast_to(jnp.asarray(table, self.dtype)[None], (batch, self.length, self.width))


@dataclasses.dataclass(frozen=True)
class VirtualTokenInterceptor:
    """The method interceptor (flax.linen.intercept_methods) of a PeftConfig with method 'prefix' or 'prompt'."""
    peft: Any  # models.peft.PeftConfig

    def __call__(self, next_fun, args, kwargs, context):
        if not extension.intercepts(context, extension.LEADING_TOKENS, extension.Leading):
            return next_fun(*args, **kwargs)
        next_fun(*args, **kwargs)  # the model's own: none
        batch, decode = extension.leading_tokens_inputs(*args, **kwargs)
        config, peft = context.module.config, self.peft
        dims, kwargs = config.dims, config.kwargs
        # Created inside the model's own call: its children prefix_encoder and prompt, as peft names them.
        if peft.method == "prefix":
            return None, PrefixEncoder(peft.prefix_length, dims.layers, dims.heads, dims.head_dim, dims.width,
                                       peft.prefix_hidden_size, name="prefix_encoder", **kwargs)()
        if decode:
            raise ModelInputError("decode=True with prompt tuning is not supported: its virtual tokens are not in "
                                  "the cache (use prefix-tuning or LoRA for generation)")
        return Prompt(peft.prompt_length, dims.width, name="prompt", **kwargs)(batch), None


def sample_vocabulary(embedding: np.ndarray, length: int, seed: int) -> np.ndarray:
    """[V, D] embedding table -> [length, D]: the rows of `length` distinct token ids drawn uniformly (peft's
    SAMPLE_VOCAB; Lester et al. drew from the 5,000 most common tokens, which a vocabulary file does not say)."""
    rows = np.random.default_rng(seed).choice(embedding.shape[0], size=length, replace=False)
    return np.asarray(embedding)[rows]
