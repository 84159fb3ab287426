"""Output heads that sit on an encoder: BERT's masked-LM and next-sentence-prediction heads,
SpanBERT's span boundary head, then the fine-tuning heads (sequence classification, BIO tagging,
span classification, extractive QA).
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers, ops


def gather_positions(sequence: jax.Array, positions: jax.Array) -> jax.Array:
    """[B, L, D] hidden states, [B, P] positions -> [B, P, D]."""
    return jnp.take_along_axis(sequence, positions[..., None], axis=1)


class MaskedLMHead(nn.Module):
    """Dense + GELU + LayerNorm, then a decoder tied to the word embeddings plus an output bias. The Dense
    maps the encoder's width to the embeddings' (`width`: ALBERT's and ELECTRA's E; None: the same width).

    Only the P masked positions are projected onto the vocabulary, which is where most of the
    head's FLOPs would otherwise go (BERT's `max_predictions_per_seq` trick).
    """
    vocab_size: int
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    width: int | None = None
    activation: Callable[[jax.Array], jax.Array] = layers.exact_gelu
    dtype: layers.Dtype = jnp.float32
    param_dtype: layers.Dtype = jnp.float32

    @nn.compact
    def __call__(self, hidden: jax.Array,            # [B, P, D] states at masked positions
                 word_embeddings: layers.Embed) -> jax.Array:  # -> [B, P, V] float32 logits
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        h = layers.Dense(self.width or hidden.shape[-1], ("embed", "embed_out"), name="transform",
                         kernel_init=layers.truncated_normal(self.initializer_range), **kw)(hidden)
        h = self.activation(h)
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


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span boundary objective (SBO; Joshi et al., 2020, Section 3.2; J&M eq. 11.9-11.10).

    Each token x_i of a masked span (s..e) is predicted from the encoder outputs just outside the
    span and an embedding of its relative position: s_i = FFNN([y_{s-1}; y_{e+1}; p_i]),
    z_i = softmax(E s_i + b). The FFNN is the paper's two layers of Dense -> GeLU -> LayerNorm; its
    second layer and the tied decoder are exactly a `MaskedLMHead` (with its own weights), so that
    head is reused rather than restated. The position table is D wide (the paper's code used 200)
    and holds `max_span_tokens` positions; later positions of longer spans share the last one.
    """
    vocab_size: int
    max_span_tokens: int
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dtype: layers.Dtype = jnp.float32
    param_dtype: layers.Dtype = jnp.float32

    @nn.compact
    def __call__(self, left: jax.Array,           # [B, P, D] y_{s-1}: state before each token's span
                 right: jax.Array,                 # [B, P, D] y_{e+1}: state after it
                 span_position: jax.Array,         # [B, P] int, 1-based position of the token in its span
                 word_embeddings: layers.Embed) -> jax.Array:  # -> [B, P, V] float32 logits
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        init = layers.truncated_normal(self.initializer_range)
        width = left.shape[-1]
        table = layers.Embed(self.max_span_tokens, width, "positions", init, name="position_embeddings", **kw)
        # Clipped explicitly: an out-of-range jnp.take would silently return NaNs.
        position = table(jnp.clip(span_position - 1, 0, self.max_span_tokens - 1))
        h = jnp.concatenate([left.astype(self.dtype), right.astype(self.dtype), position], axis=-1)  # [B, P, 3D]
        h = layers.Dense(width, ("embed", "embed_out"), name="boundary_transform", kernel_init=init, **kw)(h)
        h = layers.LayerNorm(self.layer_norm_eps, name="boundary_transform_norm", **kw)(layers.exact_gelu(h))
        return MaskedLMHead(self.vocab_size, self.initializer_range, self.layer_norm_eps, name="decoder",
                            **kw)(h, word_embeddings)


# ------------------------------------------------------------------------------ fine-tuning heads
# J&M ch. 11: sequence classification reads the pooled [CLS] vector, tagging classifies every
# token (eq. 11.12), span tasks classify spanRep_ij (eq. 11.16, 11.21), extractive QA scores every
# token as an answer start and end. Logits leave every head in float32 (softmax / argmax / MSE).


