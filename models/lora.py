"""LoRA's low-rank update (Hu et al. 2021) as the projections apply it: beside the kernel it adapts (a Dense's
`lora_a`, `lora_b`, as peft's query.lora_A), or per part of a fused projection (models/qkv_layout.py).
models/peft.py configures it (PeftConfig.lora_for); models/layers.py's Dense applies it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import ops

PeftConfig = Any  # models.peft.PeftConfig (which imports models.layers, which imports this): `lora_for(name)`


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    dropout: float

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def kaiming_uniform_a(key, shape, dtype=jnp.float32):
    """peft's init of A (torch's kaiming_uniform_ with a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the
    input dimensions are every axis but the last (the rank)."""
    bound = 1 / math.sqrt(math.prod(shape[:-1]))
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def low_rank_update(module: nn.Module, x: jax.Array, spec: LoraSpec, axis: tuple[int, ...],
                    in_axes: tuple[str | None, ...], features: tuple[int, ...], out_axes: tuple[str | None, ...],
                    dtype, param_dtype, deterministic: bool) -> jax.Array:
    """(alpha / r) dropout(x) A B, contracting x's `axis` dims; creates `lora_a` [*in, r] and `lora_b`
    [r, *features] in `module` (a Dense: the update sits beside its kernel, as peft's query.lora_A)."""
    a = module.param("lora_a", nn.with_logical_partitioning(kaiming_uniform_a, in_axes + (None,)),
                     tuple(x.shape[i] for i in axis) + (spec.rank,), param_dtype)
    b = module.param("lora_b", nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,) + out_axes),
                     (spec.rank,) + features, param_dtype)
    x = ops.Dropout(spec.dropout)(x, deterministic=deterministic or spec.dropout == 0)
    h = ops.contract(x.astype(dtype), jnp.asarray(a, dtype), axis)  # as a Dense contracts (models/ops.py)
    y = ops.contract(h, jnp.asarray(b, dtype), (h.ndim - 1,))
    return y * jnp.asarray(spec.scale, dtype)


def lora_for(peft: PeftConfig | None, name: str) -> LoraSpec | None:
    """The LoRA update of projection `name` under a PEFT config (None: no config, or not a LoRA target)."""
    return None if peft is None else peft.lora_for(name)


class PartUpdate(nn.Module):
    """The update of one part of a fused projection (qkv's query, key or value): its `lora_a` and `lora_b` are
    the separate projection's, one level down (qkv/query/lora_a), so a layout change moves them as they are."""
    spec: LoraSpec
    in_axes: tuple[str | None, ...]
    out_axes: tuple[str | None, ...]
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, axis: tuple[int, ...], features: tuple[int, ...],
                 deterministic: bool) -> jax.Array:
        return low_rank_update(self, x, self.spec, axis, self.in_axes, features, self.out_axes, self.dtype,
                               self.param_dtype, deterministic)


def parts_update(x: jax.Array, parts: tuple[tuple[str, LoraSpec | None], ...], axis: tuple[int, ...],
                 kernel_axes: tuple[str | None, ...], features: tuple[int, ...], dtype, param_dtype,
                 deterministic: bool) -> jax.Array:
    """-> [..., *features], the updates of a projection whose first feature axis holds len(parts) projections:
    part i gets its own (named parts[i][0], a child of the calling module) or none (spec None: zeros). Call it
    in a Dense's compact method."""
    rows = tuple(n for i, n in enumerate(x.shape) if i not in axis)
    in_axes, out_axes = kernel_axes[:len(axis)], kernel_axes[len(axis) + 1:]
    updates = [jnp.zeros(rows + features[1:], dtype) if spec is None
               else PartUpdate(spec, in_axes, out_axes, dtype, param_dtype, name=name)(x, axis, features[1:],
                                                                                       deterministic)
               for name, spec in parts]
    return jnp.stack(updates, axis=len(rows))
