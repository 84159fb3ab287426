"""The fine-tuning families by name (config.model.name); the only module that knows all of them."""
from __future__ import annotations

import ml_collections

from pretrain.core.errors import ConfigError
from pretrain.families.base import Family
from pretrain.families.bert import BertFamily
from pretrain.families.gpt import GPTFamily
from pretrain.families.t5 import T5Family
from pretrain.glue.tasks import GlueTask

FAMILIES = {"bert": BertFamily, "t5": T5Family, "gpt": GPTFamily}


def for_config(config: ml_collections.ConfigDict, task: GlueTask, tokenizer) -> Family:
    """The family named by config.model.name, for `task` and its tokenizer."""
    family = FAMILIES.get(config.model.name)
    if family is None:
        raise ConfigError(f"config.model.name={config.model.name!r} cannot be fine-tuned here; "
                          f"use one of {', '.join(map(repr, FAMILIES))}")
    return family(config, task, tokenizer)
