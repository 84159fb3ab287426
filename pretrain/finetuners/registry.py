"""The finetuner that fine-tunes a model on a task: chosen by the task's head kind and config.model.name.

Each finetuner class registers itself in base.FINETUNERS beside its definition, with the head kinds (`kinds`) and
model families (`families`) it fine-tunes; this module imports them all, so that the table is whole wherever a
finetuner is looked up. The tasks are pretrain/tasks/registry.py's, the families models/families.py's."""
from __future__ import annotations

import ml_collections

import models
from pretrain.finetuners import bert, bert_qa, bert_spans, bert_tagging, gpt, t5, t5_qa  # noqa: F401 (they register)
from pretrain.finetuners.base import FINETUNERS, Finetuner
from pretrain.runtime.errors import ConfigError
from pretrain.tasks.base import Task


def for_config(config: ml_collections.ConfigDict, task: Task, tokenizer) -> Finetuner:
    """The finetuner for `task`'s kind and config.model.name, with its tokenizer."""
    family = config.model.name
    found = FINETUNERS.find(lambda finetuner: family in finetuner.families and task.kind in finetuner.kinds)
    if not found:
        raise ConfigError(f"config.model.name={family!r} cannot be fine-tuned on {task.name} here; "
                          f"use one of {', '.join(map(repr, families_for(task.kind)))}")
    _, finetuner = found[0]
    return finetuner(config, task, tokenizer)


def families_for(kind: str) -> list[str]:
    """The model families some finetuner fine-tunes on head `kind`, in their registration order."""
    able = {family for _, finetuner in FINETUNERS.find(lambda f: kind in f.kinds) for family in finetuner.families}
    return [name for name in models.FAMILIES.names() if name in able]
