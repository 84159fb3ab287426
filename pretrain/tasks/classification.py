"""Sentence and sentence-pair classification (and regression), as the finetuners read it: a task protocol and
its example, whatever the dataset. GLUE (pretrain/tasks/glue/) is one implementation; another dataset
implements `ClassificationTask` (its files, its official metric; `Labels` gives the label logic) and
registers in pretrain/tasks/registry.py."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from pretrain.tasks.base import Task


@dataclasses.dataclass(frozen=True)
class Example:
    text_a: str
    text_b: str | None
    label: int | float  # class id, or a regression score; -1 for unlabeled (test) rows
    idx: int  # the row's id in its split (a leaderboard matches test predictions on it)


class Labels:
    """A task's label set: `labels` names the classes in id order, () for one regression output."""
    labels: tuple[str, ...]

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return len(self.labels) or 1

    @property
    def kind(self) -> str:
        """The head kind (objectives/task_heads/) a classification task trains."""
        return "regression" if self.is_regression else "classification"

    def label_array(self, examples: Sequence[Example]) -> np.ndarray:
        """[N] labels of `examples`: int32 class ids, or float32 scores for regression."""
        return np.array([e.label for e in examples], np.float32 if self.is_regression else np.int32)


class ClassificationTask(Task, Protocol):
    """A Task whose examples are `Example`s: what BertFinetuner, GPTFinetuner and T5Finetuner read."""
    labels: tuple[str, ...]
    is_regression: bool
    num_labels: int
    is_pair: bool               # whether examples carry text_b

    def label_array(self, examples: Sequence[Example]) -> np.ndarray: ...