class SequenceClassificationHead(nn.Module):
    """dropout -> Dense(num_labels) on the pooled [CLS] vector; num_labels=1 is regression (STS-B)."""
    num_labels: int
    dropout_rate: float = 0.1
    initializer_range: float = 0.02
    dtype: layers.Dtype = jnp.float32
    param_dtype: layers.Dtype = jnp.float32

    @nn.compact
    def __call__(self, pooled: jax.Array, deterministic: bool) -> jax.Array:  # [B, D] -> [B, num_labels]
        x = ops.Dropout(self.dropout_rate)(pooled, deterministic=deterministic)
        return layers.Dense(self.num_labels, ("embed", "classes"), name="classifier",
                            kernel_init=layers.truncated_normal(self.initializer_range),
                            dtype=self.dtype, param_dtype=self.param_dtype)(x).astype(jnp.float32)


class TokenClassificationHead(SequenceClassificationHead):
    """BIO tagging (J&M eq. 11.12): the same dropout -> Dense, at every position: [B, L, D] -> [B, L, labels]."""


def span_representation(sequence: jax.Array, spans: jax.Array) -> jax.Array:
    """spanRep_ij = [h_i; h_j; g_ij] with g_ij = mean(h_i..h_j) (J&M eq. 11.15-11.16).

    sequence: [B, L, D]; spans: [B, S, 2] int, inclusive (start, end). Returns [B, S, 3D] in
    sequence.dtype. The span sums come from one prefix sum, sum(h_i..h_j) = C[j+1] - C[i], so the
    cost is O(L + S) per row instead of O(S * L) for masked means; the sum is kept in float32
    since bf16 prefix sums lose the small differences. Indices are clipped into [0, L) and an
    empty span (end < start, e.g. padding) averages over one token, so padding never makes NaNs.
    """
    L = sequence.shape[1]
    start = jnp.clip(spans[..., 0], 0, L - 1)                     # [B, S]
    end = jnp.clip(spans[..., 1], 0, L - 1)                       # [B, S]
    h = sequence.astype(jnp.float32)
    csum = jnp.pad(jnp.cumsum(h, axis=1), ((0, 0), (1, 0), (0, 0)))  # [B, L+1, D]; csum[:, k] = sum h[:k]
    total = gather_positions(csum, end + 1) - gather_positions(csum, start)  # [B, S, D]
    count = jnp.maximum(end - start + 1, 1).astype(jnp.float32)[..., None]
    mean = (total / count).astype(sequence.dtype)
    return jnp.concatenate([gather_positions(sequence, start), gather_positions(sequence, end), mean], axis=-1)


def attentive_span_summary(sequence: jax.Array, scores: jax.Array, spans: jax.Array) -> jax.Array:
    """g_ij = SelfATTN(h_i..h_j) (J&M eq. 11.20), as Lee et al. (2017) find a span's head: a softmax of one
    learned score per token, taken over the span's tokens only, weights the span's states.

    sequence: [B, L, D]; scores: [B, L]; spans: [B, S, 2] inclusive. Returns [B, S, D] in sequence.dtype; an
    empty span (padding) attends to its start token alone, so it never divides by zero.
    """
    positions = jnp.arange(sequence.shape[1])
    start, end = spans[..., :1], jnp.maximum(spans[..., 1:], spans[..., :1])            # [B, S, 1]
    inside = (positions >= start) & (positions <= end)                                 # [B, S, L]
    weights = jax.nn.softmax(jnp.where(inside, scores[:, None, :].astype(jnp.float32), -jnp.inf), axis=-1)
    return jnp.einsum("bsl,bld->bsd", weights, sequence.astype(jnp.float32)).astype(sequence.dtype)


