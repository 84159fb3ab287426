"""BERT with a task head for fine-tuning: sequence classification / regression, tagging, spans, QA.

The encoder sits under the same `bert` name as in BertForPreTraining, so a pretraining checkpoint
(or a Hugging Face import) drops into `params['bert']` unchanged; the new task layer is `head`. Which head,
what it reads and what it returns is the head kind's (objectives/task_heads/: given here as an object, so
this module knows no kind by name). A PEFT method (models/peft/) comes as its own config and attaches to the
encoder from outside it (models/peft/model.py `attach`), its parameters under `bert` as before.
"""
from __future__ import annotations

from typing import Any, Protocol

import flax.linen as nn
import jax

from models import peft as parameter_efficient
from models.bert import BertConfig, BertModel


class TaskHead(Protocol):
    """What BertForFineTuning reads of a head kind (objectives/task_heads/base.py's HeadKind)."""
    input_keys: tuple[str, ...]

    def head(self, num_labels: int, dropout_rate: float, options: dict[str, Any], **kwargs) -> nn.Module: ...

    def outputs(self, head: nn.Module, sequence: jax.Array, pooled: jax.Array | None, inputs: dict[str, jax.Array],
                deterministic: bool) -> dict[str, jax.Array]: ...


class BertForFineTuning(nn.Module):
    """Returns the head kind's outputs: {'logits': ...} ([B, C], [B, L, C] or [B, S, C]) or, for QA, start/end
    logits [B, L]."""
    config: BertConfig
    kind: TaskHead                 # a registered head kind (objectives.task_heads.head_kind(name))
    num_labels: int                # classes (1 for regression; unused for QA)
    classifier_dropout: float = 0.1
    head_options: tuple[tuple[str, Any], ...] = ()  # the kind's options, e.g. a span head's boundaries and summary
    peft: parameter_efficient.PeftConfig = parameter_efficient.NONE  # a PEFT method attached to the encoder

    def setup(self):
        c = self.config
        self.bert = parameter_efficient.attach(BertModel(c), self.peft)
        self.head = self.kind.head(self.num_labels, self.classifier_dropout, dict(self.head_options),
                                   initializer_range=c.initializer_range, **c.kwargs)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,  # [B, L]
                 deterministic: bool = True, **inputs: jax.Array) -> dict[str, jax.Array]:  # the kind's input_keys
        sequence, pooled = self.bert(input_ids, segment_ids, input_mask, deterministic)
        return self.kind.outputs(self.head, sequence, pooled, inputs, deterministic)
