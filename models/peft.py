"""Parameter-efficient fine-tuning: the four methods of the adaptation literature, as Flax modules.

- adapters (Houlsby et al. 2019, "Parameter-Efficient Transfer Learning for NLP"): a bottleneck
  h + W_up f(W_down h) on a sub-layer's output, before it joins the residual stream; "houlsby" puts one
  after attention and one after the feed-forward block, "pfeiffer" (Pfeiffer et al. 2021) only the
  second. As the paper's code (google-research/adapter-bert): GELU, both projections N(0, 1e-3)
  truncated, zero biases, so an adapter starts as the identity; the layer norms train with them.
- lora (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): W x + (alpha / r) B A
  dropout(x) on the targeted projections (query and value by default); A [in, r] as peft initializes it
  (Kaiming-uniform: U(-1/sqrt(in), 1/sqrt(in))), B [r, out] zeros, so the model is unchanged at step 0.
- prefix (Li & Liang 2021, "Prefix-Tuning"): every attention layer attends to P extra key/value pairs
  before the sequence's own. During training they come from a reparameterization (Section 4.3):
  P' [P, D] -> Linear(D, hidden) -> tanh -> Linear(hidden, layers * 2 * H * K); hidden_size=0 trains the
  key/value table itself.
- prompt (Lester et al. 2021, "The Power of Scale for Parameter-Efficient Prompt Tuning"): P trainable
  input embeddings before the token embeddings; the rest of the model sees a longer input.

The model families read one frozen `PeftConfig` (their config's `peft` field); which parameters train is
decided by name (`is_peft_path`), so a fine-tuning loop can freeze the rest and store only these.
Shapes: B batch, L length, D width, H heads, K head dim, P virtual tokens, r rank, m bottleneck.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models.errors import ModelInputError
from models.layers import Dense
from models.lora import LoraSpec

METHODS = ("none", "adapters", "lora", "prefix", "prompt")
PLACEMENTS = ("houlsby", "pfeiffer")
LORA_TARGETS = ("query", "key", "value", "out", "intermediate", "output")  # attention and MLP projections
# Parameter names that only PEFT creates: whatever lies under one of them trains (and is all a PEFT
# checkpoint stores, with the task head).
PEFT_NAMES = ("lora_a", "lora_b", "attention_adapter", "cross_attention_adapter", "mlp_adapter", "prefix_encoder",
              "prompt")


@dataclasses.dataclass(frozen=True)
class PeftConfig:
    method: str = "none"                       # one of METHODS
    adapter_size: int = 64                     # m: the bottleneck width
    adapter_placement: str = "houlsby"         # houlsby: after attention and the FFN | pfeiffer: after the FFN
    lora_rank: int = 8                         # r
    lora_alpha: float = 8.0                    # the update is scaled by alpha / r
    lora_dropout: float = 0.0                  # on the low-rank branch's input
    lora_targets: tuple[str, ...] = ("query", "value")
    prefix_length: int = 20                    # P key/value pairs per layer
    prefix_hidden_size: int = 512              # the reparameterization MLP's width; 0 = train the table itself
    prompt_length: int = 20                    # P input embeddings

    def __post_init__(self):
        checks = (("method", self.method, METHODS), ("adapter_placement", self.adapter_placement, PLACEMENTS))
        for name, value, allowed in checks:
            if value not in allowed:
                raise ModelInputError(f"peft.{name}={value!r} is not one of {', '.join(allowed)}")
        unknown = [t for t in self.lora_targets if t not in LORA_TARGETS]
        if unknown or not self.lora_targets:
            raise ModelInputError(f"peft.lora_targets={self.lora_targets!r}: each must be one of "
                                  f"{', '.join(LORA_TARGETS)}")
        for name in ("adapter_size", "lora_rank", "prefix_length", "prompt_length"):
            if getattr(self, name) < 1:
                raise ModelInputError(f"peft.{name}={getattr(self, name)} must be a positive integer")

    def lora_for(self, name: str) -> LoraSpec | None:
        """The low-rank update of the projection `name`, or None where LoRA leaves it alone."""
        if self.method != "lora" or name not in self.lora_targets:
            return None
        return LoraSpec(self.lora_rank, self.lora_alpha, self.lora_dropout)

    @property
    def adapters_after_attention(self) -> bool:
        return self.method == "adapters" and self.adapter_placement == "houlsby"

    @property
    def adapters_after_mlp(self) -> bool:
        return self.method == "adapters"

    @property
    def virtual_positions(self) -> int:
        """Positions the method takes in front of the input: P for prefix-tuning (a Hugging Face model given
        the prefix as past keys and values numbers the tokens from P) and for prompt tuning (P virtual tokens)."""
        return {"prefix": self.prefix_length, "prompt": self.prompt_length}.get(self.method, 0)


NONE = PeftConfig()  # the model configs' default: no PEFT method


def check_fits(peft: PeftConfig, *, width: int, context: int | None, attention_width: int = 0,
               mlp_width: int = 0) -> None:
    """Errors for a PEFT config this model cannot take. A LoRA rank above the smaller of a projection's input
    and output widths (width D, attention H * K, feed-forward d_ff) is no low-rank update; `context` = the
    model's positions (None: relative positions, no limit)."""
    attention_rank, mlp_rank = min(width, attention_width or width), min(width, mlp_width or width)
    projections = {**dict.fromkeys(("query", "key", "value", "out"), attention_rank),
                   "intermediate": mlp_rank, "output": mlp_rank}
    if peft.method == "lora":
        for target in peft.lora_targets:  # PeftConfig checked the names
            if peft.lora_rank > projections[target]:
                raise ModelInputError(f"peft.lora_rank={peft.lora_rank} exceeds the {target} projection's rank "
                                      f"{projections[target]}: use a rank of at most {projections[target]}")
    if peft.method == "adapters" and peft.adapter_size > width:
        raise ModelInputError(f"peft.adapter_size={peft.adapter_size} is wider than the model ({width}): a bottleneck "
                              f"must be at most {width}")
    if peft.virtual_positions and context is not None and peft.virtual_positions >= context:
        raise ModelInputError(f"peft.{peft.method}_length={peft.virtual_positions} leaves no room in the model's "
                              f"context of {context} positions: use fewer than {context}")


