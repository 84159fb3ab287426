"""Adapters (Houlsby et al. 2019, "Parameter-Efficient Transfer Learning for NLP"): a bottleneck
h + W_up f(W_down h) on a sub-layer's output, before it joins the residual stream; "houlsby" puts one after
attention (and cross-attention) and one after the feed-forward block, "pfeiffer" (Pfeiffer et al. 2021) only the
second. As the paper's code (google-research/adapter-bert): GELU, both projections N(0, 1e-3) truncated, zero
biases, so an adapter starts as the identity; the layer norms train with them.

`AdapterInterceptor` attaches them (installed around the base model's call, models/peft/model.py) at each layer's
sub-layer outputs (models/layers.py `Sublayers`): the adapter after sub-layer `name` is the layer's child
`{name}_adapter` (attention_adapter, mlp_adapter, ...).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers
from models.errors import ModelInputError
from models.layers import Dense
from models.peft.methods import PEFT_METHODS, PeftMethod


class Adapter(nn.Module):
    """Houlsby's bottleneck with its own skip: h + W_up gelu(W_down h + b_down) + b_up ([..., D] -> [..., D])."""
    size: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        init = nn.initializers.truncated_normal(1e-3)  # adapter-bert's init_scale: near the identity at start
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, kernel_init=init)
        down = Dense(self.size, ("embed", "adapter"), name="down", **kw)(h)
        return h + Dense(h.shape[-1], ("adapter", "embed"), name="up", **kw)(nn.gelu(down, approximate=False))


@dataclasses.dataclass(frozen=True)
class AdapterInterceptor:
    """The method interceptor (flax.linen.intercept_methods) of a PeftConfig with method 'adapters'."""
    peft: Any  # models.peft.PeftConfig

    def __call__(self, next_fun, args, kwargs, context):
        if context.method_name != "sublayer_output" or not isinstance(context.module, layers.Sublayers):
            return next_fun(*args, **kwargs)
        name, _ = _sublayer_output_inputs(*args, **kwargs)
        h = next_fun(*args, **kwargs)
        if name != "mlp" and self.peft.adapter_placement != "houlsby":  # pfeiffer: after the feed-forward block only
            return h
        # Created inside the layer's own call: the adapter is its child, layer_i/{name}_adapter.
        return Adapter(self.peft.adapter_size, name=f"{name}_adapter", **context.module.config.kwargs)(h)


def _sublayer_output_inputs(name: str, h: jax.Array) -> tuple[str, jax.Array]:
    """A `sublayer_output` call's arguments, however they were passed."""
    return name, h


def check_size(peft, dims) -> None:
    """A bottleneck wider than the model is none."""
    if peft.adapter_size > dims.width:
        raise ModelInputError(f"peft.adapter_size={peft.adapter_size} is wider than the model ({dims.width}): a "
                              f"bottleneck must be at most {dims.width}")


# Houlsby et al. train the layer norms with the adapters (config.peft.adapters.train_norms).
PEFT_METHODS.register("adapters", PeftMethod(interceptor=AdapterInterceptor, check=check_size, trains_norms=True))
