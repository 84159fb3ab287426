"""Regression (STS-B): {'logits': [B, 1]} from the pooled [CLS] vector; batch 'label' [B] float, mean squared
error."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from objectives.task_heads.base import weighted_mean
from objectives.task_heads.classification import PooledHead


@dataclasses.dataclass(frozen=True)
class Regression(PooledHead):

    def check_labels(self, num_labels):
        if num_labels != 1:
            raise ValueError(f"a regression task has one output, got num_labels={num_labels}")

    def loss(self, outputs, batch, weight, objective):
        score = outputs["logits"][..., 0].astype(jnp.float32)                 # [B]
        return weighted_mean(jnp.square(score - batch["label"].astype(jnp.float32)), weight), {}

    def predictions(self, outputs, batch, objective):
        return {"score": outputs["logits"][..., 0].astype(jnp.float32)}


REGRESSION = Regression("regression", hf_class="BertForSequenceClassification", peft_task_type="SEQ_CLS")
