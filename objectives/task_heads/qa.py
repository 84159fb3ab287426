"""Extractive question answering (BERT on SQuAD): {'start_logits', 'end_logits': [B, L]}; batch
'start_position', 'end_position' [B] (0 = [CLS] when the answer is absent, as BERT does for SQuAD 2.0).
The loss is BERT's (CE(start) + CE(end)) / 2 with padding masked out of the softmax; predictions are the best
span of the context (`best_spans`), up to the objective's max_answer_length, [CLS] allowed with
allow_null_answer (SQuAD 2.0)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from models import heads
from objectives.task_heads.base import HeadKind, cross_entropy, weighted_mean


def context_mask(batch: dict) -> jax.Array:
    """[B, L] bool: where a QA answer may start or end.

    batch['context_mask'] when given; otherwise segment 1 inside input_mask, less the row's last
    real token, which for '[CLS] question [SEP] context [SEP]' is the closing [SEP].
    """
    if "context_mask" in batch:
        return batch["context_mask"].astype(bool)
    real = batch["input_mask"].astype(bool)
    last = real & ~jnp.pad(real[:, 1:], ((0, 0), (0, 1)))  # real, and the next position is not
    return (batch["segment_ids"] == 1) & real & ~last


def best_spans(start_logits: jax.Array, end_logits: jax.Array, valid: jax.Array, max_answer_length: int = 30,
               allow_null: bool = False) -> tuple[jax.Array, jax.Array]:
    """BERT's SQuAD decoding: argmax of start_i + end_j over i <= j < i + max_answer_length, both valid.

    start_logits, end_logits: [B, L]; valid: [B, L] bool. Returns (start, end) [B] int32. Scores
    are laid out as [B, L, K] (start i, length k + 1) rather than [B, L, L], so memory is linear in
    L. With allow_null, (0, 0) = [CLS] wins when its score beats the best span (SQuAD 2.0, with
    BERT's null threshold of 0). A row with no valid span (a padding example) gets (0, 0).
    """
    L, K = start_logits.shape[1], min(max_answer_length, start_logits.shape[1])
    ends = jnp.arange(L)[:, None] + jnp.arange(K)[None, :]                       # [L, K]: j = i + k
    inside = ends < L
    ends = jnp.minimum(ends, L - 1)
    ok = valid[:, :, None] & valid[:, ends] & inside                              # [B, L, K]
    scores = jnp.where(ok, start_logits[:, :, None] + end_logits[:, ends], -jnp.inf)
    flat = jnp.argmax(scores.reshape(scores.shape[0], -1), axis=-1)
    start, end = flat // K, flat // K + flat % K
    found = ok.reshape(ok.shape[0], -1).any(axis=-1)
    if allow_null:
        best = jnp.max(scores.reshape(scores.shape[0], -1), axis=-1)
        found &= ~(start_logits[:, 0] + end_logits[:, 0] > best)
    return jnp.where(found, start, 0).astype(jnp.int32), jnp.where(found, end, 0).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class QuestionAnswering(HeadKind):
    """Dense(2) at every position: start and end logits."""

    def head(self, num_labels, dropout_rate, options, **kwargs):
        return heads.QuestionAnsweringHead(**kwargs)

    def outputs(self, head, sequence, pooled, inputs, deterministic):
        start, end = head(sequence)
        return {"start_logits": start, "end_logits": end}

    def loss(self, outputs, batch, weight, objective):
        real = batch["input_mask"].astype(bool)

        def mask(x):  # finite: an all-padding row stays NaN-free
            return jnp.where(real, x.astype(jnp.float32), -1e9)
        ce = (cross_entropy(mask(outputs["start_logits"]), batch["start_position"])
              + cross_entropy(mask(outputs["end_logits"]), batch["end_position"])) / 2
        loss = weighted_mean(ce, weight)
        pred = self.predictions(outputs, batch, objective)
        hit = (pred["start"] == batch["start_position"]) & (pred["end"] == batch["end_position"])
        return loss, {"accuracy": weighted_mean(hit, weight)}

    def predictions(self, outputs, batch, objective):
        if batch is None:
            raise ValueError("qa predictions need the batch (segment_ids, input_mask) to find the context")
        start, end = best_spans(outputs["start_logits"], outputs["end_logits"], context_mask(batch),
                                objective.max_answer_length, objective.allow_null_answer)
        return {"start": start, "end": end}


QA = QuestionAnswering("qa", hf_class="BertForQuestionAnswering")
