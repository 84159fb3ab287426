"""Parameter-efficient fine-tuning: the four methods of the adaptation literature, attached to the model families
from outside.

- adapters (models/peft/adapters.py): Houlsby's bottleneck on each sub-layer's output ("houlsby": after attention
  and the feed-forward block; "pfeiffer": after the second only).
- lora (models/peft/lora.py): (alpha / r) B A dropout(x) beside the targeted projections (query and value by
  default), B zeros, so the model is unchanged at step 0.
- prefix (models/peft/virtual_tokens.py): every attention layer attends to P extra key/value pairs, from a
  reparameterization MLP during training.
- prompt (models/peft/virtual_tokens.py): P trainable input embeddings before the token embeddings.

The families name none of them (tests/models/test_peft.py checks): a model config carries one frozen `PeftConfig`
(its `peft` field, models/config_base.py), and the model's entry methods run under `interceptor(peft)`
(models/extension.py `attached`), a Flax method interceptor that adds the method's modules at the models' generic
extension points: the projections (layers.Dense under attention and MLP, by name), each layer's sub-layer
outputs and the model's leading tokens. The parameters are where the families once created them themselves
(layer_i/attention/query/lora_a, layer_i/mlp_adapter, prefix_encoder, prompt), so checkpoints and the
converters (models/convert/peft_io.py) see the same tree. Which parameters train is decided by name
(`is_peft_path`), so a fine-tuning loop can freeze the rest and store only these.
Shapes: B batch, L length, D width, H heads, K head dim, P virtual tokens, r rank, m bottleneck.
"""
from __future__ import annotations

from typing import Callable

from models.peft.adapters import Adapter, AdapterInterceptor
from models.peft.config import (LORA_TARGETS, METHODS, NONE, PEFT_NAMES, PLACEMENTS, PeftConfig,  # noqa: F401
                                check_fits, is_peft_path)
from models.peft.lora import LoraInterceptor, LoraSpec, merge_lora  # noqa: F401
from models.peft.virtual_tokens import PrefixEncoder, Prompt, VirtualTokenInterceptor, sample_vocabulary  # noqa: F401

INTERCEPTORS = {"adapters": AdapterInterceptor, "lora": LoraInterceptor, "prefix": VirtualTokenInterceptor,
                "prompt": VirtualTokenInterceptor}


def interceptor(peft: PeftConfig) -> Callable | None:
    """The Flax method interceptor that attaches `peft`'s method to a model (None: method 'none'). Equal configs
    give equal interceptors (models/extension.py installs one once, however its entry methods nest)."""
    return INTERCEPTORS[peft.method](peft) if peft.method in INTERCEPTORS else None
