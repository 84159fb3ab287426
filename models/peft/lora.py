"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): W x + (alpha / r) B A dropout(x)
on the targeted projections (query and value by default); A [in, r] as peft initializes it (Kaiming-uniform:
U(-1/sqrt(in), 1/sqrt(in))), B [r, out] zeros, so the model is unchanged at step 0.

`LoraInterceptor` attaches it (installed around the base model's call, models/peft/model.py): each targeted layers.Dense of an attention layer (query, key, value, out) or a
feed-forward block (intermediate, output) gets `lora_a`, `lora_b` beside its kernel (as peft's query.lora_A), and
adds the update to its output; a fused projection (qkv, models/qkv_layout.py) gets one update per part.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers, ops
from models.errors import ModelInputError
from models.peft.methods import PEFT_METHODS, PeftMethod

PROJECTIONS = {layers.MultiHeadAttention: ("query", "key", "value", "out"), layers.MLP: ("intermediate", "output")}
FUSED = "qkv"  # models/layers.py: self-attention's query, key and value as one Dense


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    dropout: float

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class LoraInterceptor:
    """The method interceptor (flax.linen.intercept_methods) of a PeftConfig with method 'lora'."""
    peft: Any  # models.peft.PeftConfig

    def __call__(self, next_fun, args, kwargs, context):
        dense = context.module
        if context.method_name != "__call__" or not isinstance(dense, layers.Dense):
            return next_fun(*args, **kwargs)
        y = next_fun(*args, **kwargs)  # the kernel and bias first: the same parameter order, the same sums
        x, deterministic = _dense_inputs(*args, **kwargs)
        axis, features = dense.contracted(x.ndim)
        parts = self._parts(dense)
        if len(parts) == 1 and parts[0][1] is not None:  # a separate projection
            return y + low_rank_update(dense, x, parts[0][1], axis, dense.kernel_axes[:len(axis)], features,
                                       dense.kernel_axes[len(axis):], dense.dtype, dense.param_dtype, deterministic)
        if len(parts) > 1 and any(spec for _, spec in parts):
            return y + parts_update(x, parts, axis, dense.kernel_axes, features, dense.dtype, dense.param_dtype,
                                    deterministic)
        return y

    def _parts(self, dense: layers.Dense) -> tuple[tuple[str, LoraSpec | None], ...]:
        """The projections this Dense computes, each with its update or None: one, three (fused qkv) or none."""
        names = next((names for cls, names in PROJECTIONS.items() if isinstance(dense.parent, cls)), ())
        if dense.name in names:
            return ((dense.name, self.peft.lora_for(dense.name)),)
        if dense.name == FUSED and isinstance(dense.parent, layers.MultiHeadAttention):
            return tuple((name, self.peft.lora_for(name)) for name in ("query", "key", "value"))
        return ()


def _dense_inputs(x: jax.Array, deterministic: bool = True) -> tuple[jax.Array, bool]:
    """A layers.Dense call's arguments, however they were passed."""
    return x, deterministic


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
    inside the Dense's call (its interceptor)."""
    rows = tuple(n for i, n in enumerate(x.shape) if i not in axis)
    in_axes, out_axes = kernel_axes[:len(axis)], kernel_axes[len(axis) + 1:]
    updates = [jnp.zeros(rows + features[1:], dtype) if spec is None
               else PartUpdate(spec, in_axes, out_axes, dtype, param_dtype, name=name)(x, axis, features[1:],
                                                                                       deterministic)
               for name, spec in parts]
    return jnp.stack(updates, axis=len(rows))


def merge_lora(params: Any, scale: float) -> Any:
    """A LoRA-trained parameter tree in the looped, unfused layout (`qkv_layout.hf_layout(params)`: a scanned
    stack's leading layer axis would read as an input axis) -> the plain tree of the base architecture: every
    kernel beside a `lora_a`/`lora_b` pair becomes kernel + scale * A B, and the pair is dropped (for export)."""
    if not isinstance(params, dict):
        return params
    out = {k: merge_lora(v, scale) for k, v in params.items() if k not in ("lora_a", "lora_b")}
    if "lora_a" in params:
        a, b = jnp.asarray(params["lora_a"], jnp.float32), jnp.asarray(params["lora_b"], jnp.float32)
        kernel = params["kernel"]
        update = jnp.tensordot(a, b, axes=1).reshape(kernel.shape) * scale
        out["kernel"] = (jnp.asarray(kernel, jnp.float32) + update).astype(kernel.dtype)
    return out


def projection_ranks(dims) -> dict[str, int]:
    """The rank of each projection LoRA may target (dims: models.config_base.Dims): the smaller of its input and
    output widths (width D, attention H * K, feed-forward d_ff)."""
    attention_rank, mlp_rank = min(dims.width, dims.heads * dims.head_dim), min(dims.width, dims.mlp_width)
    return {**dict.fromkeys(("query", "key", "value", "out"), attention_rank), "intermediate": mlp_rank,
            "output": mlp_rank}


def check_rank(peft, dims) -> None:
    """A LoRA rank above a targeted projection's rank is no low-rank update."""
    ranks = projection_ranks(dims)
    for target in peft.lora_targets:  # PeftConfig checked the names
        if peft.lora_rank > ranks[target]:
            raise ModelInputError(f"peft.lora_rank={peft.lora_rank} exceeds the {target} projection's rank "
                                  f"{ranks[target]}: use a rank of at most {ranks[target]}")


PEFT_METHODS.register("lora", PeftMethod(interceptor=LoraInterceptor, check=check_rank))
