"""What a fine-tuning head kind is, and the weighted losses the kinds share.

A head kind is everything that differs between kinds of task output: the head module on the encoder
(models/heads.py), what it reads of the encoder, its loss and metrics, its predictions, the batch keys its
model reads, and the transformers class a fine-tuned BERT with it exports as. Each kind is a module of this
package and one registration in its __init__.py; every reader looks it up there.

Every batch has 'weight' [B]: 0 marks the padding examples that fill the last batch. Losses are
sum(w * x) / max(sum(w), 1) over the real items, so such rows get exactly zero weight (and an
all-padding batch gives 0, not NaN); 'examples' is the sum of the weights, a count to sum over
batches, not to average.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

IGNORE = -100  # label of positions / spans that carry no target
ENCODER_INPUTS = ("input_ids", "segment_ids", "input_mask")  # what every BERT head's model reads


def weighted_mean(x: jax.Array, w: jax.Array) -> jax.Array:
    """sum(w * x) / max(sum(w), 1); `where` keeps a non-finite x under w = 0 out of the sum."""
    w = w.astype(jnp.float32)
    return jnp.where(w > 0, x.astype(jnp.float32) * w, 0.0).sum() / jnp.maximum(w.sum(), 1.0)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Integer-label cross entropy; IGNORE labels are mapped to 0 (the caller weights them out)."""
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), jnp.where(labels == IGNORE, 0, labels))


@dataclasses.dataclass(frozen=True)
class HeadKind:
    """One kind of task head. Subclasses implement the four methods; instances are hashable (a Flax module
    attribute of BertForFineTuning, models/bert_tasks.py)."""
    name: str
    hf_class: str | None = None          # the transformers class holding the same head (export); None: none
    peft_task_type: str | None = None    # the peft library's task_type for a PEFT export; None: not exportable
    input_keys: tuple[str, ...] = ()     # batch keys the model reads besides ENCODER_INPUTS
    distillable: bool = False            # a teacher's logits may join its loss (task distillation)

    def check_labels(self, num_labels: int) -> None:
        """Raises ValueError for a number of outputs this kind cannot have."""

    def head(self, num_labels: int, dropout_rate: float, options: dict[str, Any], **kwargs) -> nn.Module:
        """The head module on the encoder (its parameters live under 'head'); kwargs: initializer, dtypes."""
        raise NotImplementedError

    def outputs(self, head: nn.Module, sequence: jax.Array, pooled: jax.Array | None, inputs: dict[str, jax.Array],
                deterministic: bool) -> dict[str, jax.Array]:
        """The head applied to the encoder's sequence [B, L, D] or pooled [B, D] vector -> the model's outputs."""
        raise NotImplementedError

    def loss(self, outputs: dict, batch: dict, weight: jax.Array, objective: Any) -> tuple[jax.Array, dict]:
        """-> (loss, metrics besides 'loss' and 'examples'); weight [B] float32; objective: its settings."""
        raise NotImplementedError

    def predictions(self, outputs: dict, batch: dict | None, objective: Any) -> dict[str, jax.Array]:
        """Decoded predictions of a batch ([B, ...] arrays)."""
        raise NotImplementedError
