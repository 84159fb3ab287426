"""ModernBERT (Warner et al. 2024, "Smarter, Better, Faster, Longer"): the encoder of today's recipes.

What changed from BERT (models/bert.py), as Hugging Face's `ModernBertForMaskedLM` computes it:
- pre-norm blocks, x + Attn(LN(x)) then x + MLP(LN(x)), with a final LN; the first layer reads the embeddings'
  LN directly (no attention norm of its own); LayerNorms without biases, no biases in any projection;
- no position table: rotary position embeddings (RoPE) on queries and keys, theta 160,000 in the global layers
  and 10,000 in the local ones;
- alternating attention: every `global_attn_every_n_layers`-th layer (0, 3, 6, ...) attends globally, the others
  within a sliding window, |i - j| <= local_attention / 2 (64 tokens either side for the published 128);
- a GeGLU MLP: GELU(x W_in) * (x W_gate), then W_out;
- the MLM head: Dense (no bias) -> GELU -> LN, then the decoder tied to the word embeddings plus a bias,
  projected at the masked positions only (as BERT's here).

Packed rows (the TPU's equivalent of ModernBERT's unpadding): `input_mask` may hold segment ids 1..n (0 =
padding), and `positions` the position of each token inside its own example; attention then stays inside an
example, the sliding window too.

Parameter names follow the rest of the house (models/convert/hf_modernbert.py maps Hugging Face's):
  modernbert/embeddings/{word_embeddings, norm}, modernbert/layer_i/{attention_norm, attention/{query, key, value,
  out}, mlp_norm, mlp/{intermediate, intermediate_linear, output}}, modernbert/final_norm,
  prediction_head/{dense, norm}, decoder_bias.
With `scan_layers`, layer_0 stays looped and `layers` stacks the rest (models/stack.py).
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from models import attention, heads, layers, ops, stack
from models.config_base import Dims, ModelConfig
from models.errors import ModelInputError

POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class ModernBertConfig(ModelConfig):  # + the compute fields (models/config_base.py)
    vocab_size: int = 50368
    hidden_size: int = 768
    num_layers: int = 22
    num_heads: int = 12
    intermediate_size: int = 1152          # the GeGLU's inner width (its input projection is twice this)
    max_position_embeddings: int = 8192    # the longest sequence trained (RoPE has no table: a limit, not a size)
    global_attn_every_n_layers: int = 3
    local_attention: int = 128             # the sliding window's width: keys within local_attention // 2 either side
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    embedding_dropout: float = 0.0
    dropout_rate: float = 0.0              # the MLP's hidden dropout (Hugging Face's mlp_dropout)
    attention_dropout_rate: float = 0.0    # on the attention probabilities and the attention output
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    hidden_act: str = "gelu"               # the GeGLU's activation
    classifier_activation: str = "gelu"    # the prediction head's
    classifier_pooling: str = "cls"        # cls | mean: what a sequence-level head reads
    decoder_bias: bool = True

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ModelInputError(f"model.hidden_size={self.hidden_size} is not a multiple of model.num_heads="
                                  f"{self.num_heads}")
        if self.global_attn_every_n_layers < 1:
            raise ModelInputError(f"model.global_attn_every_n_layers={self.global_attn_every_n_layers} must be >= 1 "
                                  "(1: every layer global; ModernBERT uses 3)")
        if self.local_attention < 2 or self.local_attention % 2:
            raise ModelInputError(f"model.local_attention={self.local_attention} must be an even window >= 2 "
                                  "(keys within local_attention // 2 either side; ModernBERT uses 128)")
        for key in ("hidden_act", "classifier_activation"):
            if getattr(self, key) not in layers.ACTIVATIONS:
                raise ModelInputError(f"model.{key}={getattr(self, key)!r} is not one of {list(layers.ACTIVATIONS)}")
        if self.classifier_pooling not in POOLINGS:
            raise ModelInputError(f"model.classifier_pooling={self.classifier_pooling!r} is not one of {POOLINGS}")
        super().__post_init__()

    @property
    def dims(self) -> Dims:
        return Dims(width=self.hidden_size, layers=self.num_layers, heads=self.num_heads, head_dim=self.head_dim,
                    mlp_width=self.intermediate_size, positions=self.max_position_embeddings)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def window(self) -> int:
        """How far a local layer sees on either side."""
        return self.local_attention // 2

    def is_global(self, layer: int) -> bool:
        return layer % self.global_attn_every_n_layers == 0

    def init(self, stddev: float) -> layers.Initializer:
        """Hugging Face's initializer: N(0, stddev) truncated at initializer_cutoff_factor standard deviations."""
        cutoff = self.initializer_cutoff_factor
        return nn.initializers.truncated_normal(stddev, lower=-cutoff, upper=cutoff)

    @property
    def out_init(self) -> layers.Initializer:
        """The residual projections' (attention out, MLP out, the prediction head): scaled down with depth."""
        return self.init(self.initializer_range / (2.0 * self.num_layers) ** 0.5)


