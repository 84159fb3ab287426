"""A GLUE task as the fine-tuning loop sees it (pretrain/tasks/base.py): its splits from the official TSVs or
TFDS, the official metrics, readable dev predictions and the leaderboard's submission files."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from pretrain.tasks.glue import data as glue
from pretrain.tasks.glue import metrics as glue_metrics
from pretrain.workdir import storage


@dataclasses.dataclass(frozen=True)
class GlueFineTuningTask(glue.GlueTask):
    """GlueTask (its metadata, as the families read it) + the loop's calls."""
    settings = {}  # nothing in config.data depends on the data

    @classmethod
    def from_config(cls, config) -> GlueFineTuningTask:
        return cls.named(config.task)

    @classmethod
    def named(cls, name: str) -> GlueFineTuningTask:
        task = glue.get_task(name)
        return cls(**{f.name: getattr(task, f.name) for f in dataclasses.fields(task)})

    def labelled(self, split: str) -> bool:
        return split in self.dev_splits  # test labels are hidden (the server scores them)

    def load(self, config, split: str, options: glue.DataOptions = glue.CONFIG_OPTIONS) -> list[glue.Example]:
        data_dir = {"dir": config.data.glue_dir, "hf": config.data.get("hf_path", "")}.get(config.data.source,
                                                                                           config.data.tfds_data_dir)
        return glue.load_split(self, split, source=config.data.source, data_dir=data_dir, options=options,
                               skip_malformed=config.data.get("skip_malformed", False))

    def score(self, finetuner, predictions: np.ndarray, examples: list[glue.Example]) -> dict[str, float]:
        labels = self.label_array(examples)
        return glue_metrics.compute_metrics(self, finetuner.for_metrics(predictions, labels), labels)

    def write_predictions(self, directory: str, split: str, finetuner, predictions: np.ndarray,
                          examples: list[glue.Example]) -> str:
        """Test splits: the gluebenchmark.com file. Dev: index, prediction, label (label names)."""
        ids = [e.idx for e in examples]
        if split in self.test_splits:
            return glue.write_submission(self, split, finetuner.for_submission(predictions).tolist(), ids, directory)
        path = os.path.join(directory, f"{split}.tsv")
        write_dev_predictions(path, self, ids, predictions, self.label_array(examples))
        return path


def write_dev_predictions(path: str, task: glue.GlueTask, ids: Sequence[int], predictions: np.ndarray,
                          labels: np.ndarray) -> None:
    """A readable dev file: index, prediction, label (label names for classification)."""
    def name(v):  # a class id < 0: a T5 output that names no class
        return f"{float(v):.4f}" if task.is_regression else (task.labels[int(v)] if v >= 0 else "(invalid)")
    with storage.open_file(path, "w") as f:
        f.write("index\tprediction\tlabel\n")
        for i, p, y in zip(ids, predictions, labels):
            f.write(f"{i}\t{name(p)}\t{name(y)}\n")
