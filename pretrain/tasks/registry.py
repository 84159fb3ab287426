"""The fine-tuning tasks: one registration each, and the only list of them.

config.task names the task. Each registration names the config.task values it answers and the
'module:attribute' that builds the task from the config (a Task, pretrain/tasks/base.py, whose `kind` names
its head kind in objectives/task_heads/). Readers: `task_for_config` (pretrain.finetune, pretrain.evaluate,
the exporter and task distillation), `names` (config validation and its error messages). Adding a task is
its module plus one `register` line.
"""
from __future__ import annotations

import dataclasses

import ml_collections

from models.registry import resolve
from pretrain.runtime.errors import ConfigError
from pretrain.tasks.base import Task


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    names: tuple[str, ...]   # the config.task values it answers
    builder: str             # 'module:attribute': (config) -> Task
    default: bool = False    # it also answers every name no entry claims (its builder says when one is unknown)


TASKS: list[TaskEntry] = []  # in registration order


def register(entry: TaskEntry) -> TaskEntry:
    taken = set(entry.names) & set(names())
    if taken:
        raise ValueError(f"task {', '.join(sorted(taken))} is registered twice")
    TASKS.append(entry)
    return entry


def names() -> tuple[str, ...]:
    return tuple(name for entry in TASKS for name in entry.names)


def task_for_config(config: ml_collections.ConfigDict) -> Task:
    """config.task -> the task, built from the config (CoNLL and SQuAD read config.data)."""
    for entry in TASKS:
        if config.task in entry.names:
            return resolve(entry.builder)(config)
    for entry in TASKS:
        if entry.default:
            return resolve(entry.builder)(config)
    raise ConfigError(f"config.task={config.task!r} is unknown; available: {', '.join(names())}")


# GLUE: the nine tasks of pretrain/tasks/glue/data.py, also under their download names ('CoLA', 'SST-2').
GLUE = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
register(TaskEntry(GLUE, "pretrain.tasks.glue.task:GlueFineTuningTask.from_config", default=True))
register(TaskEntry(("conll2003", "conll"), "pretrain.tasks.conll:ConllTask.from_config"))  # conll: any CoNLL files
register(TaskEntry(("squad", "squad_v2"), "pretrain.tasks.squad:SquadTask.from_config"))
