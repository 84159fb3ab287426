"""A PEFT method attached to a base model from outside: `attach(base, peft)`.

The base model (BertModel, GPT, T5, ModernBertModel) knows no PEFT method. What it takes are explicit optional
inputs of its entry methods (`__call__`, `encode`, `decode`, `hidden_states`): `leading` embeddings [B, P, D] in
front of the input (Hugging Face's inputs_embeds, prepended) and `keys_values` [layers, 2, P, H, K] that each
self-attention layer attends to first (past_key_values). `PeftModel` wraps it:
- in the base model's own scope (flax.linen.share_scope), so the parameters keep the paths they always had
  (bert/embeddings/..., bert/prefix_encoder, bert/prompt, layer_i/attention/query/lora_a, layer_i/mlp_adapter):
  checkpoints, models/convert/peft_io.py and the exports see the same tree;
- it builds the method's token module (prefix_encoder, prompt) there and feeds its output to the entry method's
  `leading` or `keys_values` argument, where that method takes it;
- it runs the entry method under the method's Flax method interceptor (LoRA beside the projections, adapters on the
  sub-layer outputs, models/layers.py Sublayers), installed once around the call however the base's methods nest.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any

import flax.linen as nn
import jax

from models.errors import ModelInputError
from models.peft.config import PeftConfig, check_fits
from models.peft.methods import PEFT_METHODS, PeftMethod


class PeftModel(nn.Module):
    """`base` with the PEFT method `peft` attached; its entry methods take the base's arguments."""
    base: nn.Module
    peft: PeftConfig

    def setup(self):
        nn.share_scope(self, self.base)  # the base's parameters, and ours beside them, under one name
        method = self.method
        if method.tokens is not None:  # named as the method says (prefix_encoder, prompt): setup names by attribute
            setattr(self, method.tokens_name, method.tokens(self.peft, self.base.config.dims, self.base.config.kwargs))

    @property
    def method(self) -> PeftMethod:
        return PEFT_METHODS.get(self.peft.method)

    @property
    def config(self) -> Any:
        """The base model's config (what decoding reads of a model: models/gpt.py, t5.py init_cache)."""
        return self.base.config

    def __call__(self, *args, **kwargs):
        return self._run("__call__", args, kwargs)

    def encode(self, *args, **kwargs):
        return self._run("encode", args, kwargs)

    def decode(self, *args, **kwargs):
        return self._run("decode", args, kwargs)

    def hidden_states(self, *args, **kwargs):
        return self._run("hidden_states", args, kwargs)

    def _run(self, name: str, args: tuple, kwargs: dict):
        """The base's method `name` with the leading tokens it takes, under the method's interceptor."""
        run = getattr(self.base, name)
        method = self.method
        if method.feeds and method.feeds in inspect.signature(run).parameters:
            kwargs = {**kwargs, method.feeds: self._tokens(args, kwargs)}
        interceptor = method.interceptor(self.peft) if method.interceptor is not None else None
        with nn.intercept_methods(interceptor) if interceptor is not None else contextlib.nullcontext():
            return run(*args, **kwargs)

    def _tokens(self, args: tuple, kwargs: dict) -> jax.Array:
        """The method's leading tokens for a call whose first array is [B, ...]."""
        if kwargs.get("decode") and self.method.feeds == "leading":
            raise ModelInputError("decode=True with prompt tuning is not supported: its virtual tokens are not in "
                                  "the cache (use prefix-tuning or LoRA for generation)")
        batch = next(x for x in jax.tree.leaves((args, kwargs)) if getattr(x, "ndim", 0)).shape[0]
        return getattr(self, self.method.tokens_name)(batch)


def attach(base: nn.Module, peft: PeftConfig) -> nn.Module:
    """`base` with `peft`'s method attached (the base itself for method 'none'); one-line errors where the method
    does not fit the base's sizes (models.config_base.Dims)."""
    check_fits(peft, base.config.dims)
    method = PEFT_METHODS.get(peft.method)
    if method.interceptor is None and method.tokens is None:
        return base
    return PeftModel(base, peft)
