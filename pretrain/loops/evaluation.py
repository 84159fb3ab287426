"""pretrain.evaluate's work: a fine-tuning workdir's best checkpoint scored again without training.

`evaluate_workdir` reads WORKDIR/config.json (a pretrain.finetune run's), restores the kept checkpoint (a PEFT
checkpoint over its base), scores the asked splits with pretrain/loops/scoring.py (dev metrics, test submission
files) and writes WORKDIR/eval_results.json. The entry point (pretrain/evaluate.py) holds only its flags."""
from __future__ import annotations

import json
import os

import jax
import ml_collections
import numpy as np

from pretrain.data import tokenizers
from pretrain.finetuners import registry
from pretrain.loops.scoring import load_split, score_splits
from pretrain.runtime import distributed, partitioning
from pretrain.runtime.errors import UserError
from pretrain.tasks import registry as task_registry
from pretrain.tasks.glue import data as glue
from pretrain.training import peft as parameter_efficient
from pretrain.workdir import checkpoints, storage
from pretrain.workdir import run_files as workdirs


def evaluate_workdir(workdir: str, splits: list[str], glue_dir: str | None = None) -> dict:
    """pretrain.evaluate: restore a fine-tuning workdir's best checkpoint, score `splits` (dev metrics,
    test submission files) and write WORKDIR/eval_results.json; returns what it writes."""
    config = _finetuning_config(workdir)
    if glue_dir:
        if "glue_dir" not in config.data:
            raise UserError(f"--glue_dir applies to GLUE runs; {workdir} fine-tuned {config.task}, which reads the "
                            "data named in its config.json (data.dir or data.source=tfds)")
        config.data.glue_dir = glue_dir
    task = task_registry.task_for_config(config)
    splits = [s.strip() for s in splits if s.strip()]
    if not splits:  # an empty --splits would score nothing and overwrite eval_results.json with no metrics
        valid = ", ".join(task.dev_splits + task.test_splits)
        raise UserError(f"--splits is empty: give the splits of {task.name} to score (dev, test or one of {valid}), "
                        "or leave it out for dev")
    wanted = []
    for split in splits:
        expanded = {"dev": task.dev_splits, "test": task.test_splits}.get(split, (split,))
        unknown = [s for s in expanded if s not in task.dev_splits + task.test_splits]
        if unknown:
            raise UserError(f"--splits: {unknown[0]!r} is not a split of {task.name} "
                            f"(use dev, test or one of {task.dev_splits + task.test_splits})")
        wanted += expanded
    finetuner = registry.for_config(config, task, tokenizers.from_config(config.tokenizer))
    options = glue.DataOptions(glue_dir="--glue_dir", tfds=None, skip_malformed=None)
    params, step = checkpoints.restore_params(os.path.join(workdir, "checkpoints"))
    if parameter_efficient.is_peft(config):  # `params` are the trained part: the base comes from its reference
        params = with_peft_base(config, finetuner, params, parameter_efficient.load_base(
            os.path.join(workdir, "checkpoints"), step), wanted[0])
    mesh = partitioning.create_mesh(config.mesh_shape)
    params = jax.device_put(params, partitioning.replicated(mesh))  # on every device of every process
    jit_predict = jax.jit(finetuner.predict_fn(finetuner.build_model()))
    with mesh:
        results = score_splits(config, finetuner, jit_predict, params, mesh, wanted, workdir, required=True,
                               options=options)
    out = {"task": task.name, "checkpoint_step": step, "metrics": results}
    if distributed.is_primary():
        workdirs.write_json_atomic(os.path.join(workdir, "eval_results.json"), out)
    return out


def with_peft_base(config, finetuner, part: dict, init, split: str) -> dict:
    """A PEFT checkpoint's trained parameters over its base: the whole tree of the fine-tuned model. `split`
    gives one example for the model's shapes."""
    data, _ = load_split(config, finetuner, split, 1, subset=1)
    example = {k: v[:1] for k, v in finetuner.objective.model_inputs(data.batch(np.arange(1))).items()}
    return parameter_efficient.rebuild(finetuner.build_model(), example, part, init, finetuner.merge_pretrained)


def _finetuning_config(workdir: str) -> ml_collections.ConfigDict:
    """WORKDIR/config.json of a pretrain.finetune run (one line for anything else)."""
    if storage.is_url(workdir):
        storage.check_url(workdir, "--workdir")
    config_path = os.path.join(workdir, "config.json")
    what = "--workdir must be a directory written by pretrain.finetune"
    if not storage.isfile(config_path):
        raise UserError(f"{config_path} not found: {what}")
    try:
        stored = json.loads(storage.read_text(config_path))
    except ValueError as e:
        raise UserError(f"{config_path} is not valid JSON ({e}): {what}") from None
    if not isinstance(stored, dict) or "task" not in stored:
        raise UserError(f"{workdir} is not a fine-tuning workdir (its config.json names no task): {what}; "
                        "to fine-tune a pretraining workdir, give it to pretrain.finetune as its init")
    return ml_collections.ConfigDict(stored)