@flax.struct.dataclass
class Attention:
    """What a layer of either kind reads: its mask and its rotary cos, sin [B|1, L, K]."""
    mask: attention.SegmentMask    # under a scan or remat with its window switched by a traced flag (`traced`)
    rotary: tuple[jax.Array, jax.Array]

    def traced(self, window: int) -> Attention:
        """The same with the model's `window` in the mask and a traced `windowed` flag that says whether it applies:
        a global and a local layer's masks then differ only in that flag, which a traced layer kind picks (scanned
        layers) while the segments stay segments."""
        if not isinstance(self.mask, attention.SegmentMask) or self.mask.windowed is not None:
            return self
        return self.replace(mask=self.mask.replace(window=window, windowed=jnp.asarray(self.mask.window > 0)))

def select(is_global, global_: Attention, local: Attention
           ) -> tuple[attention.SegmentMask | jax.Array | None, tuple[jax.Array, jax.Array]]:
    """A layer's mask and rotary: chosen in Python when `is_global` is known (looped layers: each kernel gets its
    native mask), or with jnp.where when it is traced (scanned layers: one compiled layer serves both kinds; the
    model hands them `traced` masks of one structure, so the segments stay segments and only the flag is chosen)."""
    if isinstance(is_global, (bool, np.bool_)):
        chosen = global_ if is_global else local
        return chosen.mask, chosen.rotary
    chosen = jax.tree.map(lambda g, l: jnp.where(is_global, g, l), global_, local)
    return chosen.mask, chosen.rotary


class ModernBertLayer(layers.Sublayers):
    """x + Attn(LN(x)), then x + GeGLU(LN(x)); `first`: no attention norm (the embeddings' LN precedes it)."""
    config: ModernBertConfig
    first: bool = False

    @nn.compact
    def __call__(self, x: jax.Array,                       # [B, L, D]
                 global_: Attention, local: Attention, deterministic: bool,
                 extra_keys_values: jax.Array | None = None,  # [2, P, H, K]: this layer's leading keys and values
                 is_global: bool | jax.Array = True) -> jax.Array:
        c = self.config
        mask, rotary = select(is_global, global_, local)
        norm = dict(epsilon=c.norm_eps, use_bias=False, **c.kwargs)
        h = x if self.first else layers.LayerNorm(name="attention_norm", **norm)(x)
        h = layers.MultiHeadAttention(c.num_heads, c.head_dim, dropout_rate=c.attention_dropout_rate, use_bias=False,
                                      attention=c.attention, kernel_init=c.init(c.initializer_range),
                                      out_kernel_init=c.out_init, fused_qkv=c.fused_qkv, name="attention", **c.kwargs)(
            h, mask=mask, deterministic=deterministic, extra_keys_values=extra_keys_values, rotary=rotary)
        h = ops.Dropout(c.attention_dropout_rate)(h, deterministic=deterministic)
        x = x + self.sublayer_output("attention", h)
        h = layers.MLP(c.intermediate_size, layers.ACTIVATIONS[c.hidden_act], use_bias=False, gated=True,
                       dropout_rate=c.dropout_rate, kernel_init=c.init(c.initializer_range),
                       output_kernel_init=c.out_init, name="mlp", **c.kwargs)(
            layers.LayerNorm(name="mlp_norm", **norm)(x), deterministic)
        return x + self.sublayer_output("mlp", h)


class ModernBertEmbeddings(nn.Module):
    config: ModernBertConfig

    def setup(self):
        c = self.config
        self.word_embeddings = layers.Embed(c.vocab_size, c.hidden_size, "vocab", c.init(c.initializer_range),
                                            **c.kwargs)
        self.norm = layers.LayerNorm(c.norm_eps, use_bias=False, **c.kwargs)
        self.dropout = ops.Dropout(c.embedding_dropout)

    def __call__(self, input_ids: jax.Array, deterministic: bool,          # [B, L]
                 leading: jax.Array | None = None) -> jax.Array:           # [B, P, D] -> [B, P + L, D]
        words = self.word_embeddings(input_ids)
        if leading is not None:  # normalised with the words, as Hugging Face's inputs_embeds are
            words = jnp.concatenate([leading.astype(words.dtype), words], axis=1)
        return self.dropout(self.norm(words), deterministic=deterministic)


