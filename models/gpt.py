"""GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"): a decoder-only LM.

As OpenAI's released model and Hugging Face's GPT2LMHeadModel: learned position embeddings added to
the token embeddings, pre-LayerNorm blocks x += Attn(LN(x)); x += MLP(LN(x)) (Section 2.3: "layer
normalization was moved to the input of each sub-block ... an additional layer normalization was
added after the final self-attention block"), causal self-attention with biases scaled by
1/sqrt(head_dim), a GELU MLP of width 4 * d_model with GELU's tanh approximation (HF's "gelu_new",
as OpenAI's TensorFlow code), and the output layer tied to the token embedding. Dropout as GPT-2's
embd_pdrop / resid_pdrop (`dropout_rate`: after the embeddings and on each sub-block's output) and
attn_pdrop (`attention_dropout_rate`: on the attention probabilities). Initialisation: N(0, 0.02)
everywhere and N(0, 0.02 / sqrt(2 * num_layers)) for the two output projections of each block that
write into the residual stream (Section 2.3; HF's _init_weights, nanoGPT's c_proj).

Batches (the project's decoder-only contract): packed rows with segment ids (0 = padding,
1..n = packed documents) and positions restarting at 0 per document; attention is causal AND within
one nonzero segment. Prefix LM (Raffel et al. 2020, Section 3.2.1; Liu et al. 2018): tokens of a
row's prefix (`prefix_lengths` [B] or `bidirectional_mask` [B, L]) attend to each other
bidirectionally; every other pair stays causal. Incremental decoding: `init_cache` and
`make_tokens_to_logits` at the bottom (the interface of models/decoding.py).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import attention, layers, ops, stack
from models.config_base import Dims, ModelConfig
from models.errors import ModelInputError


@dataclasses.dataclass(frozen=True)
class GPTConfig(ModelConfig):  # + dtype, param_dtype, attention, scan_layers, fused_qkv, remat (models/config_base.py)
    vocab_size: int = 50257
    n_positions: int = 1024               # the largest position embedded (GPT-2's context)
    d_model: int = 768
    num_layers: int = 12
    num_heads: int = 12
    d_ff: int = 3072                      # 4 * d_model in every GPT-2
    dropout_rate: float = 0.1             # embd_pdrop = resid_pdrop
    attention_dropout_rate: float = 0.1   # attn_pdrop
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    use_bias: bool = True                 # False: no biases in Linear layers and LayerNorms (nanoGPT's bias=False)

    def __post_init__(self):
        if self.d_model % self.num_heads:
            raise ModelInputError(f"GPTConfig.d_model={self.d_model} must be a multiple of num_heads={self.num_heads}")
        super().__post_init__()

    @property
    def dims(self) -> Dims:
        return Dims(width=self.d_model, layers=self.num_layers, heads=self.num_heads, head_dim=self.head_dim,
                    mlp_width=self.d_ff, positions=self.n_positions)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def init(self, residual_output: bool = False) -> layers.Initializer:
        """N(0, initializer_range); the projections into the residual stream are scaled by 1/sqrt(2 * layers)."""
        scale = 1 / math.sqrt(2 * self.num_layers) if residual_output else 1.0
        return nn.initializers.normal(self.initializer_range * scale)


class GPTBlock(layers.Sublayers):
    """Pre-LN block: x += Drop(Attn(LN(x))); x += Drop(MLP(LN(x)))."""
    config: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array,              # [B, L, D]
                 mask: jax.Array | None,          # [B|1, 1, L, L] (None in decode: the cache masks)
                 deterministic: bool = True, decode: bool = False,
                 extra_keys_values: jax.Array | None = None) -> jax.Array:  # [2, P, H, K]: leading keys, values
        c = self.config
        dropout = ops.Dropout(c.dropout_rate)
        h = layers.LayerNorm(c.layer_norm_eps, name="attention_norm", use_bias=c.use_bias, **c.kwargs)(x)
        h = layers.MultiHeadAttention(c.num_heads, c.head_dim, dropout_rate=c.attention_dropout_rate,
                                      kernel_init=c.init(), out_kernel_init=c.init(residual_output=True),
                                      use_bias=c.use_bias, attention=c.attention, fused_qkv=c.fused_qkv,
                                      name="attention", **c.kwargs)(h, mask=mask, deterministic=deterministic,
                                                                    decode=decode, extra_keys_values=extra_keys_values)
        x = x + self.sublayer_output("attention", dropout(h, deterministic=deterministic))
        h = layers.LayerNorm(c.layer_norm_eps, name="mlp_norm", use_bias=c.use_bias, **c.kwargs)(x)
        # GPT-2 drops out the MLP's output (resid_pdrop), not its hidden activations: MLP dropout stays 0.
        h = layers.MLP(c.d_ff, layers.tanh_gelu, kernel_init=c.init(), output_kernel_init=c.init(residual_output=True),
                       use_bias=c.use_bias, name="mlp", **c.kwargs)(h, deterministic)
        return x + self.sublayer_output("mlp", dropout(h, deterministic=deterministic))


class GPT(nn.Module):
    """GPT2LMHeadModel: token ids -> next-token logits."""
    config: GPTConfig

    def setup(self):
        c = self.config
        self.token_embedding = layers.Embed(c.vocab_size, c.d_model, "vocab", c.init(), **c.kwargs)
        self.position_embedding = layers.Embed(c.n_positions, c.d_model, "positions", c.init(), **c.kwargs)
        self.blocks = stack.build(GPTBlock, c.num_layers, scan=c.scan_layers, remat=c.remat, static_argnums=(2, 3),
                                  per_layer_argnums=(4,), config=c)
        self.final_norm = layers.LayerNorm(c.layer_norm_eps, use_bias=c.use_bias, **c.kwargs)
        self.dropout = ops.Dropout(c.dropout_rate)
        self.decode_position = DecodePosition()

    def __call__(self, input_ids: jax.Array,                     # [B, L] int
                 segment_ids: jax.Array | None = None,           # [B, L]: 0 = padding, 1..n = packed documents
                 positions: jax.Array | None = None,             # [B, L]: restart at 0 per document
                 prefix_lengths: jax.Array | None = None,        # [B]: the first n tokens of a row are its prefix
                 bidirectional_mask: jax.Array | None = None,    # [B, L] bool: True = inside a prefix
                 deterministic: bool = True, decode: bool = False,
                 leading: jax.Array | None = None,               # [B, P, D]: embeddings in front of the input
                 keys_values: jax.Array | None = None,           # [layers, 2, P, H, K]: past keys and values
                 ) -> dict[str, jax.Array]:
        """-> {"logits": [B, L, V] float32}. decode=True: one token per call ([B, 1]) against the 'cache'
        collection (build it with `init_cache`); the cache keeps each row's position, so segment ids,
        positions and prefixes must be None (prefill a prefix-LM prompt is not supported)."""
        x = self.hidden_states(input_ids, segment_ids, positions, prefix_lengths, bidirectional_mask,
                               deterministic=deterministic, decode=decode, leading=leading,
                               keys_values=keys_values)
        logits = self.token_embedding.attend(x)   # tied output layer (GPT-2)
        return {"logits": logits.astype(jnp.float32)}

    def hidden_states(self, input_ids: jax.Array, segment_ids: jax.Array | None = None,
                      positions: jax.Array | None = None, prefix_lengths: jax.Array | None = None,
                      bidirectional_mask: jax.Array | None = None, deterministic: bool = True,
                      decode: bool = False, leading: jax.Array | None = None,
                      keys_values: jax.Array | None = None) -> jax.Array:
        """The final LayerNorm's output [B, L, D] in `dtype` (GPT2Model's last_hidden_state), arguments as
        `__call__`. Task heads read it (models/gpt_tasks.py) without paying for the [B, L, V] vocabulary
        projection; the parameters are the same, so a pretrained GPT's tree serves both.

        Leading tokens: keys and values [layers, 2, P, H, K] (as Hugging Face's past_key_values) enter every layer
        and the tokens' positions start at P; P embeddings [B, P, D] go first at positions 0..P-1, in the row's
        first segment (and its prefix, for a prefix LM), and only the input's own positions come out. The cache
        holds no leading embeddings: with decode=True only keys and values may lead."""
        c = self.config
        if decode and any(a is not None for a in (segment_ids, positions, prefix_lengths, bidirectional_mask)):
            raise ValueError("decode=True decodes one causal document per row: pass no segment ids, positions, "
                             "prefix_lengths or bidirectional_mask")
        if decode and leading is not None:
            raise ModelInputError("decode=True with leading embeddings is not supported: the cache does not hold "
                                  "them (give leading keys and values instead)")
        shift = leading.shape[1] if leading is not None else 0 if keys_values is None else keys_values.shape[2]
        if decode:
            if shift + input_ids.shape[1] > c.n_positions:  # the sizing pass: [B, max_length] after P positions
                raise ValueError(f"max_length={input_ids.shape[1]} exceeds the model's n_positions={c.n_positions} "
                                 f"less its {shift} leading positions (generate fewer tokens or shorten the prompt)")
            positions, mask = shift + self.decode_position(input_ids), None
        else:
            if positions is None and input_ids.shape[1] + shift > c.n_positions:
                # a position past the table would embed as NaN (jnp.take's fill) and spread silently
                raise ValueError(f"{input_ids.shape[1]} tokens" + (f" + {shift} virtual ones" if shift else "")
                                 + f" exceed the model's n_positions={c.n_positions}; crop or split the input")
            positions = jnp.arange(input_ids.shape[1])[None] if positions is None else positions
            if leading is None:  # after leading keys and values, the tokens are numbered from P
                positions = positions + shift
            else:  # leading embeddings come first and join the row's first segment and its prefix
                positions = ops.prepend_positions(positions, shift)
                pad = lambda a, value: None if a is None else jnp.pad(a, ((0, 0), (shift, 0)),  # noqa: E731
                                                                      constant_values=value)
                segment_ids, bidirectional_mask = pad(segment_ids, 1), pad(bidirectional_mask, True)
                prefix_lengths = None if prefix_lengths is None else jnp.asarray(prefix_lengths) + shift
            length = positions.shape[1]
            if prefix_lengths is None and bidirectional_mask is None:  # kept as segment ids: see attention.py
                mask = attention.SegmentMask(segment_ids, segment_ids, causal=True)
            else:
                mask = attention_mask(length, segment_ids, prefix_lengths, bidirectional_mask)
        x = self.token_embedding(input_ids)
        if leading is not None:
            x = jnp.concatenate([leading.astype(x.dtype), x], axis=1)
        x = x + self.position_embedding(positions)
        x = self.dropout(x, deterministic=deterministic)
        x = self.blocks(x, mask, deterministic, decode, keys_values)
        return self.final_norm(x)[:, x.shape[1] - input_ids.shape[1]:]


class DecodePosition(nn.Module):
    """The position of each row's next token in incremental decoding, kept in the 'cache' collection with
    a leading batch axis (so beam search gathers it). The sizing call (ids [B, max_length]) gets
    0..max_length-1 and stores nothing; each later call is the token at the row's current position,
    which then advances."""

    @nn.compact
    def __call__(self, input_ids: jax.Array) -> jax.Array:  # [B, L] -> [B|1, L] positions
        initialized = self.has_variable("cache", "position")
        position = self.variable("cache", "position", lambda: jnp.zeros(input_ids.shape[:1], jnp.int32))
        if not initialized:
            return jnp.arange(input_ids.shape[1])[None]
        current = position.value
        position.value = current + 1
        return current[:, None]


def attention_mask(length: int, segment_ids: jax.Array | None = None, prefix_lengths: jax.Array | None = None,
                   bidirectional_mask: jax.Array | None = None) -> jax.Array:
    """[B|1, 1, L, L] bool, True = may attend: causal, or both tokens inside the row's prefix; and, with
    segment ids, within the same nonzero segment (so a prefix never reaches into another document)."""
    if prefix_lengths is not None and bidirectional_mask is not None:
        raise ValueError("give prefix_lengths or bidirectional_mask, not both (they say the same thing)")
    mask = layers.causal_mask(length)
    if prefix_lengths is not None:
        bidirectional_mask = jnp.arange(length)[None, :] < jnp.asarray(prefix_lengths)[:, None]
    if bidirectional_mask is not None:
        mask = mask | (bidirectional_mask[:, None, :, None] & bidirectional_mask[:, None, None, :])
    if segment_ids is not None:
        mask = mask & layers.segment_mask(segment_ids, segment_ids)
    return mask


# ---------------------------------------------------------------------------------------------
# Incremental decoding (the interface of models/decoding.py).
# ---------------------------------------------------------------------------------------------
def init_cache(model: GPT, params, batch_size: int, max_length: int) -> dict:
    """An empty cache for `batch_size` rows of up to `max_length` tokens (prompt included); every leaf has
    a leading batch axis. One sizing pass on zeros, compiled once per model and shape."""
    if max_length > model.config.n_positions:  # (leading keys and values: the sizing pass checks P more)
        raise ValueError(f"max_length={max_length} exceeds the model's n_positions={model.config.n_positions} "
                         "(generate fewer tokens or shorten the prompt)")
    return _sizing_pass(model, params, batch_size, max_length)


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _sizing_pass(model: GPT, params, batch_size: int, max_length: int) -> dict:
    _, variables = model.apply({"params": params}, jnp.zeros((batch_size, max_length), jnp.int32), decode=True,
                               mutable=["cache"])
    return variables["cache"]


def make_tokens_to_logits(model: GPT, params):
    """-> tokens_to_logits(token_ids [B, 1] int32, cache, step) -> (logits [B, V] float32, new cache).

    `step` is not needed (the cache keeps each row's position); it is accepted for models/decoding.py.
    For a prompt, see decoding.split_prompts: its first token is the start token, the rest is forced.
    """
    def tokens_to_logits(token_ids: jax.Array, cache, step):
        del step
        outputs, variables = model.apply({"params": params, "cache": cache}, token_ids, decode=True,
                                         mutable=["cache"])
        return outputs["logits"][:, 0], variables["cache"]
    return tokens_to_logits
