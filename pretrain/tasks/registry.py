"""The fine-tuning tasks: one registration each, and the only list of them.

config.task names the task. TASKS (a models/registry.py `Registry`) maps each config.task value to the
'module:attribute' that builds the task from the config (a Task, pretrain/tasks/base.py, whose `kind` names its
head kind in objectives/task_heads/). GLUE's builder is also the fallback: it answers every name no registration
claims (the download spellings, 'CoLA', 'SST-2'), and says itself when a name is no GLUE task. Readers:
`task_for_config` (pretrain.finetune, pretrain.evaluate, the exporter and task distillation), `names` (config
validation and its error messages). Adding a task is its module plus one `TASKS.register` line.
"""
from __future__ import annotations

import ml_collections

from models.registry import Registry
from pretrain.runtime.errors import ConfigError
from pretrain.tasks.base import Task

GLUE_TASK = "pretrain.tasks.glue.task:GlueFineTuningTask.from_config"
TASKS: Registry = Registry("task", key="config.task", error=ConfigError, fallback=GLUE_TASK)  # name -> (config) -> Task


def names() -> tuple[str, ...]:
    return TASKS.names()


def task_for_config(config: ml_collections.ConfigDict) -> Task:
    """config.task -> the task, built from the config (CoNLL and SQuAD read config.data)."""
    return TASKS.get(config.task)(config)


# GLUE: the nine tasks of pretrain/tasks/glue/data.py, also under their download names ('CoLA', 'SST-2').
GLUE = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
for glue_task in GLUE:
    TASKS.register(glue_task, GLUE_TASK)
TASKS.register("conll2003", "pretrain.tasks.conll:ConllTask.from_config")
TASKS.register("conll", "pretrain.tasks.conll:ConllTask.from_config")  # any CoNLL files
TASKS.register("squad", "pretrain.tasks.squad:SquadTask.from_config")
TASKS.register("squad_v2", "pretrain.tasks.squad:SquadTask.from_config")
