"""Sequence labelling (J&M eq. 11.12): {'logits': [B, L, C]}, BIO tags at every position; batch 'labels' [B, L]
int, IGNORE = no label (continuation sub-words, specials, padding: see pretrain/data/tagging.py)."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from models import heads
from objectives.task_heads.base import IGNORE, HeadKind, cross_entropy, weighted_mean


@dataclasses.dataclass(frozen=True)
class ItemClassification(HeadKind):
    """A class for every item of a row (a token, a span), IGNORE for items without a target."""
    labels_key: str = "labels"           # the batch's [B, items] labels
    predictions_key: str = "tags"        # what `predictions` calls its [B, items] argmax

    def loss(self, outputs, batch, weight, objective):
        logits, labels = outputs["logits"], batch[self.labels_key]            # [B, N, C], [B, N]
        item_weight = (labels != IGNORE) * weight[:, None]                    # labelled items of real rows
        loss = weighted_mean(cross_entropy(logits, labels), item_weight)
        return loss, {"accuracy": weighted_mean(jnp.argmax(logits, -1) == labels, item_weight)}

    def predictions(self, outputs, batch, objective):
        return {self.predictions_key: jnp.argmax(outputs["logits"], -1)}


@dataclasses.dataclass(frozen=True)
class Tagging(ItemClassification):
    """dropout -> Dense(num_labels) at every position of the sequence."""

    def head(self, num_labels, dropout_rate, options, **kwargs):
        return heads.TokenClassificationHead(num_labels, dropout_rate, **kwargs)

    def outputs(self, head, sequence, pooled, inputs, deterministic):
        return {"logits": head(sequence, deterministic)}


TAGGING = Tagging("tagging", hf_class="BertForTokenClassification")
