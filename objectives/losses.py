"""Token-level losses shared by the sequence objectives (T5 denoising, causal and prefix LM)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def token_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array, z_loss: float = 0.0
                        ) -> dict[str, jax.Array]:
    """Weighted means over tokens of -log softmax(logits)[target], z_loss * log(Z)^2 (t5x's
    `cross_entropy_with_logits`) and argmax accuracy.

    logits [B, L, V] (computed in float32), targets [B, L] int, weights [B, L] -> {'cross_entropy',
    'z_loss', 'accuracy'} scalars; an all-zero weight batch gives 0, not NaN. Shared by the T5
    (objectives/denoising.py) and GPT (objectives/causal_lm.py) objectives.
    """
    logits = logits.astype(jnp.float32)
    weights = weights.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)  # [B, L]
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    denom = jnp.maximum(weights.sum(), 1.0)
    return {
        "cross_entropy": ((log_z - target_logit) * weights).sum() / denom,
        "z_loss": z_loss * (jnp.square(log_z) * weights).sum() / denom,
        "accuracy": ((jnp.argmax(logits, axis=-1) == targets) * weights).sum() / denom,
    }
