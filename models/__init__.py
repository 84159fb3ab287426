"""Model families, built by name from `config.model`: the one place a config becomes a module.

`model_config(config.model)` turns the config's fields into the family's frozen dataclass (BertConfig,
T5Config, GPTConfig); `build_model(config.model)` wraps it in the pretraining module. The fine-tuning modules
(models/bert_tasks.py, models/modernbert_tasks.py, models/gpt_tasks.py: one constructor, config + head kind + labels +
options + PEFT method) take the same dataclass. The families themselves, with everything else of models/ that differs
per family, are registered in models/families.py (FAMILIES, a models/registry.py Registry); what the layers above
add per family registers in their own rooms.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn

from models.errors import ModelInputError
from models.families import FAMILIES, ModelFamily, family  # noqa: F401 (the table, re-exported)

# Keys a fine-tuning config keeps beside the architecture: they configure the task head, not the body.
HEAD_KEYS = ("classifier_dropout",)


def model_config(fields: Mapping[str, Any], **overrides) -> Any:
    """config.model ('name' picks the family, HEAD_KEYS are left to the head) + overrides -> the family's
    config dataclass. Any other key the dataclass lacks is an error that names it."""
    fields = dict(fields.to_dict() if hasattr(fields, "to_dict") else fields, **overrides)
    cls = family(fields.pop("name", None)).config_cls()
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known - set(HEAD_KEYS))
    if unknown:
        raise ModelInputError(f"config.model.{unknown[0]} is not a {cls.__name__} field "
                              f"(known: {', '.join(sorted(known))})")
    return cls(**{k: v for k, v in fields.items() if k in known})


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """config.model -> the family's pretraining module (BertForPreTraining, T5, GPT)."""
    return family(config["name"]).model_cls()(model_config(config))
