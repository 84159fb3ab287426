"""Model families, built by name from `config.model`: the one place a config becomes a module.

`model_config(config.model)` turns the config's fields into the family's frozen dataclass (BertConfig,
T5Config, GPTConfig); `build_model(config.model)` wraps it in the pretraining module. Fine-tuning
modules (models/finetuning.py, models/gpt_heads.py) take the same dataclass.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn

from models.errors import ModelInputError

FAMILIES = ("bert", "t5", "gpt")
# Keys a fine-tuning config keeps beside the architecture: they configure the task head, not the body.
HEAD_KEYS = ("classifier_dropout",)


def config_class(name: str) -> type:
    """The config dataclass of family `name` (its module is imported on demand)."""
    if name == "bert":
        from models.bert import BertConfig
        return BertConfig
    if name == "t5":
        from models.t5 import T5Config
        return T5Config
    if name == "gpt":
        from models.gpt import GPTConfig
        return GPTConfig
    raise ModelInputError(f"config.model.name={name!r} is unknown; available: {', '.join(map(repr, FAMILIES))}")


def model_config(fields: Mapping[str, Any], **overrides) -> Any:
    """config.model ('name' picks the family, HEAD_KEYS are left to the head) + overrides -> the family's
    config dataclass. Any other key the dataclass lacks is an error that names it."""
    fields = dict(fields.to_dict() if hasattr(fields, "to_dict") else fields, **overrides)
    cls = config_class(fields.pop("name", None))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known - set(HEAD_KEYS))
    if unknown:
        raise ModelInputError(f"config.model.{unknown[0]} is not a {cls.__name__} field "
                              f"(known: {', '.join(sorted(known))})")
    return cls(**{k: v for k, v in fields.items() if k in known})


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """config.model -> the family's pretraining module (BertForPreTraining, T5, GPT)."""
    model_config_ = model_config(config)
    if config["name"] == "bert":
        from models.bert import BertForPreTraining
        return BertForPreTraining(model_config_)
    if config["name"] == "t5":
        from models.t5 import T5
        return T5(model_config_)
    from models.gpt import GPT
    return GPT(model_config_)