def is_peft_path(names: tuple[str, ...] | list[str]) -> bool:
    """Whether a parameter at this path (its dict keys) belongs to a PEFT method."""
    return any(name in PEFT_NAMES for name in names)


# ---------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# Adapters
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# Prefix-tuning and prompt tuning
# ---------------------------------------------------------------------------------------------
class PrefixEncoder(nn.Module):
    """-> [layers, 2, P, H, K]: each layer's P prefix keys ([:, 0]) and values ([:, 1]).

    As Li & Liang's code and peft's PrefixEncoder: with hidden_size > 0 an embedding [P, D] goes through
    Linear(D, hidden) -> tanh -> Linear(hidden, layers * 2 * H * K); otherwise the embedding is
    [P, layers * 2 * H * K] itself. The flat last axis is ordered (layer, key/value, head, head dim),
    peft's order, so its weights load as they are.
    """
    length: int
    num_layers: int
    num_heads: int
    head_dim: int
    width: int                 # D, the reparameterization's input width
    hidden_size: int = 0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self) -> jax.Array:
        out = self.num_layers * 2 * self.num_heads * self.head_dim
        init = nn.initializers.normal(1.0)  # torch.nn.Embedding's init, as peft's
        if self.hidden_size:
            table = self.param("embedding", nn.with_logical_partitioning(init, (None, "embed")),
                               (self.length, self.width), self.param_dtype)
            kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
            h = Dense(self.hidden_size, ("embed", "mlp"), name="transform", **kw)(jnp.asarray(table, self.dtype))
            h = jnp.tanh(h)
            flat = Dense(out, ("mlp", None), name="output", **kw)(h)
        else:
            flat = jnp.asarray(self.param("embedding", nn.with_logical_partitioning(init, (None, None)),
                                          (self.length, out), self.param_dtype), self.dtype)
        flat = flat.reshape(self.length, self.num_layers, 2, self.num_heads, self.head_dim)
        return jnp.transpose(flat, (1, 2, 0, 3, 4))


class Prompt(nn.Module):
    """The P trainable input embeddings [P, D] of prompt tuning. Initialized N(0, 1) here; fine-tuning from a
    pretrained model replaces them by embeddings of sampled vocabulary entries (Lester et al. 2021, Section
    3: "initialize each prompt token to an embedding drawn from the model's vocabulary"), `sample_vocabulary`."""
    length: int
    width: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, batch: int) -> jax.Array:  # -> [B, P, D]
        table = self.param("embedding", nn.with_logical_partitioning(nn.initializers.normal(1.0), (None, "embed")),
                           (self.length, self.width), self.param_dtype)
        return jnp.broadcast_to(jnp.asarray(table, self.dtype)[None], (batch, self.length, self.width))


def virtual_modules(peft: PeftConfig, *, num_layers: int, num_heads: int, head_dim: int, width: int,
                    **kwargs) -> tuple[PrefixEncoder | None, Prompt | None]:
    """The (prefix_encoder, prompt) a model family sets up: the one its PEFT method uses, None for the other."""
    prefix = (PrefixEncoder(peft.prefix_length, num_layers, num_heads, head_dim, width, peft.prefix_hidden_size,
                            **kwargs) if peft.method == "prefix" else None)
    prompt = Prompt(peft.prompt_length, width, **kwargs) if peft.method == "prompt" else None
    return prefix, prompt


def prepend_positions(positions: jax.Array, length: int) -> jax.Array:
    """[B|1, L] positions -> [B|1, P + L]: the P virtual positions 0..P-1 first, the input's moved up by P."""
    virtual = jnp.broadcast_to(jnp.arange(length, dtype=positions.dtype), positions.shape[:1] + (length,))
    return jnp.concatenate([virtual, positions + length], axis=1)


def sample_vocabulary(embedding: np.ndarray, length: int, seed: int) -> np.ndarray:
    """[V, D] embedding table -> [length, D]: the rows of `length` distinct token ids drawn uniformly (peft's
    SAMPLE_VOCAB; Lester et al. drew from the 5,000 most common tokens, which a vocabulary file does not say)."""
    rows = np.random.default_rng(seed).choice(embedding.shape[0], size=length, replace=False)
    return np.asarray(embedding)[rows]
