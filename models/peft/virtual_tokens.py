"""Prefix-tuning and prompt tuning: P virtual tokens in front of the input.

- prefix (Li & Liang 2021, "Prefix-Tuning"): every attention layer attends to P extra key/value pairs
  before the sequence's own. During training they come from a reparameterization (Section 4.3):
  P' [P, D] -> Linear(D, hidden) -> tanh -> Linear(hidden, layers * 2 * H * K); hidden_size=0 trains the
  key/value table itself.
- prompt (Lester et al. 2021, "The Power of Scale for Parameter-Efficient Prompt Tuning"): P trainable
  input embeddings before the token embeddings; the rest of the model sees a longer input.

Each is a module built beside the base model, in its scope (models/peft/model.py): `prefix_encoder` gives the keys
and values the base model takes as `keys_values` (past keys and values), `prompt` the embeddings it takes as `leading`
(inputs_embeds in front); the model does the rest (positions, segments, masks: models/bert.py, gpt.py, t5.py).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models.layers import Dense
from models.peft.methods import PEFT_METHODS, PeftMethod


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
    def __call__(self, batch: int | None = None) -> jax.Array:  # the same keys and values for every row
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


def sample_vocabulary(embedding: np.ndarray, length: int, seed: int) -> np.ndarray:
    """[V, D] embedding table -> [length, D]: the rows of `length` distinct token ids drawn uniformly (peft's
    SAMPLE_VOCAB; Lester et al. drew from the 5,000 most common tokens, which a vocabulary file does not say)."""
    rows = np.random.default_rng(seed).choice(embedding.shape[0], size=length, replace=False)
    return np.asarray(embedding)[rows]


def prefix_encoder(peft, dims, kwargs: dict) -> PrefixEncoder:
    """Every self-attention layer's P keys and values (T5: the decoder's), from the reparameterization."""
    return PrefixEncoder(peft.prefix_length, dims.layers, dims.heads, dims.head_dim, dims.width,
                         peft.prefix_hidden_size, **kwargs)


def prompt(peft, dims, kwargs: dict) -> Prompt:
    return Prompt(peft.prompt_length, dims.width, **kwargs)


# The names are peft's (prefix_encoder, prompt), under the base model's own: its checkpoints load as they are.
PEFT_METHODS.register("prefix", PeftMethod(tokens=prefix_encoder, tokens_name="prefix_encoder", feeds="keys_values",
                                           length_field="prefix_length"))
PEFT_METHODS.register("prompt", PeftMethod(tokens=prompt, tokens_name="prompt", feeds="leading",
                                           length_field="prompt_length", prompt_from_vocabulary=True))