class SpanClassificationHead(nn.Module):
    """y_ij = softmax(FFNN(spanRep_ij)) (J&M eq. 11.21): dropout -> Dense -> GELU -> dropout -> Dense.

    spanRep_ij = [boundaries; summary]. boundaries="token": h_i and h_j (eq. 11.16); "ffnn": s_i =
    FFNN_start(h_i) and e_j = FFNN_end(h_j), two learned Dense -> GELU layers (eqs. 11.17-11.19).
    summary="mean": the average of h_i..h_j (eq. 11.15); "attention": attentive_span_summary (eq. 11.20).
    hidden_size=0 uses the encoder width D. The hidden layer is unsharded like the pooler
    ("embed_out"): a head this small is not worth splitting, and any hidden size then works.
    """
    num_labels: int
    hidden_size: int = 0
    dropout_rate: float = 0.1
    boundaries: str = "token"     # token | ffnn
    summary: str = "mean"         # mean | attention
    initializer_range: float = 0.02
    dtype: layers.Dtype = jnp.float32
    param_dtype: layers.Dtype = jnp.float32

    @nn.compact
    def __call__(self, sequence: jax.Array,   # [B, L, D]
                 spans: jax.Array,            # [B, S, 2] int inclusive (start, end)
                 deterministic: bool) -> jax.Array:  # -> [B, S, num_labels] float32
        kw = {"kernel_init": layers.truncated_normal(self.initializer_range),
              "dtype": self.dtype, "param_dtype": self.param_dtype}
        dropout = ops.Dropout(self.dropout_rate)
        x = self.representation(sequence, spans, kw)                          # [B, S, 3D]
        self.sow("intermediates", "span_representation", x)  # for tests and probes (apply(mutable=...))
        x = dropout(x, deterministic=deterministic)
        x = layers.Dense(self.hidden_size or sequence.shape[-1], ("embed", "embed_out"), name="hidden", **kw)(x)
        x = dropout(layers.exact_gelu(x), deterministic=deterministic)
        return layers.Dense(self.num_labels, ("embed_out", "classes"), name="classifier", **kw)(x).astype(jnp.float32)

    def representation(self, sequence: jax.Array, spans: jax.Array, kw: dict) -> jax.Array:
        """[B, L, D], [B, S, 2] -> spanRep [B, S, 3D] as `boundaries` and `summary` choose."""
        if self.boundaries not in ("token", "ffnn") or self.summary not in ("mean", "attention"):
            raise ValueError(f"span head: boundaries={self.boundaries!r} (token | ffnn), summary={self.summary!r} "
                             "(mean | attention)")
        start_end_mean = span_representation(sequence, spans)
        width = sequence.shape[-1]
        if self.boundaries == "token":
            boundaries = start_end_mean[..., :2 * width]
        else:
            L = sequence.shape[1]

            def ffnn(name: str, positions: jax.Array) -> jax.Array:
                h = gather_positions(sequence, jnp.clip(positions, 0, L - 1))
                return layers.exact_gelu(layers.Dense(width, ("embed", "embed_out"), name=name, **kw)(h))
            boundaries = jnp.concatenate([ffnn("start_ffnn", spans[..., 0]), ffnn("end_ffnn", spans[..., 1])], -1)
        if self.summary == "mean":
            summary = start_end_mean[..., 2 * width:]
        else:
            scores = layers.Dense(1, ("embed", "classes"), name="attention_score", **kw)(sequence)[..., 0]
            summary = attentive_span_summary(sequence, scores, jnp.clip(spans, 0, sequence.shape[1] - 1))
        return jnp.concatenate([boundaries.astype(sequence.dtype), summary.astype(sequence.dtype)], -1)


class QuestionAnsweringHead(nn.Module):
    """Extractive QA (BERT on SQuAD): Dense(2) at every position = start and end logits."""
    initializer_range: float = 0.02
    dtype: layers.Dtype = jnp.float32
    param_dtype: layers.Dtype = jnp.float32

    @nn.compact
    def __call__(self, sequence: jax.Array) -> tuple[jax.Array, jax.Array]:  # [B, L, D] -> 2 x [B, L]
        logits = layers.Dense(2, ("embed", "classes"), name="qa_outputs",
                              kernel_init=layers.truncated_normal(self.initializer_range),
                              dtype=self.dtype, param_dtype=self.param_dtype)(sequence).astype(jnp.float32)
        return logits[..., 0], logits[..., 1]
