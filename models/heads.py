"""Output heads that sit on an encoder: BERT's masked-LM and next-sentence-prediction heads.

Fine-tuning heads (classification, tagging, span, QA) and SpanBERT's SBO head join this file.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers


def gather_positions(sequence: jax.Array, positions: jax.Array) -> jax.Array:
    """[B, L, D] hidden states, [B, P] positions -> [B, P, D]."""
    return jnp.take_along_axis(sequence, positions[..., None], axis=1)


class MaskedLMHead(nn.Module):
    """Dense + GELU + LayerNorm, then a decoder tied to the word embeddings plus an output bias.

    Only the P masked positions are projected onto the vocabulary, which is where most of the
    head's FLOPs would otherwise go (BERT's `max_predictions_per_seq` trick).
    """
    vocab_size: int
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dtype: layers.Dtype = jnp.float32
    param_dtype: layers.Dtype = jnp.float32

    @nn.compact
    def __call__(self, hidden: jax.Array,            # [B, P, D] states at masked positions
                 word_embeddings: layers.Embed) -> jax.Array:  # -> [B, P, V] float32 logits
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        h = layers.Dense(hidden.shape[-1], ("embed", "embed_out"), name="transform",
                         kernel_init=layers.truncated_normal(self.initializer_range), **kw)(hidden)
        h = layers.exact_gelu(h)
        h = layers.LayerNorm(self.layer_norm_eps, name="transform_norm", **kw)(h)
        logits = word_embeddings.attend(h)
        bias = self.param("bias", layers.partitioned(nn.initializers.zeros_init(), ("vocab",)),
                          (self.vocab_size,), self.param_dtype)
        return logits.astype(jnp.float32) + bias.astype(jnp.float32)


class ClassifierHead(nn.Module):
    """Linear layer on the pooled [CLS] vector (NSP uses num_classes=2)."""
    num_classes: int
    initializer_range: float = 0.02
    dtype: layers.Dtype = jnp.float32
    param_dtype: layers.Dtype = jnp.float32

    @nn.compact
    def __call__(self, pooled: jax.Array) -> jax.Array:  # [B, D] -> [B, num_classes] float32
        return layers.Dense(self.num_classes, ("embed", "classes"), name="classifier",
                            kernel_init=layers.truncated_normal(self.initializer_range),
                            dtype=self.dtype, param_dtype=self.param_dtype)(pooled).astype(jnp.float32)
