"""What the fine-tuning loop asks of a task, whatever its kind (GLUE classification, CoNLL tagging, SQuAD).

A task knows its files and its official metric; a finetuner (pretrain/finetuners/) knows how its examples
become batches and how a batch's outputs become one prediction per example. The loop joins them:

  examples = task.load(config, split)                  one split, checked (one-line errors)
  data = finetuner.encode(examples, batch_size)          features: one per example, or several (QA windows)
  predictions = finetuner.decode(outputs, data, examples)  one per example: a class id, a tag list, an answer
  task.score(finetuner, predictions, examples)            the official metrics of a labelled split
  task.write_predictions(directory, split, finetuner, predictions, examples)   a file a person can read
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence


class Task(Protocol):
    name: str                      # config.task
    kind: str                      # a head kind of objectives/task_heads/: which head the finetuner builds
    main_metric: str               # model selection: this metric on dev_splits[0]
    dev_splits: tuple[str, ...]    # scored after every epoch and at the end
    test_splits: tuple[str, ...]   # predicted at the end; scored too where `labelled` says so

    def labelled(self, split: str) -> bool:
        """Whether `split` has gold labels to score."""

    def load(self, config, split: str, options: Any = None) -> list:
        """The examples of one split (options: how the calling command names its data flags, for errors)."""

    def score(self, finetuner, predictions: Sequence, examples: list) -> dict[str, float]:
        """The official metrics (fractions) of one prediction per example."""

    def write_predictions(self, directory: str, split: str, finetuner, predictions: Sequence, examples: list) -> str:
        """The predictions of a split in the task's own layout; returns the file's path."""


def data_location(data_config, task: str, files: str, tfds_name: str, error: type[Exception],
                  hub_name: str = "") -> str:
    """config.data (source, dir, tfds_data_dir, hf_path) -> where the task reads: the folder of its files, TFDS's
    data_dir ('' = TFDS's default), or the Hugging Face Hub dataset (a name or a local copy; '' = hub_name).
    `files`, `tfds_name` and `hub_name` name what each source holds, for the errors."""
    if data_config.source not in ("dir", "tfds", "hf"):
        raise error(f"config.data.source={data_config.source!r}: use dir ({files} in config.data.dir), tfds "
                    f"(TFDS {tfds_name}) or hf (the Hub's {hub_name}, or config.data.hf_path)")
    if data_config.source == "dir" and not data_config.dir:
        raise error(f"task {task}: no data folder; set --config.data.dir to the folder with {files}")
    if data_config.source == "hf":
        return data_config.get("hf_path", "") or hub_name
    return data_config.dir if data_config.source == "dir" else data_config.tfds_data_dir
