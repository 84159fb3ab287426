"""Span classification (J&M eq. 11.21): {'logits': [B, S, C]} over batch 'spans' [B, S, 2] (inclusive start,
end); 'span_labels' [B, S], IGNORE = padding. Options: boundaries (token | ffnn) and summary (mean |
attention) of heads.SpanClassificationHead."""
from __future__ import annotations

import dataclasses

from models import heads
from objectives.task_heads.tagging import ItemClassification


@dataclasses.dataclass(frozen=True)
class Span(ItemClassification):

    def head(self, num_labels, dropout_rate, options, **kwargs):
        return heads.SpanClassificationHead(num_labels, dropout_rate=dropout_rate, **options, **kwargs)

    def outputs(self, head, sequence, pooled, inputs, deterministic):
        return {"logits": head(sequence, inputs["spans"], deterministic)}


SPAN = Span("span", input_keys=("spans",), labels_key="span_labels", predictions_key="span_label")
