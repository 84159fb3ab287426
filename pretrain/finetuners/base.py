"""What the fine-tuning loop needs from a finetuner, and how pretrained weights fill a fresh model.

A finetuner is one model family's side of fine-tuning on one head kind (objectives/task_heads/). The loop in
pretrain/loops/finetuning.py is the same for every family; a finetuner says how a task's
examples become batches, which module and objective train on them, how a pretrained checkpoint fills the
fresh parameters, and how a prediction batch becomes one prediction per example (a label id, an STS-B
score, a tag per word). The task (pretrain/tasks/base.py) reads the files and scores the predictions.
The finetuners are in this room, one file each, each class registered in FINETUNERS beside its definition with
the head kinds (`kinds`) and model families (`families`) it fine-tunes; registry.py picks one by the task's head
kind and config.model.name:

  bert          an encoder (BERT and its variants, ModernBERT: the family's task_model) with a classification /
                regression head on the pooled [CLS] vector (bert.py)
  t5            text to text: task prefix + fields in, label word out (t5.py)
  gpt           a decoder with a linear head on the last real token (gpt.py)
  bert tagging  the encoder with a tag classifier at every position, one tag per word (bert_tagging.py)
  bert span     every span of up to a width classified into a type or NULL (bert_spans.py)
  bert qa       start and end logits over windows of the context, the best answer (bert_qa.py)
  t5 qa         "question: ... context: ..." -> the answer's text (t5_qa.py)
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import flax.linen as nn
import numpy as np

import models
from models.registry import Registry
from objectives.interface import StepObjective
from pretrain.data import finetune_data
from pretrain.tasks.base import Task
from pretrain.training import pretrained
from pretrain.training.pretrained import Pretrained


class Finetuner(Protocol):
    """One model family's side of fine-tuning (see the module docstring)."""
    kinds: tuple[str, ...]         # the head kinds (objectives/task_heads/) it fine-tunes
    families: tuple[str, ...]      # the model families (config.model.name) it fine-tunes
    name: str
    task: Task
    objective: StepObjective       # model_inputs(batch) and loss(outputs, batch), as in pretraining

    @property
    def num_layers(self) -> int:
        """Layers that freezing strategies count (the encoder's, for T5)."""

    def check(self) -> None:
        """Raises UserError for a config this finetuner cannot fine-tune."""

    def encode(self, examples: list, batch_size: int) -> finetune_data.FineTuningData:
        """Examples -> padded batches with the label as a per-example field."""

    def build_model(self) -> nn.Module: ...

    def merge_pretrained(self, params: dict, init: Pretrained) -> tuple[dict, list[str]]:
        """Fresh params + a pretrained checkpoint -> (params, names of the leaves left fresh)."""

    def predict_fn(self, model: nn.Module):
        """-> predict(params, batch) -> dict of [B, ...] arrays (jitted by the loop)."""

    def to_labels(self, predictions: dict[str, np.ndarray]) -> np.ndarray:
        """A prediction batch -> [B, ...] arrays of one shape for every batch (one row per feature)."""

    def decode(self, predictions: np.ndarray, data: finetune_data.FineTuningData, examples: list) -> Sequence:
        """One row per feature -> one prediction per example (`one_per_example` where they are the same)."""

    def for_metrics(self, predictions: np.ndarray, labels: np.ndarray) -> np.ndarray: ...

    def for_submission(self, predictions: np.ndarray) -> np.ndarray: ...


# Each finetuner class registers here, beside its definition: `@FINETUNERS.register(name)`.
FINETUNERS: Registry[type[Finetuner]] = Registry("finetuner")


def one_per_example(predictions: np.ndarray, data, examples: list) -> np.ndarray:
    """`Finetuner.decode` of a finetuner whose features are its examples (GLUE: one row, one label)."""
    return predictions


def model_config(config) -> Any:
    """config.model -> the family's model config dataclass."""
    return models.model_config(config.model)


merge_pretrained = pretrained.merge_params  # pretrained weights into a fresh tree (core/pretrained.py)
