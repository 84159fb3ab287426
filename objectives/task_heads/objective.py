"""The fine-tuning objective: a task's loss, metrics and predictions, through its head kind (J&M ch. 11).

What a model returns and what a batch holds per kind: the kind's module in this package. The objective adds
what every kind shares: the 'weight' [B] of real rows, the loss and 'examples' metrics, float32 metrics.
"""
from __future__ import annotations

import copy

import jax
import jax.numpy as jnp

from objectives.interface import ObjectiveError
from objectives.task_heads import head_kind
from objectives.task_heads.base import ENCODER_INPUTS


class FineTuningObjective:
    """What the fine-tuning loop asks of a task: model inputs, loss + metrics, predictions.

    max_answer_length and allow_null_answer only matter for 'qa' (SQuAD 1.1 decoding by default;
    allow_null_answer=True lets [CLS] = "no answer" be predicted, for SQuAD 2.0).
    """

    def __init__(self, kind: str, num_labels: int, *, max_answer_length: int = 30,
                 allow_null_answer: bool = False):
        self.head = head_kind(kind)
        try:
            self.head.check_labels(num_labels)
        except ValueError as e:
            raise ObjectiveError(str(e)) from None
        self.kind, self.num_labels = kind, num_labels
        self.max_answer_length, self.allow_null_answer = max_answer_length, allow_null_answer
        self.distill_alpha, self.distill_temperature = 0.0, 1.0  # see `distilled`

    def distilled(self, alpha: float, temperature: float) -> FineTuningObjective:
        """This objective where a batch carries 'teacher_logits' [B, C] (task distillation, Hinton et al. 2015):
        loss = alpha * T^2 KL(teacher/T || student/T) + (1 - alpha) * CE(labels); metrics add
        'soft_target_loss' and 'label_loss'. Batches without them (dev) keep the plain cross-entropy."""
        if not self.head.distillable:
            raise ObjectiveError(f"task distillation mixes a teacher's class probabilities into the loss of a "
                                 f"classification task; this task is {self.kind}")
        if not 0 <= alpha <= 1 or not temperature > 0:
            raise ObjectiveError(f"distillation alpha={alpha} must be in [0, 1] and temperature={temperature} > 0")
        out = copy.copy(self)
        out.distill_alpha, out.distill_temperature = alpha, temperature
        return out

    def model_inputs(self, batch: dict) -> dict:
        return {k: batch[k] for k in ENCODER_INPUTS + self.head.input_keys}

    def loss(self, outputs: dict, batch: dict) -> tuple[jax.Array, dict]:
        w = batch["weight"].astype(jnp.float32)                                  # [B]
        loss, metrics = self.head.loss(outputs, batch, w, self)
        metrics.update(loss=loss, examples=w.sum())
        return loss, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    def predictions(self, outputs: dict, batch: dict | None = None) -> dict[str, jax.Array]:
        """Decoded predictions. 'qa' needs `batch` (segment_ids, input_mask) to keep answers in the context."""
        return self.head.predictions(outputs, batch, self)
