"""Token-level losses shared by the objectives that predict tokens (BERT's MLM, T5 denoising, causal and prefix LM)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def token_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array, z_loss: float = 0.0
                        ) -> dict[str, jax.Array]:
    """Weighted means over tokens of -log softmax(logits)[target], z_loss * log(Z)^2 (t5x's
    `cross_entropy_with_logits`) and argmax accuracy.

    logits [B, L, V] (computed in float32), targets [B, L] int, weights [B, L] -> {'cross_entropy',
    'z_loss', 'accuracy'} scalars; an all-zero weight batch gives 0, not NaN. Shared by BERT's MLM
    (objectives/mlm.py), T5 (objectives/denoising.py) and GPT (objectives/causal_lm.py).
    """
    logits = logits.astype(jnp.float32)
    weights = weights.astype(jnp.float32)
    # Every quantity is a reduction over the vocabulary that XLA fuses with its siblings: the target's logit as a
    # masked sum rather than a gather (on a v5e the gather read GPT-2's whole [30, 1024, 50257] float32 logits
    # again, 23 of the step's 259 GiB), beside the peak and the argmax; then the exponentials' sum.
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    target_logit = jnp.where(vocab == targets[..., None], logits, 0.0).sum(axis=-1)  # [B, L]
    peak = jax.lax.stop_gradient(logits.max(axis=-1))
    log_z = peak + jnp.log(jnp.exp(logits - peak[..., None]).sum(axis=-1))  # [B, L]
    denom = jnp.maximum(weights.sum(), 1.0)
    return {
        "cross_entropy": ((log_z - target_logit) * weights).sum() / denom,
        "z_loss": z_loss * (jnp.square(log_z) * weights).sum() / denom,
        "accuracy": ((jnp.argmax(logits, axis=-1) == targets) * weights).sum() / denom,
    }


def soft_target_kl(student_logits: jax.Array, teacher_logits: jax.Array, weights: jax.Array, temperature: float
                   ) -> jax.Array:
    """Hinton et al. (2015)'s soft-target loss: T^2 * KL(softmax(teacher / T) || softmax(student / T)), the weighted
    mean over positions. The T^2 keeps its gradients' scale independent of T (Section 2). logits [..., C] (computed
    in float32), weights [...] (0: padding) -> scalar; all-zero weights give 0. Shared by DistilBERT's objective
    (objectives/distillation/objective.py) and task distillation in fine-tuning (objectives/task_heads/classification.py)."""
    log_p_student = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    log_p_teacher = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    kl = (jnp.exp(log_p_teacher) * (log_p_teacher - log_p_student)).sum(axis=-1)
    weights = weights.astype(jnp.float32)
    return temperature ** 2 * (kl * weights).sum() / jnp.maximum(weights.sum(), 1.0)
