"""Parameter-efficient fine-tuning: the four methods of the adaptation literature, attached to the model families
from outside.

- adapters (models/peft/adapters.py): Houlsby's bottleneck on each sub-layer's output ("houlsby": after attention
  and the feed-forward block; "pfeiffer": after the second only).
- lora (models/peft/lora.py): (alpha / r) B A dropout(x) beside the targeted projections (query and value by
  default), B zeros, so the model is unchanged at step 0.
- prefix (models/peft/virtual_tokens.py): every attention layer attends to P extra key/value pairs, from a
  reparameterization MLP during training.
- prompt (models/peft/virtual_tokens.py): P trainable input embeddings before the token embeddings.

Each registers a `PeftMethod` in PEFT_METHODS (models/peft/methods.py) beside its definition; readers ask its
attributes. The families name none of them (tests/models/test_peft.py checks): a fine-tuning model takes the
model config and, separately, one frozen `PeftConfig`, and builds its body as `attach(base, peft)`
(models/peft/model.py): a wrapper in the base model's own scope that feeds the base's explicit optional inputs
(leading embeddings, leading keys and values) from the method's prompt / prefix_encoder, and runs it under the
method's Flax method interceptor (LoRA at the projections, adapters at each layer's sub-layer outputs). The
parameters are where the families once created them themselves (layer_i/attention/query/lora_a,
layer_i/mlp_adapter, prefix_encoder, prompt), so checkpoints and the converters (models/convert/peft_io.py) see
the same tree. Which parameters train is decided by name (`is_peft_path`), so a fine-tuning loop can freeze the
rest and store only these.
Shapes: B batch, L length, D width, H heads, K head dim, P virtual tokens, r rank, m bottleneck.
"""
from __future__ import annotations

from models.peft.methods import PEFT_METHODS, PeftMethod  # noqa: F401 ("none" registers here)
from models.peft.adapters import Adapter, AdapterInterceptor  # noqa: F401 (registers "adapters")
from models.peft.config import (LORA_TARGETS, NONE, PEFT_NAMES, PLACEMENTS, PeftConfig,  # noqa: F401
                                check_fits, is_peft_path)
from models.peft.lora import LoraInterceptor, LoraSpec, merge_lora  # noqa: F401 (registers "lora")
from models.peft.virtual_tokens import PrefixEncoder, Prompt, sample_vocabulary  # noqa: F401 (prefix, prompt)
from models.peft.model import PeftModel, attach  # noqa: F401

METHODS = PEFT_METHODS.names()  # none, adapters, lora, prefix, prompt
