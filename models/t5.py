"""T5 (Raffel et al. 2020, "Exploring the Limits of Transfer Learning...", JMLR 21): encoder-decoder.

Both T5 1.0 (ReLU FFN, output layer tied to the token embedding) and T5 1.1 (gated-GELU FFN,
separate output layer) are one module chosen by the config. As in Mesh TensorFlow / t5x /
Hugging Face: pre-norm residual blocks with RMSNorm, no biases anywhere, no 1/sqrt(d) attention
scaling (folded into the initialiser), one relative position bias table per stack shared by its
layers (the decoder's is causal; cross-attention has none), a final RMSNorm on each stack, and
dropout on the embeddings, on each sub-layer's output, inside the FFN, on the attention
probabilities and after the final norm.

Batches follow the project's encoder-decoder contract: segment ids (0 = padding, 1..n = packed
example) and positions restarting at 0 per packed example; without segment ids, id 0 is padding
in the encoder and the decoder is only causal. Incremental decoding: `init_cache` and
`make_tokens_to_logits` at the bottom.
"""
from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import attention, layers, ops, stack
from models.config_base import Dims, ModelConfig
from models.errors import ModelInputError

FEED_FORWARDS = {"relu": (nn.relu, False), "gated-gelu": (layers.tanh_gelu, True)}  # name -> (activation, gated)


@dataclasses.dataclass(frozen=True)
class T5Config(ModelConfig):  # + dtype, param_dtype, attention, scan_layers, fused_qkv, remat (models/config_base.py)
    vocab_size: int = 32128
    d_model: int = 512
    num_heads: int = 8
    head_dim: int = 64                    # d_kv; num_heads * head_dim need not equal d_model (3B, 11B)
    d_ff: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_eps: float = 1e-6
    feed_forward: str = "relu"            # "relu" (T5 1.0) | "gated-gelu" (T5 1.1)
    tie_word_embeddings: bool = True      # 1.0: logits = embedding^T (x * d_model**-0.5); 1.1: separate lm_head
    initializer_factor: float = 1.0

    def __post_init__(self):
        if self.feed_forward not in FEED_FORWARDS:
            raise ModelInputError(f"T5Config.feed_forward={self.feed_forward!r} is not one of {list(FEED_FORWARDS)}")
        super().__post_init__()

    @property
    def dims(self) -> Dims:
        """Leading keys and values enter the decoder's self-attention (as Hugging Face's T5 takes past ones)."""
        return Dims(width=self.d_model, layers=self.num_decoder_layers, heads=self.num_heads, head_dim=self.head_dim,
                    mlp_width=self.d_ff, positions=None)

    def normal(self, fan_in: float) -> layers.Initializer:
        """Mesh TensorFlow's / Hugging Face's T5 initialiser: N(0, (factor / sqrt(fan_in))^2)."""
        return nn.initializers.normal(self.initializer_factor * fan_in ** -0.5)


class T5Block(layers.Sublayers):
    """Pre-norm layer: x += Drop(SelfAttn(Norm(x))) [+= Drop(CrossAttn(Norm(x), encoded))] += Drop(FFN(Norm(x)))."""
    config: T5Config
    cross_attention: bool = False  # decoder layers

    @nn.compact
    def __call__(self, x: jax.Array,                      # [B, L, D]
                 self_mask: jax.Array | None,             # [B|1, 1, L, L] (None in decode: the cache masks)
                 self_bias: jax.Array,                    # [B|1, H, L, L]
                 encoded: jax.Array | None = None,        # [B, S, D]
                 cross_mask: jax.Array | None = None,     # [B, 1, L, S]
                 deterministic: bool = True, decode: bool = False,
                 extra_keys_values: jax.Array | None = None) -> jax.Array:  # [2, P, H, K]: self-attention's
        c = self.config
        dropout = ops.Dropout(c.dropout_rate)
        norm = lambda name: layers.RMSNorm(c.layer_norm_eps, name=name, **c.kwargs)  # noqa: E731

        def residual(x, h, sublayer: str):
            return x + self.sublayer_output(sublayer, dropout(h, deterministic=deterministic))

        def attention(name, fused_qkv=False):  # cross-attention keeps separate projections (models/qkv_layout.py)
            return layers.MultiHeadAttention(
                c.num_heads, c.head_dim, dropout_rate=c.dropout_rate, use_bias=False, scale_query=False,
                kernel_init=c.normal(c.d_model), query_kernel_init=c.normal(c.d_model * c.head_dim),
                out_kernel_init=c.normal(c.num_heads * c.head_dim), attention=c.attention, fused_qkv=fused_qkv,
                name=name, **c.kwargs)

        h = attention("self_attention", c.fused_qkv)(norm("self_attention_norm")(x), mask=self_mask, bias=self_bias,
                                                     deterministic=deterministic, decode=decode,
                                                     extra_keys_values=extra_keys_values)
        x = residual(x, h, "attention")
        if self.cross_attention:
            h = attention("cross_attention")(norm("cross_attention_norm")(x), encoded, mask=cross_mask,
                                             deterministic=deterministic)
            x = residual(x, h, "cross_attention")
        activation, gated = FEED_FORWARDS[c.feed_forward]
        h = layers.MLP(c.d_ff, activation, use_bias=False, gated=gated, dropout_rate=c.dropout_rate,
                       kernel_init=c.normal(c.d_model), output_kernel_init=c.normal(c.d_ff), name="mlp",
                       **c.kwargs)(norm("mlp_norm")(x), deterministic=deterministic)
        return residual(x, h, "mlp")


