"""Model families, built by name from `config.model`."""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import ml_collections


def config_dataclass(cls, fields: dict, family: str):
    """The family's config dataclass; an unknown key is an error that names it."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"config.model.{unknown[0]} is not a {family} field (known: {', '.join(sorted(known))})")
    return cls(**fields)


def build_model(config: ml_collections.ConfigDict) -> nn.Module:
    """config.model -> a Flax module. `name` picks the family; the other keys fill its dataclass."""
    fields = {k: v for k, v in config.to_dict().items() if k != "name"}
    if config.name == "bert":
        from models import bert
        return bert.BertForPreTraining(config_dataclass(bert.BertConfig, fields, "bert"))
    if config.name == "t5":
        from models import t5
        return t5.T5(config_dataclass(t5.T5Config, fields, "t5"))
    if config.name == "gpt":
        from models import gpt
        return gpt.GPT(config_dataclass(gpt.GPTConfig, fields, "gpt"))
    raise ValueError(f"config.model.name={config.name!r} is unknown; available: 'bert', 't5', 'gpt'")
