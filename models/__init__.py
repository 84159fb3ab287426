"""Model families, built by name from `config.model`: the one place a config becomes a module.

`model_config(config.model)` turns the config's fields into the family's frozen dataclass (BertConfig,
T5Config, GPTConfig); `build_model(config.model)` wraps it in the pretraining module. Fine-tuning
modules (models/finetuning.py, models/gpt_heads.py) take the same dataclass.
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

import flax.linen as nn

from models.errors import ModelInputError

# Keys a fine-tuning config keeps beside the architecture: they configure the task head, not the body.
HEAD_KEYS = ("classifier_dropout",)
# family -> (module, config dataclass, pretraining module); modules are imported on demand.
FAMILIES = {
    "bert": ("models.bert", "BertConfig", "BertForPreTraining"),
    "t5": ("models.t5", "T5Config", "T5"),
    "gpt": ("models.gpt", "GPTConfig", "GPT"),
}


def _family(name: str) -> tuple[type, type]:
    """-> (config dataclass, pretraining module class) of family `name`."""
    if name not in FAMILIES:
        raise ModelInputError(f"config.model.name={name!r} is unknown; available: {', '.join(map(repr, FAMILIES))}")
    module, config_cls, model_cls = FAMILIES[name]
    module = importlib.import_module(module)
    return getattr(module, config_cls), getattr(module, model_cls)


def model_config(fields: Mapping[str, Any], **overrides) -> Any:
    """config.model ('name' picks the family, HEAD_KEYS are left to the head) + overrides -> the family's
    config dataclass. Any other key the dataclass lacks is an error that names it."""
    fields = dict(fields.to_dict() if hasattr(fields, "to_dict") else fields, **overrides)
    cls, _ = _family(fields.pop("name", None))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known - set(HEAD_KEYS))
    if unknown:
        raise ModelInputError(f"config.model.{unknown[0]} is not a {cls.__name__} field "
                              f"(known: {', '.join(sorted(known))})")
    return cls(**{k: v for k, v in fields.items() if k in known})


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """config.model -> the family's pretraining module (BertForPreTraining, T5, GPT)."""
    _, module_cls = _family(config["name"])
    return module_cls(model_config(config))
