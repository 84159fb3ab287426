"""BERT with a task head for fine-tuning: sequence classification / regression, tagging, spans, QA.

The encoder sits under the same `bert` name as in BertForPreTraining, so a pretraining checkpoint
(or a Hugging Face import) drops into `params['bert']` unchanged; the new task layer is `head`.
"""
from __future__ import annotations

import flax.linen as nn
import jax

from models import heads
from models.bert import BertConfig, BertModel

HEAD_KINDS = ("classification", "regression", "tagging", "span", "qa")


class BertForFineTuning(nn.Module):
    """Returns {'logits': ...} ([B, C], [B, L, C] or [B, S, C]) or, for QA, start/end logits [B, L]."""
    config: BertConfig
    kind: str                      # one of HEAD_KINDS
    num_labels: int                # classes (1 for regression; unused for QA)
    classifier_dropout: float = 0.1
    span_boundaries: str = "token"  # kind="span": heads.SpanClassificationHead's boundaries and summary
    span_summary: str = "mean"

    def setup(self):
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"head kind {self.kind!r} is unknown; use one of {HEAD_KINDS}")
        c = self.config
        self.bert = BertModel(c)
        common = dict(initializer_range=c.initializer_range, **c.kwargs)
        if self.kind in ("classification", "regression"):
            self.head = heads.SequenceClassificationHead(self.num_labels, self.classifier_dropout, **common)
        elif self.kind == "tagging":
            self.head = heads.TokenClassificationHead(self.num_labels, self.classifier_dropout, **common)
        elif self.kind == "span":
            self.head = heads.SpanClassificationHead(self.num_labels, dropout_rate=self.classifier_dropout,
                                                     boundaries=self.span_boundaries, summary=self.span_summary,
                                                     **common)
        else:
            self.head = heads.QuestionAnsweringHead(**common)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,  # [B, L]
                 spans: jax.Array | None = None,                                            # [B, S, 2]
                 deterministic: bool = True) -> dict[str, jax.Array]:
        sequence, pooled = self.bert(input_ids, segment_ids, input_mask, deterministic)
        if self.kind in ("classification", "regression"):
            return {"logits": self.head(pooled, deterministic)}
        if self.kind == "tagging":
            return {"logits": self.head(sequence, deterministic)}
        if self.kind == "span":
            return {"logits": self.head(sequence, spans, deterministic)}
        start, end = self.head(sequence)
        return {"start_logits": start, "end_logits": end}