class ModernBertModel(nn.Module):
    """Embeddings -> layers -> final LN. Returns the sequence [B, L, D] (the input's positions)."""
    config: ModernBertConfig

    def setup(self):
        c = self.config
        self.embeddings = ModernBertEmbeddings(c)
        self.first_layer = ModernBertLayer(c, first=True, name="layer_0")
        self.encoder = stack.build(ModernBertLayer, c.num_layers - 1, scan=c.scan_layers, remat=c.remat,
                                   static_argnums=(3,), per_layer_argnums=(4, 5), first_index=1, config=c)
        self.final_norm = layers.LayerNorm(c.norm_eps, use_bias=False, **c.kwargs)

    def __call__(self, input_ids: jax.Array,                   # [B, L]
                 input_mask: jax.Array,                        # [B, L] 0 = padding; 1..n = packed examples
                 deterministic: bool = True,
                 positions: jax.Array | None = None,           # [B, L] inside each example; None: 0..L-1
                 leading: jax.Array | None = None,             # [B, P, D]: embeddings in front of the input
                 keys_values: jax.Array | None = None,         # [layers, 2, P, H, K]: past keys and values
                 ) -> jax.Array:
        """-> [B, L, D]. Leading embeddings lead every row (its first segment, positions 0..P-1, normalised with the
        words as Hugging Face's inputs_embeds); leading keys and values are attended to first by each layer."""
        c = self.config
        if input_ids.shape[1] > c.max_position_embeddings:
            raise ModelInputError(f"{input_ids.shape[1]} tokens exceed the model's max_position_embeddings="
                                  f"{c.max_position_embeddings}: shorten the input")
        segments = input_mask.astype(jnp.int32)
        positions = jnp.arange(input_ids.shape[1])[None, :] if positions is None else positions
        if leading is not None:  # they lead every row: segment 1's, at positions 0..P-1
            segments = jnp.pad(segments, ((0, 0), (leading.shape[1], 0)), constant_values=1)
            positions = ops.prepend_positions(positions, leading.shape[1])
        x = self.embeddings(input_ids, deterministic, leading)
        global_, local = (Attention(attention.SegmentMask(segments, segments, window=window),
                                    layers.rotary_embedding(positions, c.head_dim, theta))
                          for window, theta in ((0, c.global_rope_theta), (c.window, c.local_rope_theta)))
        first_keys_values = None if keys_values is None else keys_values[0]
        x = self.first_layer(x, global_, local, deterministic, first_keys_values, c.is_global(0))
        rest = None if keys_values is None else keys_values[1:]
        kinds = np.array([c.is_global(i) for i in range(1, c.num_layers)])
        if c.scan_layers or c.remat != "none":  # the stack traces each layer's kind
            global_, local = global_.traced(c.window), local.traced(c.window)
        x = self.encoder(x, global_, local, deterministic, rest, kinds)
        x = self.final_norm(x)
        return x[:, x.shape[1] - input_ids.shape[1]:]


class PredictionHead(nn.Module):
    """Dense (no bias) -> activation -> LN: under the MLM decoder, and under every fine-tuning head."""
    config: ModernBertConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # [..., D] -> [..., D]
        c = self.config
        h = layers.Dense(c.hidden_size, ("embed", "embed_out"), use_bias=False, kernel_init=c.out_init, name="dense",
                         **c.kwargs)(x)
        h = layers.ACTIVATIONS[c.classifier_activation](h)
        return layers.LayerNorm(c.norm_eps, use_bias=False, name="norm", **c.kwargs)(h)


class ModernBertForMaskedLM(nn.Module):
    """The pretraining module: {'mlm_logits' [B, P, V]} at the masked positions (objective bert_pretraining without
    NSP, configs/modernbert.py)."""
    config: ModernBertConfig

    def setup(self):
        c = self.config
        self.modernbert = ModernBertModel(c)
        self.prediction_head = PredictionHead(c)
        if c.decoder_bias:
            self.decoder_bias = self.param("decoder_bias", layers.partitioned(nn.initializers.zeros_init(), ("vocab",)),
                                           (c.vocab_size,), c.kwargs["param_dtype"])

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array | None, input_mask: jax.Array,  # [B, L]
                 masked_lm_positions: jax.Array | None = None,   # [B, P]; None: every position
                 deterministic: bool = True, positions: jax.Array | None = None) -> dict[str, jax.Array]:
        del segment_ids  # no token types
        sequence = self.modernbert(input_ids, input_mask, deterministic, positions)
        if masked_lm_positions is not None:
            sequence = heads.gather_positions(sequence, masked_lm_positions)
        # the decoder is tied to the word embeddings
        out = self.modernbert.embeddings.word_embeddings.attend(self.prediction_head(sequence)).astype(jnp.float32)
        if self.config.decoder_bias:
            out = out + self.decoder_bias.astype(jnp.float32)
        return {"mlm_logits": out}
