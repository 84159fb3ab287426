"""The fine-tuning tasks by name, and the family that fine-tunes a model on one.

config.task names the task (a GLUE task, conll2003 / conll for CoNLL column files, squad / squad_v2). The
task's kind and config.model.name choose the family: each model family registers its fine-tuning families
by task kind in models/registry.py (ModelFamily.finetuning), as 'module:Class' names of this room."""
from __future__ import annotations

import ml_collections

import models
from pretrain.finetuners.base import Family
from pretrain.runtime.errors import ConfigError
from pretrain.tasks import conll, squad
from pretrain.tasks.base import Task
from pretrain.tasks.glue.task import GlueFineTuningTask


def task_for_config(config: ml_collections.ConfigDict) -> Task:
    """config.task -> the task (CoNLL tasks read config.data; a GLUE task is known by its name)."""
    if config.task in conll.NAMES:
        return conll.ConllTask.from_config(config)
    if config.task in squad.NAMES:
        return squad.SquadTask.from_config(config)
    return GlueFineTuningTask.named(config.task)


def for_config(config: ml_collections.ConfigDict, task: Task, tokenizer) -> Family:
    """The family for `task`'s kind and config.model.name, with its tokenizer."""
    model = models.FAMILIES.get(config.model.name)
    family = model.finetuning.get(task.kind) if model is not None else None
    if family is None:
        choices = ", ".join(repr(name) for name, f in models.FAMILIES.items() if task.kind in f.finetuning)
        raise ConfigError(f"config.model.name={config.model.name!r} cannot be fine-tuned on {task.name} here; "
                          f"use one of {choices}")
    return models.registry.resolve(family)(config, task, tokenizer)
