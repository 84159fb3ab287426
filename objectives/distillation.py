"""DistilBERT's triple loss (Sanh et al. 2019, Section 3), objective "distillation" for model 'distil'
(models/distillation.py):

  loss = alpha_ce  * T^2 * KL(softmax(teacher / T) || softmax(student / T))   over the masked positions
       + alpha_mlm * MLM cross-entropy                                         over the masked positions
       + alpha_cos * (1 - cos(student last hidden, teacher last hidden))      over the real tokens

DistilBERT's weights are 5.0 / 2.0 / 1.0 with T = 2.0. Batches are BERT's (objectives/bert_pretraining.py:
dynamic masking, single segments without NSP, as DistilBERT trains); the soft targets are the teacher's MLM
logits at the same masked positions (DistilBERT scores them there too, `mlm_mask`). A term whose alpha is 0 is
not computed: a teacher without an MLM head (a sentence-embedding model) distils with alpha_ce=0.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from objectives import mlm
from objectives.bert_pretraining import BertPretraining
from objectives.interface import ObjectiveError
from objectives.losses import soft_target_kl


def cosine_loss(hidden: jax.Array, teacher_hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """mean over the real tokens of 1 - cos(student, teacher): hidden [B, L, D], mask [B, L] (1: real token).
    torch's CosineEmbeddingLoss with target 1, as DistilBERT applies it to the rows its attention mask selects."""
    s, t = hidden.astype(jnp.float32), teacher_hidden.astype(jnp.float32)
    eps = 1e-8  # torch's cosine_similarity clamps each norm at 1e-8
    cos = (s * t).sum(-1) / (jnp.maximum(jnp.linalg.norm(s, axis=-1), eps) * jnp.maximum(jnp.linalg.norm(t, axis=-1), eps))
    mask = mask.astype(jnp.float32)
    return ((1.0 - cos) * mask).sum() / jnp.maximum(mask.sum(), 1.0)


class Distillation(BertPretraining):
    """Objective "distillation": BERT's batches (config.next_sentence must be False), DistilBERT's loss.
    config: BERT pretraining's keys + temperature, alpha_ce, alpha_mlm, alpha_cos."""

    def __init__(self, config: ml_collections.ConfigDict, tokenizer, *, long_phase: bool = False):
        super().__init__(config, tokenizer, long_phase=long_phase)
        if self.next_sentence:
            raise ObjectiveError("config.objective.next_sentence=True: distillation trains masked LM only "
                                 "(DistilBERT drops NSP); set it to False")
        if not config.temperature > 0:
            raise ObjectiveError(f"config.objective.temperature={config.temperature} must be > 0 (DistilBERT: 2.0)")
        alphas = {k: config[k] for k in ("alpha_ce", "alpha_mlm", "alpha_cos")}
        if min(alphas.values()) < 0 or not sum(alphas.values()) > 0:
            raise ObjectiveError(f"config.objective's alphas {alphas} must be >= 0 with one > 0 "
                                 "(DistilBERT: alpha_ce=5, alpha_mlm=2, alpha_cos=1)")

    def loss(self, outputs: dict[str, jax.Array], batch: dict[str, jax.Array]
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
        c = self.config
        weights = batch["masked_lm_weights"]
        mlm_loss, metrics = mlm.mlm_loss(outputs["mlm_logits"], batch["masked_lm_ids"], weights)
        loss = c.alpha_mlm * mlm_loss
        if c.alpha_ce:
            metrics["soft_target_loss"] = soft_target_kl(outputs["mlm_logits"], outputs["teacher_mlm_logits"],
                                                         weights, c.temperature)
            loss = loss + c.alpha_ce * metrics["soft_target_loss"]
        if c.alpha_cos:
            metrics["cosine_loss"] = cosine_loss(outputs["hidden"], outputs["teacher_hidden"], batch["input_mask"])
            loss = loss + c.alpha_cos * metrics["cosine_loss"]
        metrics["loss"] = loss
        metrics["tokens"] = jnp.sum(batch["input_mask"]).astype(jnp.float32)  # real tokens, for tokens/s
        return loss, metrics
