"""What the fine-tuning loop asks of a task, whatever its kind (GLUE classification, CoNLL tagging, SQuAD).

A task knows its files and its official metric; a model family (pretrain/families/) knows how its examples
become batches and how a batch's outputs become one prediction per example. The loop joins them:

  examples = task.load(config, split)                  one split, checked (one-line errors)
  data = family.encode(examples, batch_size)          features: one per example, or several (QA windows)
  predictions = family.decode(outputs, data, examples)  one per example: a class id, a tag list, an answer
  task.score(family, predictions, examples)            the official metrics of a labelled split
  task.write_predictions(directory, split, family, predictions, examples)   a file a person can read
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence


class Task(Protocol):
    name: str                      # config.task
    kind: str                      # objectives/finetuning.py's TASK_KINDS: which head the family builds
    main_metric: str               # model selection: this metric on dev_splits[0]
    dev_splits: tuple[str, ...]    # scored after every epoch and at the end
    test_splits: tuple[str, ...]   # predicted at the end; scored too where `labelled` says so

    def labelled(self, split: str) -> bool:
        """Whether `split` has gold labels to score."""

    def load(self, config, split: str, options: Any = None) -> list:
        """The examples of one split (options: how the calling command names its data flags, for errors)."""

    def score(self, family, predictions: Sequence, examples: list) -> dict[str, float]:
        """The official metrics (fractions) of one prediction per example."""

    def write_predictions(self, directory: str, split: str, family, predictions: Sequence, examples: list) -> str:
        """The predictions of a split in the task's own layout; returns the file's path."""
