"""Fine-tuning objectives: the loss, metrics and decoding of one downstream task (J&M ch. 11).

Kinds and what the model returns:
  classification  {'logits': [B, C]} from the pooled [CLS] vector; batch 'label' [B] int.
  regression      {'logits': [B, 1]} (STS-B); batch 'label' [B] float, mean squared error.
  tagging         {'logits': [B, L, C]}, BIO tags; batch 'labels' [B, L] int, -100 = no label
                  (continuation sub-words, specials, padding: see pretrain/data/tagging.py).
  span            {'logits': [B, S, C]} over batch 'spans' [B, S, 2]; 'span_labels' [B, S], -100 = padding.
  qa              {'start_logits', 'end_logits': [B, L]}; batch 'start_position', 'end_position' [B]
                  (0 = [CLS] when the answer is absent, as BERT does for SQuAD 2.0).
Every batch has 'weight' [B]: 0 marks the padding examples that fill the last batch. Losses are
sum(w * x) / max(sum(w), 1) over the real items, so such rows get exactly zero weight (and an
all-padding batch gives 0, not NaN); 'examples' is the sum of the weights, a count to sum over
batches, not to average.
"""
from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import optax

from objectives.interface import ObjectiveError
from objectives.losses import soft_target_kl

TASK_KINDS = ("classification", "regression", "tagging", "span", "qa")
IGNORE = -100  # label of positions / spans that carry no target


def _weighted_mean(x: jax.Array, w: jax.Array) -> jax.Array:
    """sum(w * x) / max(sum(w), 1); `where` keeps a non-finite x under w = 0 out of the sum."""
    w = w.astype(jnp.float32)
    return jnp.where(w > 0, x.astype(jnp.float32) * w, 0.0).sum() / jnp.maximum(w.sum(), 1.0)


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Integer-label cross entropy; IGNORE labels are mapped to 0 (the caller weights them out)."""
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), jnp.where(labels == IGNORE, 0, labels))


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


class FineTuningObjective:
    """What the fine-tuning loop asks of a task: model inputs, loss + metrics, predictions.

    max_answer_length and allow_null_answer only matter for 'qa' (SQuAD 1.1 decoding by default;
    allow_null_answer=True lets [CLS] = "no answer" be predicted, for SQuAD 2.0).
    """

    def __init__(self, kind: str, num_labels: int, *, max_answer_length: int = 30,
                 allow_null_answer: bool = False):
        if kind not in TASK_KINDS:
            raise ObjectiveError(f"unknown fine-tuning task kind {kind!r} (use one of {', '.join(TASK_KINDS)})")
        if kind == "regression" and num_labels != 1:
            raise ObjectiveError(f"a regression task has one output, got num_labels={num_labels}")
        self.kind, self.num_labels = kind, num_labels
        self.max_answer_length, self.allow_null_answer = max_answer_length, allow_null_answer
        self.distill_alpha, self.distill_temperature = 0.0, 1.0  # see `distilled`

    def distilled(self, alpha: float, temperature: float) -> "FineTuningObjective":
        """This classification objective where a batch carries 'teacher_logits' [B, C] (task distillation, Hinton
        et al. 2015): loss = alpha * T^2 KL(teacher/T || student/T) + (1 - alpha) * CE(labels); metrics add
        'soft_target_loss' and 'label_loss'. Batches without them (dev) keep the plain cross-entropy."""
        if self.kind != "classification":
            raise ObjectiveError(f"task distillation mixes a teacher's class probabilities into the loss of a "
                                 f"classification task; this task is {self.kind}")
        if not 0 <= alpha <= 1 or not temperature > 0:
            raise ObjectiveError(f"distillation alpha={alpha} must be in [0, 1] and temperature={temperature} > 0")
        out = copy.copy(self)
        out.distill_alpha, out.distill_temperature = alpha, temperature
        return out

    def model_inputs(self, batch: dict) -> dict:
        keys = ("input_ids", "segment_ids", "input_mask") + (("spans",) if self.kind == "span" else ())
        return {k: batch[k] for k in keys}

    def loss(self, outputs: dict, batch: dict) -> tuple[jax.Array, dict]:
        w = batch["weight"].astype(jnp.float32)                                  # [B]
        metrics = {}
        if self.kind == "classification":
            logits, label = outputs["logits"], batch["label"]                     # [B, C], [B]
            loss = _weighted_mean(_cross_entropy(logits, label), w)
            metrics["accuracy"] = _weighted_mean(jnp.argmax(logits, -1) == label, w)
            if "teacher_logits" in batch:  # task distillation (`distilled`): training batches only
                a = self.distill_alpha
                metrics["label_loss"] = loss
                metrics["soft_target_loss"] = soft_target_kl(logits, batch["teacher_logits"], w,
                                                             self.distill_temperature)
                loss = a * metrics["soft_target_loss"] + (1 - a) * loss
        elif self.kind == "regression":
            score = outputs["logits"][..., 0].astype(jnp.float32)                 # [B]
            loss = _weighted_mean(jnp.square(score - batch["label"].astype(jnp.float32)), w)
        elif self.kind in ("tagging", "span"):
            logits = outputs["logits"]                                            # [B, L|S, C]
            labels = batch["labels" if self.kind == "tagging" else "span_labels"]  # [B, L|S]
            item_w = (labels != IGNORE) * w[:, None]                              # labelled items of real rows
            loss = _weighted_mean(_cross_entropy(logits, labels), item_w)
            metrics["accuracy"] = _weighted_mean(jnp.argmax(logits, -1) == labels, item_w)
        else:  # qa: BERT's (CE(start) + CE(end)) / 2, padding positions masked out of the softmax
            real = batch["input_mask"].astype(bool)

            def mask(x):  # finite: an all-padding row stays NaN-free
                return jnp.where(real, x.astype(jnp.float32), -1e9)
            ce = (_cross_entropy(mask(outputs["start_logits"]), batch["start_position"])
                  + _cross_entropy(mask(outputs["end_logits"]), batch["end_position"])) / 2
            loss = _weighted_mean(ce, w)
            pred = self.predictions(outputs, batch)
            hit = (pred["start"] == batch["start_position"]) & (pred["end"] == batch["end_position"])
            metrics["accuracy"] = _weighted_mean(hit, w)
        metrics.update(loss=loss, examples=w.sum())
        return loss, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    def predictions(self, outputs: dict, batch: dict | None = None) -> dict[str, jax.Array]:
        """Decoded predictions. 'qa' needs `batch` (segment_ids, input_mask) to keep answers in the context."""
        if self.kind == "classification":
            return {"label": jnp.argmax(outputs["logits"], -1)}
        if self.kind == "regression":
            return {"score": outputs["logits"][..., 0].astype(jnp.float32)}
        if self.kind == "tagging":
            return {"tags": jnp.argmax(outputs["logits"], -1)}
        if self.kind == "span":
            return {"span_label": jnp.argmax(outputs["logits"], -1)}
        if batch is None:
            raise ValueError("qa predictions need the batch (segment_ids, input_mask) to find the context")
        start, end = best_spans(outputs["start_logits"], outputs["end_logits"], context_mask(batch),
                                self.max_answer_length, self.allow_null_answer)
        return {"start": start, "end": end}