class T5Stack(nn.Module):
    """Encoder (bidirectional) or decoder (causal, with cross-attention): embeddings in, normed states out."""
    config: T5Config
    is_decoder: bool = False

    @nn.compact
    def __call__(self, x: jax.Array,                      # [B, L, D] token embeddings
                 positions: jax.Array,                    # [B|1, L] int
                 self_mask: jax.Array | None,             # [B|1, 1, L, L]
                 encoded: jax.Array | None = None,        # [B, S, D] (decoder)
                 cross_mask: jax.Array | None = None,     # [B, 1, L, S] (decoder)
                 deterministic: bool = True, decode: bool = False,
                 extra_keys_values: jax.Array | None = None) -> jax.Array:  # [layers, 2, P, H, K] (decoder)
        c = self.config
        query_positions = key_positions = positions
        if decode:
            query_positions, key_positions = self._decode_positions(x)
        if extra_keys_values is not None:  # as a Hugging Face T5 given them as past keys: positions 0..P-1
            query_positions = query_positions + extra_keys_values.shape[2]
            key_positions = ops.prepend_positions(key_positions, extra_keys_values.shape[2])
        self_bias = layers.RelativePositionBias(
            c.num_heads, c.relative_attention_num_buckets, c.relative_attention_max_distance,
            bidirectional=not self.is_decoder, embedding_init=c.normal(c.d_model), name="relative_position_bias",
            **c.kwargs)(query_positions, key_positions)    # [B|1, H, L, S]: once per stack, shared by its layers
        dropout = ops.Dropout(c.dropout_rate)
        x = dropout(x, deterministic=deterministic)
        num_layers = c.num_decoder_layers if self.is_decoder else c.num_encoder_layers
        blocks = stack.build(T5Block, num_layers, scan=c.scan_layers, remat=c.remat, static_argnums=(5, 6),
                             per_layer_argnums=(7,), config=c, cross_attention=self.is_decoder)
        x = blocks(x, self_mask, self_bias, encoded, cross_mask, deterministic, decode, extra_keys_values)
        x = layers.RMSNorm(c.layer_norm_eps, name="final_norm", **c.kwargs)(x)
        return dropout(x, deterministic=deterministic)

    def _decode_positions(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Positions for incremental decoding, kept in the 'cache' collection next to the keys/values.

        The sizing call (x [B, S_max, D]) stores key positions 0..S_max-1; each later call (x [B, 1, D])
        is the token at the row's current position, which then advances. Both have a leading batch
        axis, like every cache leaf, so beam search can gather them.
        """
        initialized = self.has_variable("cache", "key_positions")
        batch, length = x.shape[:2]
        keys = self.variable("cache", "key_positions",
                             lambda: jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length)))
        query = self.variable("cache", "query_position", lambda: jnp.zeros((batch,), jnp.int32))
        if not initialized:
            return keys.value, keys.value
        position = query.value
        query.value = position + 1
        return position[:, None], keys.value


class T5(nn.Module):
    """T5ForConditionalGeneration: `__call__` (teacher forcing), `encode`, `decode` (incremental with decode=True)."""
    config: T5Config

    def setup(self):
        c = self.config
        self.shared = layers.Embed(c.vocab_size, c.d_model, "vocab", c.normal(1.0), **c.kwargs)
        self.encoder = T5Stack(c, is_decoder=False)
        self.decoder = T5Stack(c, is_decoder=True)
        if not c.tie_word_embeddings:
            self.lm_head = layers.Dense(c.vocab_size, ("embed", "vocab"), use_bias=False,
                                        kernel_init=c.normal(c.d_model), **c.kwargs)

    def __call__(self, encoder_input_ids: jax.Array,              # [B, S] int
                 decoder_input_ids: jax.Array,                    # [B, L] int (targets shifted right, 0 first)
                 encoder_segment_ids: jax.Array | None = None,    # [B, S]
                 decoder_segment_ids: jax.Array | None = None,    # [B, L]
                 encoder_positions: jax.Array | None = None,      # [B, S]
                 decoder_positions: jax.Array | None = None,      # [B, L]
                 deterministic: bool = True, decode: bool = False,
                 leading: jax.Array | None = None,                # [B, P, D]: the encoder's leading embeddings
                 keys_values: jax.Array | None = None,            # [layers, 2, P, H, K]: the decoder's past ones
                 ) -> dict[str, jax.Array]:
        encoded = self.encode(encoder_input_ids, encoder_segment_ids, encoder_positions, deterministic, leading)
        encoder_segments = encoder_segments_of(encoder_input_ids, encoder_segment_ids,
                                               0 if leading is None else leading.shape[1])
        logits = self.decode(encoded, encoder_segments, decoder_input_ids, decoder_segment_ids, decoder_positions,
                             deterministic=deterministic, decode=decode, keys_values=keys_values)
        return {"logits": logits}

    def encode(self, encoder_input_ids: jax.Array, encoder_segment_ids: jax.Array | None = None,
               encoder_positions: jax.Array | None = None, deterministic: bool = True,
               leading: jax.Array | None = None) -> jax.Array:  # [B, P, D]
        """[B, S] ids -> [B, S, D] encoder states (in the compute dtype); with leading embeddings [B, P + S, D],
        those first (at positions 0..P-1, in the row's first segment): the decoder reads them too."""
        segments = encoder_segments_of(encoder_input_ids, encoder_segment_ids,
                                       0 if leading is None else leading.shape[1])
        positions = _positions_or_indices(encoder_input_ids, encoder_positions)
        x = self.shared(encoder_input_ids)
        if leading is not None:
            x = jnp.concatenate([leading.astype(x.dtype), x], axis=1)
            positions = ops.prepend_positions(positions, leading.shape[1])
        return self.encoder(x, positions, attention.SegmentMask(segments, segments), deterministic=deterministic)

    def decode(self, encoded: jax.Array,                          # [B, S, D]
               encoder_segment_ids: jax.Array,                    # [B, S]: 0 = padding (a 0/1 mask if unpacked)
               decoder_input_ids: jax.Array,                      # [B, L] ([B, 1] with decode=True)
               decoder_segment_ids: jax.Array | None = None,      # [B, L]; None = one example per row
               decoder_positions: jax.Array | None = None,        # [B, L]
               deterministic: bool = True, decode: bool = False,
               keys_values: jax.Array | None = None) -> jax.Array:  # [layers, 2, P, H, K] -> [B, L, V] float32 logits
        """Decoder + output layer. decode=True: one token per call against the 'cache' collection
        (build it with `init_cache`); segment ids and positions then come from the cache and must be None.
        keys_values: P keys and values every self-attention layer attends to first (past_key_values).
        """
        length = decoder_input_ids.shape[1]
        if decode and (decoder_segment_ids is not None or decoder_positions is not None):
            raise ValueError("decode=True decodes one unpacked example per row: pass no decoder segment "
                             "ids or positions")
        if decoder_segment_ids is None:  # one example per row; masks kept as segment ids (models/attention.py)
            self_mask = None if decode else attention.SegmentMask(causal=True)  # decode: the cache masks unwritten keys
            cross_mask = attention.SegmentMask(jnp.ones((1, length), jnp.int32),  # every target sees the input
                                               (encoder_segment_ids != 0).astype(jnp.int32))
        else:
            self_mask = attention.SegmentMask(decoder_segment_ids, decoder_segment_ids, causal=True)
            cross_mask = attention.SegmentMask(decoder_segment_ids, encoder_segment_ids)
        positions = _positions_or_indices(decoder_input_ids, decoder_positions)
        x = self.decoder(self.shared(decoder_input_ids), positions, self_mask, encoded, cross_mask,
                         deterministic=deterministic, decode=decode, extra_keys_values=keys_values)
        if self.config.tie_word_embeddings:  # Mesh TF rescales before reusing the embedding (Raffel et al. 2020)
            logits = self.shared.attend(x * self.config.d_model ** -0.5)
        else:
            logits = self.lm_head(x)
        return logits.astype(jnp.float32)


def _segments_or_padding(input_ids: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """Segment ids as given, or (ids != 0) as one example per row with id 0 as padding."""
    return (input_ids != 0).astype(jnp.int32) if segment_ids is None else segment_ids


def encoder_segments_of(input_ids: jax.Array, segment_ids: jax.Array | None, leading: int = 0) -> jax.Array:
    """The segment ids of the encoder's states [B, S] ([B, P + S] after `leading` P embeddings: they join the row's
    first segment), from the given ones or from the padding (id 0)."""
    segments = _segments_or_padding(input_ids, segment_ids)
    if leading:
        segments = jnp.pad(segments, ((0, 0), (leading, 0)), constant_values=1)
    return segments


def _positions_or_indices(input_ids: jax.Array, positions: jax.Array | None) -> jax.Array:
    """[B, L] positions as given, or [1, L] indices 0..L-1 (the same bias for every row, computed once)."""
    return jnp.arange(input_ids.shape[1], dtype=jnp.int32)[None] if positions is None else positions


# ---------------------------------------------------------------------------------------------
# Incremental decoding (the interface of models/decoding.py).
# ---------------------------------------------------------------------------------------------
def init_cache(model: T5, params, batch_size: int, max_decode_len: int) -> dict:
    """An empty decoder cache for `batch_size` rows of up to `max_decode_len` tokens.

    Every leaf has a leading batch axis ([B, ...]). It runs one sizing pass of the decoder on
    zeros (about one teacher-forced step), compiled once per model and shape.
    """
    return _sizing_pass(model, params, batch_size, max_decode_len)


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _sizing_pass(model: T5, params, batch_size: int, max_decode_len: int) -> dict:
    encoded = jnp.zeros((batch_size, 1, model.config.d_model), jnp.dtype(model.config.dtype))
    _, variables = model.apply({"params": params}, encoded, jnp.ones((batch_size, 1), jnp.int32),
                               jnp.zeros((batch_size, max_decode_len), jnp.int32), decode=True,
                               mutable=["cache"], method="decode")
    return variables["cache"]


def make_tokens_to_logits(model: T5, params, encoded: jax.Array, encoder_mask: jax.Array):
    """encoded [B, S, D] from `model.encode`, encoder_mask [B, S] (1 = a state to attend to: `encoder_segments_of`) ->
    tokens_to_logits(token_ids [B, 1] int32, cache, step) -> (logits [B, V] float32, new cache).

    `step` is not needed (the cache keeps each row's position); it is accepted for the generic
    decoder's interface. For beam search, expand `encoded` and `encoder_mask` to B * beams rows first.
    """
    def tokens_to_logits(token_ids: jax.Array, cache, step):
        del step
        logits, variables = model.apply({"params": params, "cache": cache}, encoded, encoder_mask.astype(jnp.int32),
                                        token_ids, decode=True, mutable=["cache"], method="decode")
        return logits[:, 0], variables["cache"]
    return tokens_to_logits


def generate(model: T5, params, encoder_input_ids: jax.Array, max_length: int, eos_id: int,
             beam_size: int = 1, alpha: float = 0.6) -> jax.Array:
    """encoder_input_ids [B, S] (0 = padding) -> output ids [B, max_length], decoding from the start
    token 0 with the key/value cache: greedy for beam_size 1, else beam search (the best beam; GNMT
    length penalty alpha, as t5x). A row ends with EOS, then pads with 0. Jittable."""
    from models import decoding  # the generic loops; imported here so that models.t5 stands alone
    batch = encoder_input_ids.shape[0]
    encoded = model.apply({"params": params}, encoder_input_ids, method="encode")  # a wrapper's encode too
    mask = encoder_segments_of(encoder_input_ids, None, encoded.shape[1] - encoder_input_ids.shape[1]) != 0
    start = jnp.zeros((batch,), jnp.int32)
    if beam_size == 1:
        step = make_tokens_to_logits(model, params, encoded, mask)
        return decoding.greedy_search(step, init_cache(model, params, batch, max_length), start, max_length, eos_id)
    encoded, mask = decoding.expand_to_beams((encoded, mask), beam_size)
    step = make_tokens_to_logits(model, params, encoded, mask)
    cache = init_cache(model, params, batch, max_length)  # beam_search expands it to B * beam_size rows
    sequences, _ = decoding.beam_search(step, cache, start, max_length, eos_id, beam_size, alpha)
    return sequences[:, 0]
