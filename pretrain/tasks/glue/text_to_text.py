"""GLUE as text-to-text, as T5 fine-tunes and scores it (Raffel et al. 2020, Appendix D).

The t5 library's `preprocessors.glue` writes an input as the task name, then each field as
"name: text" in sorted field-name order (TFDS names: MNLI's hypothesis comes before its premise),
and the target as the label's name; `preprocessors.stsb` writes the STS-B score rounded to a multiple
of 0.2. Its postprocessors map a decoded string back: the class whose name it is, else -1
(`string_label_to_class_id`), or the number, else -1.0 (`string_to_float`).

    cola sentence: ...                      unacceptable | acceptable
    mnli hypothesis: ... premise: ...       entailment | neutral | contradiction
    stsb sentence1: ... sentence2: ...      0.0, 0.2, ..., 5.0

Label names and their order are `GlueTask.labels` (TFDS's, which T5 used too).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pretrain.tasks.glue.data import Example, GlueTask, get_task

INVALID_CLASS = -1  # a decoded string that names no class: never equals a label, so it counts as wrong
# An unreadable STS-B string scores -1.0, as in t5's `string_to_float`: outside [0, 5], so it lowers
# Pearson/Spearman, and finite, which the correlations need (NaN would make scipy return NaN).
INVALID_SCORE = -1.0
UNLABELED_TARGET = "<unk>"  # t5's target for test rows (label -1) of classification tasks

# (field name in the input, Example attribute), in the order t5 writes them (sorted TFDS names).
_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "cola": (("sentence", "text_a"),),
    "sst2": (("sentence", "text_a"),),
    "mrpc": (("sentence1", "text_a"), ("sentence2", "text_b")),
    "stsb": (("sentence1", "text_a"), ("sentence2", "text_b")),
    "qqp": (("question1", "text_a"), ("question2", "text_b")),
    "mnli": (("hypothesis", "text_b"), ("premise", "text_a")),  # text_a is the premise (sentence1)
    "qnli": (("question", "text_a"), ("sentence", "text_b")),
    "rte": (("sentence1", "text_a"), ("sentence2", "text_b")),
    "wnli": (("sentence1", "text_a"), ("sentence2", "text_b")),
}


def _task(task: GlueTask | str) -> GlueTask:
    return get_task(task) if isinstance(task, str) else task


def input_text(task: GlueTask | str, example: Example) -> str:
    """'mrpc sentence1: <text_a> sentence2: <text_b>' (t5's preprocessors.glue / stsb)."""
    task = _task(task)
    fields = [f"{name}: {getattr(example, attribute)}" for name, attribute in _fields(task)]
    return " ".join([task.name, *fields])


def _fields(task) -> tuple[tuple[str, str], ...]:
    """A GLUE task's own field names; another classification task's are GLUE's generic ones: sentence, or
    sentence1 and sentence2 for a pair."""
    if task.name in _FIELDS:
        return _FIELDS[task.name]
    return (("sentence1", "text_a"), ("sentence2", "text_b")) if task.is_pair else (("sentence", "text_a"),)


def label_text(task: GlueTask | str, label: int | float) -> str:
    """Class id -> its name; STS-B score -> '%.1f' of the nearest multiple of 0.2.

    STS-B rounds as t5's `tf.round(label * 5) / 5` in float32: half to even, so 2.5 -> '2.4' and
    0.3 -> '0.4'. A classification label -1 (unlabeled test row) -> '<unk>', as t5 writes it.
    """
    task = _task(task)
    if task.is_regression:
        fifths = np.round(np.float32(label) * np.float32(5))  # numpy rounds half to even, as tf.round
        return "%.1f" % float(fifths / np.float32(5))
    if label == -1:
        return UNLABELED_TARGET
    if not 0 <= int(label) < task.num_labels or int(label) != label:
        raise ValueError(f"label {label!r} is not a class id of GLUE task {task.name!r} (0..{task.num_labels - 1})")
    return task.labels[int(label)]


def target_text(task: GlueTask | str, example: Example) -> str:
    return label_text(task, example.label)


def text_pairs(task: GlueTask | str, examples: Sequence[Example]) -> list[tuple[str, str]]:
    """[(input text, target text)] for a split."""
    return [(input_text(task, e), target_text(task, e)) for e in examples]


def parse_label(task: GlueTask | str, text: str) -> int | float:
    """Decoded text -> class id (INVALID_CLASS if it names none) or STS-B score (INVALID_SCORE if it is
    no finite number). Surrounding whitespace is ignored; otherwise the match is exact, as in t5."""
    task = _task(task)
    text = text.strip()
    if task.is_regression:
        try:
            score = float(text)
        except ValueError:
            return INVALID_SCORE
        return score if math.isfinite(score) else INVALID_SCORE
    return task.labels.index(text) if text in task.labels else INVALID_CLASS


def predictions_for_metrics(task: GlueTask | str, predictions: Sequence[int | float],
                            labels: Sequence[int | float]) -> np.ndarray:
    """Parsed predictions ready for glue_metrics.compute_metrics, scoring invalid ones as wrong.

    For F1 tasks (MRPC, QQP) an INVALID_CLASS becomes the opposite of the label, as t5's
    `f1_score_with_invalid` does (sklearn's binary F1 rejects a third class). Elsewhere -1 stays:
    accuracy counts it wrong, and Matthews correlation (CoLA) takes it as a class of its own, as t5's
    sklearn wrapper does. STS-B scores pass through.
    """
    task = _task(task)
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if task.is_regression or "f1" not in task.metrics:
        return predictions
    return np.where(predictions == INVALID_CLASS, 1 - labels, predictions)
