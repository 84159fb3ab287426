"""Model families, built by name from `config.model`."""
from __future__ import annotations

import flax.linen as nn
import ml_collections


def build_model(config: ml_collections.ConfigDict) -> nn.Module:
    """config.model -> a Flax module. `name` picks the family; the other keys fill its dataclass."""
    fields = {k: v for k, v in config.to_dict().items() if k != "name"}
    if config.name == "bert":
        from models import bert
        return bert.BertForPreTraining(bert.BertConfig(**fields))
    raise ValueError(f"config.model.name={config.name!r} is unknown; available: 'bert'")
