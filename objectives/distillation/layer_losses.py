"""TinyBERT's and MiniLM's losses between the insides of a student and of its teacher (models/distillation/model.py
returns them when objectives/distillation/objective.py asks). Every one reads a batch with padding: a padded token is
neither a query (its row is left out of the mean) nor a key (its column is masked, or left out of the mean).

MiniLM (Wang et al. 2020, "MiniLM: Deep Self-Attention Distillation", Section 3.1), on the last layers:
- `attention_kl`: KL(A_teacher || A_student) of the attention distributions A = softmax(q.k / sqrt(d_k)),
  summed over the keys, averaged over the heads and the real query tokens (Eq. 5: 1 / (A_h |x|) sum_a sum_t).
- `value_relation_kl`: the same KL of the value relations VR = softmax(V V^T / sqrt(d_k)) (Eq. 6-7), each model
  with its own head size d_k.
TinyBERT (Jiao et al. 2020, "TinyBERT: Distilling BERT for Natural Language Understanding", Section 3.1):
- `attention_mse`: per layer pair (m, g(m)), the MSE of the unnormalised attention scores q.k / sqrt(d_k), summed
  over the pairs (Eq. 3, summed as in Eq. 6). The paper distils the unnormalised scores ("faster convergence"),
  and so does its released code (general_distill.py), which replaces masked entries with 0 and averages over
  every entry of [B, H, L, L]. Here the mean runs over the heads and the (query, key) pairs of real tokens: the
  same number on a batch without padding, and one that padding does not dilute.
- `hidden_mse`: per layer pair, the MSE of the student's states through W_h against the teacher's (Eq. 4), over
  the real tokens and the teacher's width, summed over the pairs; with W_e and the embedding outputs, Eq. 5.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _masked_log_softmax(logits: jax.Array, key_mask: jax.Array) -> jax.Array:
    """logits [B, H, L, S], key_mask [B, S] (1: a real token) -> log-probabilities over the real keys. A masked key
    gets float32's lowest logit, as the reference attention gives it: its probability is 0, and its log stays
    finite, so 0 * (a difference of logs) is 0 rather than NaN."""
    masked = jnp.where(key_mask[:, None, None, :].astype(bool), logits.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    return jax.nn.log_softmax(masked, axis=-1)


def _kl_over_real_queries(logits: jax.Array, teacher_logits: jax.Array, mask: jax.Array) -> jax.Array:
    """sum over the keys of KL(softmax(teacher) || softmax(student)), averaged over the heads and the real queries:
    logits [B, H, L, S] each, mask [B, L] (L = S)."""
    log_p, log_q = _masked_log_softmax(teacher_logits, mask), _masked_log_softmax(logits, mask)
    kl = (jnp.exp(log_p) * (log_p - log_q)).sum(-1)  # [B, H, L]
    queries = mask.astype(jnp.float32)[:, None, :]
    return (kl * queries).sum() / (kl.shape[1] * jnp.maximum(queries.sum(), 1.0))


def attention_kl(scores: jax.Array, teacher_scores: jax.Array, mask: jax.Array) -> jax.Array:
    """MiniLM's attention transfer: scores [B, H, L, L] (scaled q.k before the mask) of the student's and the
    teacher's last layers, mask [B, L] -> a scalar. The heads pair up one by one: the same number in both."""
    return _kl_over_real_queries(scores, teacher_scores, mask)


def value_relation(values: jax.Array) -> jax.Array:
    """values [B, L, H, K] -> the unnormalised value relation V V^T / sqrt(K) [B, H, L, L] (MiniLM, Eq. 6)."""
    values = values.astype(jnp.float32)
    return jnp.einsum("blhk,bshk->bhls", values, values) / jnp.sqrt(jnp.float32(values.shape[-1]))


def value_relation_kl(values: jax.Array, teacher_values: jax.Array, mask: jax.Array) -> jax.Array:
    """MiniLM's value-relation transfer: values [B, L, H, K] and [B, L, H, K_teacher] of the last layers, mask [B, L]
    -> a scalar."""
    return _kl_over_real_queries(value_relation(values), value_relation(teacher_values), mask)


def attention_mse(scores: jax.Array, teacher_scores: jax.Array, mask: jax.Array) -> jax.Array:
    """TinyBERT's attention loss: scores [M, B, H, L, L] of the student's layers and the teacher's mapped ones, mask
    [B, L] -> the sum over the M pairs of the mean squared difference over the heads and the real (query, key) pairs."""
    pairs = (mask[:, None, :, None] * mask[:, None, None, :]).astype(jnp.float32)  # [B, 1, L, L]
    error = jnp.square(scores.astype(jnp.float32) - teacher_scores.astype(jnp.float32)) * pairs
    per_pair = error.sum(axis=(-4, -3, -2, -1)) / (scores.shape[-3] * jnp.maximum(pairs.sum(), 1.0))  # [M]
    return per_pair.sum()


def hidden_mse(states: jax.Array, teacher_states: jax.Array, mask: jax.Array) -> jax.Array:
    """TinyBERT's hidden-state (or embedding) loss: states [..., B, L, D] already through W_h (W_e), the teacher's
    the same shape, mask [B, L] -> the sum over the leading axes (the layer pairs, if any) of the mean squared
    difference over the real tokens and the D features."""
    error = jnp.square(states.astype(jnp.float32) - teacher_states.astype(jnp.float32)).mean(-1)  # [..., B, L]
    tokens = mask.astype(jnp.float32)
    return ((error * tokens).sum(axis=(-2, -1)) / jnp.maximum(tokens.sum(), 1.0)).sum()
