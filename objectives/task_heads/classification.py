"""Sequence classification: {'logits': [B, C]} from the pooled [CLS] vector; batch 'label' [B] int. With a
teacher's 'teacher_logits' [B, C] in the batch (task distillation, Hinton et al. 2015) the loss mixes in their
soft targets: alpha * T^2 KL(teacher/T || student/T) + (1 - alpha) * CE(labels)."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from models import heads
from objectives.losses import soft_target_kl
from objectives.task_heads.base import HeadKind, cross_entropy, weighted_mean


@dataclasses.dataclass(frozen=True)
class PooledHead(HeadKind):
    """dropout -> Dense(num_labels) on the pooled [CLS] vector (classification and regression)."""

    def head(self, num_labels, dropout_rate, options, **kwargs):
        return heads.SequenceClassificationHead(num_labels, dropout_rate, **kwargs)

    def outputs(self, head, sequence, pooled, inputs, deterministic):
        return {"logits": head(pooled, deterministic)}


@dataclasses.dataclass(frozen=True)
class Classification(PooledHead):

    def loss(self, outputs, batch, weight, objective):
        logits, label = outputs["logits"], batch["label"]                     # [B, C], [B]
        loss = weighted_mean(cross_entropy(logits, label), weight)
        metrics = {"accuracy": weighted_mean(jnp.argmax(logits, -1) == label, weight)}
        if "teacher_logits" in batch:  # task distillation (FineTuningObjective.distilled): training batches only
            a = objective.distill_alpha
            metrics["label_loss"] = loss
            metrics["soft_target_loss"] = soft_target_kl(logits, batch["teacher_logits"], weight,
                                                         objective.distill_temperature)
            loss = a * metrics["soft_target_loss"] + (1 - a) * loss
        return loss, metrics

    def predictions(self, outputs, batch, objective):
        return {"label": jnp.argmax(outputs["logits"], -1)}


CLASSIFICATION = Classification("classification", hf_class="BertForSequenceClassification",
                                peft_task_type="SEQ_CLS", distillable=True)
