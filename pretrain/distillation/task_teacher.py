"""Task distillation in fine-tuning (Hinton et al. 2015): a fine-tuned teacher's logits teach a student on the task.

`--config.distillation.teacher=WORKDIR` names a finished pretrain.finetune run of the same task (any BERT-family
size: its own config.json, tokenizer and best checkpoint). Its logits are computed once, on the host's devices
before training, for every training example (encoded with the teacher's own tokenizer and length) and travel as
the batch field 'teacher_logits' [B, C]; the classification loss then mixes them in
(objectives/task_heads/objective.py `distilled`: alpha * T^2 KL(teacher/T || student/T) + (1 - alpha) * CE). Precomputing
costs one forward pass of the teacher per example instead of one per example and epoch, and keeps the teacher out
of the jitted step, the train state and the checkpoints; the price is no dropout-varied teacher outputs, which
Hinton et al. do not use either (their teacher is evaluated deterministically).
"""
from __future__ import annotations

import os

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from pretrain.data import tokenizers
from pretrain.finetuners import registry
from pretrain.runtime import partitioning
from pretrain.runtime.errors import UserError
from pretrain.tasks import registry as task_registry
from pretrain.training import peft as parameter_efficient
from pretrain.workdir import checkpoints, storage
from pretrain.workdir import run_files as workdirs

FLAG = "--config.distillation.teacher"


def enabled(config: ml_collections.ConfigDict) -> bool:
    return bool(config.get("distillation", {}).get("teacher"))


def attach(config: ml_collections.ConfigDict, finetuner, train_data, examples: list) -> None:
    """The teacher's logits for `examples` (the training split, in train_data's order) as train_data's field
    'teacher_logits', and finetuner.objective the distilled one."""
    d = config.distillation
    if not hasattr(finetuner.objective, "distilled"):
        raise UserError(f"{FLAG}: task distillation trains a BERT-family classifier; model "
                        f"{config.model.name!r} fine-tunes another way")
    finetuner.objective = finetuner.objective.distilled(d.alpha, d.temperature)
    logits = teacher_logits(d.teacher, config, examples)
    if logits.shape != (len(train_data), finetuner.objective.num_labels):
        raise UserError(f"{FLAG}={d.teacher} gives logits of shape {logits.shape}; the student's training data wants "
                        f"({len(train_data)}, {finetuner.objective.num_labels})")
    train_data.fields["teacher_logits"] = logits
    agreement = np.mean(np.argmax(logits, -1) == train_data.fields["label"])
    print(f"Teacher {d.teacher}: logits of {len(examples)} training examples (its accuracy on them {agreement:.3f}); "
          f"loss = {d.alpha} * T^2 KL (T={d.temperature}) + {1 - d.alpha:g} * CE")


def teacher_config(workdir: str, task: str) -> ml_collections.ConfigDict:
    """WORKDIR/config.json of a finished pretrain.finetune run of `task` (one line for anything else)."""
    stored = workdirs.stored_config(workdir)
    if stored is None or "task" not in stored or not storage.isdir(os.path.join(workdir, "checkpoints")):
        raise UserError(f"{FLAG}={workdir} is not a pretrain.finetune workdir (config.json naming a task + "
                        "checkpoints/): give a finished fine-tuning run of the same task")
    if stored["task"] != task:
        raise UserError(f"{FLAG}={workdir} was fine-tuned on {stored['task']!r}, this run on {task!r}: the teacher "
                        "must know the same labels; give a run of the same task")
    return ml_collections.ConfigDict(stored)


def teacher_logits(workdir: str, config: ml_collections.ConfigDict, examples: list) -> np.ndarray:
    """The teacher's logits [N, C] for `examples`, one deterministic forward pass each, in their order."""
    tconfig = teacher_config(workdir, config.task)
    tconfig.data.update({k: v for k, v in config.data.items() if k in ("glue_dir", "dir")})  # this run's files
    task = task_registry.task_for_config(tconfig)
    finetuner = registry.for_config(tconfig, task, tokenizers.from_config(tconfig.tokenizer))
    params, _ = checkpoints.restore_params(os.path.join(workdir, "checkpoints"))
    if parameter_efficient.is_peft(tconfig):
        raise UserError(f"{FLAG}={workdir} is a PEFT run; give a fully fine-tuned teacher")
    model = finetuner.build_model()
    data = finetuner.encode(examples, config.eval_batch_size)
    apply = jax.jit(lambda p, b: model.apply({"params": p}, **finetuner.objective.model_inputs(b),
                                             deterministic=True)["logits"])
    mesh = partitioning.create_mesh(config.mesh_shape)
    params = jax.device_put(params, partitioning.replicated(mesh))
    out = np.zeros((len(data), finetuner.objective.num_labels), np.float32)
    with mesh:
        for batch in data.batches():
            logits = multihost_utils.process_allgather(  # every process's rows (a device_get in one process)
                apply(params, partitioning.shard_batch(batch, mesh, global_batch=True)), tiled=True)
            real = batch["weight"] > 0
            out[batch["index"][real]] = logits[real]
    return out
