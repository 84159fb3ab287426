"""The finetuner that fine-tunes a model on a task: chosen by the task's head kind and config.model.name.

Each model family registers its finetuners by head kind in models/families.py (ModelFamily.finetuners), as
'module:Class' names of this room; the tasks are pretrain/tasks/registry.py's."""
from __future__ import annotations

import ml_collections

import models
from pretrain.finetuners.base import Finetuner
from pretrain.runtime.errors import ConfigError
from pretrain.tasks.base import Task


def for_config(config: ml_collections.ConfigDict, task: Task, tokenizer) -> Finetuner:
    """The finetuner for `task`'s kind and config.model.name, with its tokenizer."""
    model = models.FAMILIES.get(config.model.name)
    finetuner = model.finetuners.get(task.kind) if model is not None else None
    if finetuner is None:
        choices = ", ".join(repr(name) for name, f in models.FAMILIES.items() if task.kind in f.finetuners)
        raise ConfigError(f"config.model.name={config.model.name!r} cannot be fine-tuned on {task.name} here; "
                          f"use one of {choices}")
    return models.registry.resolve(finetuner)(config, task, tokenizer)
