"""What the model families' configs share, written once: BertConfig, T5Config and GPTConfig inherit `ModelConfig`.

Its fields are keyword-only, so that each family's own fields keep their order and defaults. `peft` is the
fine-tuning extension (models/peft/): the families never read it. Their entry methods run under `interceptor`
(models/extension.py), which builds its modules for the sizes `dims` gives; `leading_embeddings` and
`leading_positions` say what it puts in front of the input, for what is decided before a model runs (T5's
encoder segments, GPT's cache size).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp

from models import peft


@dataclasses.dataclass(frozen=True)
class Dims:
    """A family's sizes, as an extension sees them."""
    width: int                # D, the residual stream
    layers: int               # the self-attention layers that take leading keys and values (T5: the decoder's)
    heads: int                # H
    head_dim: int             # K
    mlp_width: int            # the feed-forward block's inner width
    positions: int | None     # the position table's size; None: relative positions, no limit


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    dtype: str = "float32"               # compute dtype (activations): float32 | bfloat16
    param_dtype: str = "float32"         # storage dtype of the weights
    attention: str = "auto"              # auto | einsum | xla | cudnn | pallas (models/attention.py)
    scan_layers: bool = False            # one scanned layer, weights stacked [L, ...] (models/stack.py)
    fused_qkv: bool = False              # self-attention's q/k/v: one Dense [D, 3, H, K] (models/qkv_layout.py)
    remat: str = "none"                  # none | minimal | full: activations recomputed in the backward pass
    peft: peft.PeftConfig = peft.NONE    # adapters | lora | prefix | prompt (models/peft/), fine-tuning only

    def __post_init__(self):
        """The extension against the family's sizes; a family checks its own fields first, then calls this."""
        d = self.dims
        peft.check_fits(self.peft, width=d.width, context=d.positions, attention_width=d.heads * d.head_dim,
                        mlp_width=d.mlp_width)

    @property
    def dims(self) -> Dims:
        raise NotImplementedError(f"{type(self).__name__} gives no sizes (ModelConfig.dims)")

    @property
    def kwargs(self) -> dict:
        return dict(dtype=jnp.dtype(self.dtype), param_dtype=jnp.dtype(self.param_dtype))

    @property
    def interceptor(self) -> Callable | None:
        """The Flax method interceptor that attaches the extension (None: nothing attached)."""
        return peft.interceptor(self.peft)

    @property
    def leading_embeddings(self) -> int:
        """P: the embeddings the extension puts in front of the input, which join its sequence (0: none)."""
        return self.peft.virtual_inputs

    @property
    def leading_positions(self) -> int:
        """The positions the extension takes in front of the input's, as embeddings or keys and values (0: none)."""
        return self.peft.virtual_positions
