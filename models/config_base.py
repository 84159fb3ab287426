"""What the model families' configs share, written once: BertConfig, T5Config and GPTConfig inherit `ModelConfig`.

Its fields are keyword-only, so that each family's own fields keep their order and defaults. `dims` gives a family's
sizes in one vocabulary, for what is built beside a model for its sizes (models/peft/ attaches from outside).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Dims:
    """A family's sizes, in one vocabulary."""
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

    def __post_init__(self):
        """A family checks its own fields, then calls this (nothing shared to check yet)."""

    @property
    def dims(self) -> Dims:
        raise NotImplementedError(f"{type(self).__name__} gives no sizes (ModelConfig.dims)")

    @property
    def kwargs(self) -> dict:
        return dict(dtype=jnp.dtype(self.dtype), param_dtype=jnp.dtype(self.param_dtype))
