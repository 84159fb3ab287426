"""Objective "distillation" for model 'distil' (models/distillation/model.py): DistilBERT's triple loss (Sanh et al. 2019,
Section 3), TinyBERT's and MiniLM's losses on the models' insides (objectives/distillation/layer_losses.py), weighted:

  loss = alpha_ce  * T^2 * KL(softmax(teacher / T) || softmax(student / T))   over the masked positions
       + alpha_mlm * MLM cross-entropy                                         over the masked positions
       + alpha_cos * (1 - cos(student last hidden, teacher last hidden))      over the real tokens
       + alpha_attention_kl   * MiniLM's attention KL          (last layers)
       + alpha_value_relation * MiniLM's value-relation KL     (last layers)
       + alpha_attention_mse  * TinyBERT's attention-score MSE (each student layer m and teacher layer g(m))
       + alpha_hidden         * TinyBERT's MSE(H_student W_h, H_teacher)   (the same pairs)
       + alpha_embedding      * TinyBERT's MSE(E_student W_e, E_teacher)

DistilBERT's weights are 5.0 / 2.0 / 1.0 with T = 2.0 and the rest 0; MiniLM's are 1 / 1 on its two terms and
TinyBERT's general distillation 1 / 1 / 1 on its three, nothing else (configs/distil.py: `loss=`). Batches are
BERT's (objectives/bert_pretraining.py: dynamic masking, single segments without NSP, as DistilBERT trains); the
soft targets are the teacher's MLM logits at the same masked positions (DistilBERT scores them there too,
`mlm_mask`). A term whose alpha is 0 is not computed, and the insides it needs are not asked of the model: a
teacher without an MLM head (a sentence-embedding model) distils with alpha_ce=0, and a DistilBERT run computes
no attention matrices.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from objectives import mlm
from objectives.bert_pretraining import BertPretraining
from objectives.distillation import layer_losses as layer
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


# alpha key -> (its metric, its loss of (the model's outputs, the input mask [B, L]), the internals it asks of the
# model: models/distillation/model.py INTERNALS). The soft targets and MLM, on the masked positions, are apart.
TERMS = {
    "alpha_cos": ("cosine_loss", lambda o, m: cosine_loss(o["hidden"], o["teacher_hidden"], m), None),
    "alpha_attention_kl": ("attention_kl", lambda o, m: layer.attention_kl(
        o["attention_scores"][-1], o["teacher_attention_scores"][-1], m), "attention"),
    "alpha_value_relation": ("value_relation_kl", lambda o, m: layer.value_relation_kl(
        o["attention_values"][-1], o["teacher_attention_values"][-1], m), "attention"),
    "alpha_attention_mse": ("attention_mse", lambda o, m: layer.attention_mse(
        o["attention_scores"], o["teacher_attention_scores"], m), "attention"),
    "alpha_hidden": ("hidden_mse", lambda o, m: layer.hidden_mse(o["hidden_states"], o["teacher_hidden_states"], m),
                     "hidden_states"),
    "alpha_embedding": ("embedding_mse", lambda o, m: layer.hidden_mse(o["embeddings"], o["teacher_embeddings"], m),
                        "embeddings"),
}
ALPHAS = ("alpha_ce", "alpha_mlm", *TERMS)


class Distillation(BertPretraining):
    """Objective "distillation": BERT's batches (config.next_sentence must be False), the weighted loss above.
    config: BERT pretraining's keys + temperature and the alphas (ALPHAS)."""

    def __init__(self, config: ml_collections.ConfigDict, tokenizer, *, long_phase: bool = False):
        super().__init__(config, tokenizer, long_phase=long_phase)
        if self.next_sentence:
            raise ObjectiveError("config.objective.next_sentence=True: distillation trains masked LM only "
                                 "(DistilBERT drops NSP); set it to False")
        if not config.temperature > 0:
            raise ObjectiveError(f"config.objective.temperature={config.temperature} must be > 0 (DistilBERT: 2.0)")
        alphas = {k: config[k] for k in ALPHAS}
        if min(alphas.values()) < 0 or not sum(alphas.values()) > 0:
            raise ObjectiveError(f"config.objective's alphas {alphas} must be >= 0 with one > 0 "
                                 "(DistilBERT: alpha_ce=5, alpha_mlm=2, alpha_cos=1; configs/distil.py's loss=)")
        # static: the model runs its attention through the reference only when a term reads it
        self.internals = tuple(sorted({need for key, (_, _, need) in TERMS.items() if need and config[key]}))

    def model_inputs(self, batch: dict[str, jax.Array]) -> dict:
        inputs = BertPretraining.model_inputs(batch)
        return {**inputs, "internals": self.internals} if self.internals else inputs

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
        for key, (name, term, _) in TERMS.items():
            if c[key]:
                metrics[name] = term(outputs, batch["input_mask"])
                loss = loss + c[key] * metrics[name]
        metrics["loss"] = loss
        metrics["tokens"] = jnp.sum(batch["input_mask"]).astype(jnp.float32)  # real tokens, for tokens/s
        return loss, metrics
