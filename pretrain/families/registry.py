"""The fine-tuning tasks and families by name: the only module that knows all of them.

config.task names the task (a GLUE task, conll2003 / conll for CoNLL column files, squad / squad_v2); its kind and
config.model.name choose the family that fine-tunes on it."""
from __future__ import annotations

import ml_collections

from pretrain.core.errors import ConfigError
from pretrain.families.base import Family
from pretrain.families.bert import BertFamily
from pretrain.families.bert_qa import BertQaFamily
from pretrain.families.bert_spans import BertSpanFamily
from pretrain.families.bert_tagging import BertTaggingFamily
from pretrain.families.gpt import GPTFamily
from pretrain.families.t5 import T5Family
from pretrain.families.t5_qa import T5QaFamily
from pretrain.glue.finetuning import GlueFineTuningTask
from pretrain.tasks import conll, squad
from pretrain.tasks.base import Task

FAMILIES = {"bert": BertFamily, "t5": T5Family, "gpt": GPTFamily}  # GLUE: sequence classification
TOKEN_FAMILIES = {("tagging", "bert"): BertTaggingFamily,          # the other kinds, by (kind, model)
                  ("span", "bert"): BertSpanFamily,
                  ("qa", "bert"): BertQaFamily,
                  ("qa", "t5"): T5QaFamily}


def task_for_config(config: ml_collections.ConfigDict) -> Task:
    """config.task -> the task (CoNLL tasks read config.data; a GLUE task is known by its name)."""
    if config.task in conll.NAMES:
        return conll.ConllTask.from_config(config)
    if config.task in squad.NAMES:
        return squad.SquadTask.from_config(config)
    return GlueFineTuningTask.named(config.task)


def for_config(config: ml_collections.ConfigDict, task: Task, tokenizer) -> Family:
    """The family for `task`'s kind and config.model.name, with its tokenizer."""
    if task.kind in ("classification", "regression"):
        family = FAMILIES.get(config.model.name)
        choices = ", ".join(map(repr, FAMILIES))
    else:
        family = TOKEN_FAMILIES.get((task.kind, config.model.name))
        choices = ", ".join(repr(model) for kind, model in TOKEN_FAMILIES if kind == task.kind)
    if family is None:
        raise ConfigError(f"config.model.name={config.model.name!r} cannot be fine-tuned on {task.name} here; "
                          f"use one of {choices}")
    return family(config, task, tokenizer)
