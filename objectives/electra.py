"""ELECTRA's replaced-token detection (Clark et al., 2020): loss = MLM(generator) + disc_weight * BCE(disc).

Batches are BERT's single segments (objectives/bert_pretraining.py without NSP) masked as the paper's
code masks them: 15% of the tokens, 85% of those [MASK] and the rest left as they are, none random
(`replace_with_mask=0.85, replace_with_random=0.0` in configs/electra.py). The model (models/electra.py)
samples the replacements and labels the corrupted tokens; this module scores them. The discriminator's
loss is the sigmoid cross-entropy averaged over every real token, padding left out; disc_weight = 50
(the paper's lambda) because that loss is much smaller than the generator's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax

from objectives import mlm
from objectives.bert_pretraining import BertPretraining
from objectives.interface import ObjectiveError


def replaced_token_loss(logits: jax.Array, replaced: jax.Array, input_mask: jax.Array
                        ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """[B, L] discriminator logits, [B, L] labels (1 = replaced), [B, L] real tokens -> (mean sigmoid
    cross-entropy over real tokens, {'disc_loss', 'disc_accuracy', 'disc_replaced_recall', 'replaced_rate'})."""
    weights = input_mask.astype(jnp.float32)
    labels = replaced.astype(jnp.float32)
    denom = jnp.maximum(weights.sum(), 1.0)
    loss = (optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), labels) * weights).sum() / denom
    predicted = (logits > 0).astype(jnp.float32)
    replaced_weights = labels * weights
    return loss, {
        "disc_loss": loss,
        "disc_accuracy": ((predicted == labels) * weights).sum() / denom,
        "disc_replaced_recall": (predicted * replaced_weights).sum() / jnp.maximum(replaced_weights.sum(), 1.0),
        "replaced_rate": replaced_weights.sum() / denom,  # how often the generator's sample was not the original
    }


class ElectraPretraining(BertPretraining):
    """Objective "electra": BERT's instances and dynamic masking, ELECTRA's loss."""

    def __init__(self, config: ml_collections.ConfigDict, tokenizer, *, long_phase: bool = False):
        if config.next_sentence:
            raise ObjectiveError("objective 'electra' has no next-sentence task: set "
                                 "config.objective.next_sentence=False")
        if config.disc_weight <= 0:
            raise ObjectiveError(f"config.objective.disc_weight={config.disc_weight} must be > 0 "
                                 "(the paper's lambda is 50)")
        super().__init__(config, tokenizer, long_phase=long_phase)

    @staticmethod
    def model_inputs(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return {k: batch[k] for k in ("input_ids", "segment_ids", "input_mask", "masked_lm_positions",
                                      "masked_lm_ids", "masked_lm_weights")}

    def loss(self, outputs: dict[str, jax.Array], batch: dict[str, jax.Array]
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
        mlm_loss, metrics = mlm.mlm_loss(outputs["mlm_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"])
        disc_loss, disc_metrics = replaced_token_loss(outputs["disc_logits"], outputs["replaced"], batch["input_mask"])
        loss = mlm_loss + self.config.disc_weight * disc_loss
        metrics.update(disc_metrics, loss=loss, tokens=jnp.sum(batch["input_mask"]).astype(jnp.float32))
        return loss, metrics
