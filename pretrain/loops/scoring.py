"""Prediction and scoring of a fine-tuned model on a task's splits, shared by the fine-tuning loop and
pretrain.evaluate (pretrain/loops/evaluation.py): a split's batches, one prediction per example, the task's
official metrics and its prediction files.

Multi-host: every process builds the same batches, feeds its devices' rows and receives every
prediction (so every process computes the same metrics); only process 0 writes files.

Model selection (which epoch's checkpoint a run keeps) reads the task's main metric on a validation split carved
from the training examples (config.data.validation_examples), or without one on the first dev split."""
from __future__ import annotations

import os

import numpy as np
from jax.experimental import multihost_utils

from pretrain.data import finetune_data
from pretrain.runtime import distributed, partitioning
from pretrain.runtime.errors import ConfigError, UserError
from pretrain.tasks.glue import data as glue
from pretrain.workdir import storage


def load_split(config, finetuner, split: str, batch_size: int, subset: int = 0, options=glue.CONFIG_OPTIONS
               ) -> tuple[finetune_data.FineTuningData, list]:
    """-> (batched features, the examples) of one split of finetuner.task."""
    examples = finetuner.task.load(config, split, options)
    examples = [examples[i] for i in finetune_data.subset_indices(len(examples), subset)]
    return finetuner.encode(examples, batch_size), examples


VALIDATION = "validation"  # the split carved from train, as the metrics and results.json name it
# The carve's shuffle: a constant, not config.seed, so every seed and every arm of a comparison holds out (and
# selects on) the same examples.
VALIDATION_SEED = 1


def carve_validation(num_examples: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, validation indices), each sorted: the last `size` (in [1, num_examples)) of a fixed
    shuffle are held out."""
    order = np.random.default_rng(VALIDATION_SEED).permutation(num_examples)
    return np.sort(order[:num_examples - size]), np.sort(order[num_examples - size:])


def load_training(config, finetuner) -> tuple[tuple[finetune_data.FineTuningData, list], tuple | None]:
    """-> ((train batches, examples), (validation batches, examples) or None): the train split's fixed subset of
    config.data.max_train_examples, less the config.data.validation_examples held out from it for model selection."""
    examples = finetuner.task.load(config, "train", glue.CONFIG_OPTIONS)
    examples = [examples[i] for i in finetune_data.subset_indices(len(examples), config.data.max_train_examples)]
    held = config.data.get("validation_examples", 0)
    if not held:
        return (finetuner.encode(examples, config.batch_size), examples), None
    if held >= len(examples):
        raise ConfigError(f"config.data.validation_examples={held} would hold out all {len(examples)} training "
                          f"examples; set it below {len(examples)} (0: select on dev)")
    train, validation = ([examples[i] for i in part] for part in carve_validation(len(examples), held))
    return ((finetuner.encode(train, config.batch_size), train),
            (finetuner.encode(validation, config.eval_batch_size), validation))


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
    """The main metric on the first dev split (MNLI: matched)."""
    return float(results[task.dev_splits[0]][task.main_metric])


def selection_score(task, dev: dict, validation: dict | None) -> float:
    """Model selection: the main metric on the validation split where the run carved one (dev then stays a test the
    choice never saw), else on the first dev split."""
    return float(validation[task.main_metric]) if validation is not None else dev_score(task, dev)
