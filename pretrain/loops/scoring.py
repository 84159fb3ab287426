"""Prediction and scoring of a fine-tuned model on a task's splits, shared by the fine-tuning loop and
pretrain.evaluate (pretrain/loops/evaluation.py): a split's batches, one prediction per example, the task's
official metrics and its prediction files.

Multi-host: every process builds the same batches, feeds its devices' rows and receives every
prediction (so every process computes the same metrics); only process 0 writes files."""
from __future__ import annotations

import os

import numpy as np
from jax.experimental import multihost_utils

from pretrain.data import finetune_data
from pretrain.runtime import distributed, partitioning
from pretrain.runtime.errors import UserError
from pretrain.tasks.glue import data as glue
from pretrain.workdir import storage


def load_split(config, finetuner, split: str, batch_size: int, subset: int = 0, options=glue.CONFIG_OPTIONS
               ) -> tuple[finetune_data.FineTuningData, list]:
    """-> (batched features, the examples) of one split of finetuner.task."""
    examples = finetuner.task.load(config, split, options)
    examples = [examples[i] for i in finetune_data.subset_indices(len(examples), subset)]
    return finetuner.encode(examples, batch_size), examples


def predict(jit_predict, finetuner, params, data: finetune_data.FineTuningData, mesh, examples: list):
    """One prediction per example (a label id, an STS-B score, a tag list ...), in order, on every process."""
    out = None
    for batch in data.batches():
        outputs = jit_predict(params, partitioning.shard_batch(batch, mesh, global_batch=True))
        # The rows live on every process's devices: gather them all (a device_get in a single process).
        prediction = finetuner.to_labels(multihost_utils.process_allgather(outputs, tiled=True))
        real = batch["weight"] > 0
        out = np.zeros((len(data), *prediction.shape[1:]), prediction.dtype) if out is None else out
        out[batch["index"][real]] = prediction[real]
    return finetuner.decode(out, data, examples)


def score_splits(config, finetuner, jit_predict, params, mesh, splits, workdir: str, *, required: bool = False,
                 options=glue.CONFIG_OPTIONS) -> dict:
    """Every split: its predictions file (GLUE's test splits: the submission file); labelled splits: the
    official metrics.

    Every split is loaded before anything is written. A test split without its file is skipped with a line,
    unless `required` (pretrain.evaluate asked for it): then it is an error and nothing is written."""
    task, results, primary = finetuner.task, {}, distributed.is_primary()
    loaded = []
    for split in splits:
        try:
            loaded.append((split, load_split(config, finetuner, split, config.eval_batch_size, options=options)))
        except UserError as e:
            if split not in task.test_splits or required:
                raise
            print(f"Skipped test predictions for {split}: {e}")
    directory = os.path.join(workdir, "predictions")
    if primary:
        storage.makedirs(directory)
    for split, (data, examples) in loaded:
        predictions = predict(jit_predict, finetuner, params, data, mesh, examples)
        if primary:
            path = task.write_predictions(directory, split, finetuner, predictions, examples)
            print(f"Predictions ({split}): {path}")
        if task.labelled(split):
            results[split] = task.score(finetuner, predictions, examples)
    return results


def dev_score(task, results: dict) -> float:
    """Model selection: the main metric on the first dev split (MNLI: matched)."""
    return float(results[task.dev_splits[0]][task.main_metric])
