"""BERT (Devlin et al., 2019): a post-LayerNorm Transformer encoder with MLM and NSP heads, and
optionally SpanBERT's span boundary head (Joshi et al., 2020; `span_boundary=True`).

The same encoder is ALBERT's and ELECTRA's. ALBERT (Lan et al., 2020): factorised embeddings
(`embedding_size` E < hidden H: a V x E table, then one E x H projection), one layer's weights applied at
every depth (`shared_layers`), GELU's tanh form (`hidden_act="gelu_new"`), and sentence-order prediction
through the NSP head (objectives/nsp.py makes the pairs). ELECTRA's discriminator and generator
(models/electra.py) are this encoder with E != H and no pooler. DistilBERT (Sanh et al. 2019) is this encoder
without token types (`type_vocab_size=0`) and without a pooler (models/distillation/model.py trains one).

Parameter names follow Hugging Face's `BertForPreTraining` closely (embeddings / encoder layers /
pooler / heads) so that `models/convert/` can map checkpoints one to one.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import attention, heads, layers, ops, stack
from models.config_base import Dims, ModelConfig
from models.errors import ModelInputError


@dataclasses.dataclass(frozen=True)
class BertConfig(ModelConfig):  # + dtype, param_dtype, attention, scan_layers, fused_qkv, remat (models/config_base.py)
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2             # 0: no token-type table, segment ids unread (DistilBERT)
    dropout_rate: float = 0.1            # hidden dropout (embeddings, attention output, FFN output)
    attention_dropout_rate: float = 0.1  # on the attention probabilities
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    next_sentence: bool = True           # build the NSP head (False: RoBERTa-style MLM only)
    span_boundary: bool = False          # build SpanBERT's SBO head (objective "spanbert")
    embedding_size: int = 0              # E, the embedding tables' width (0: hidden_size); ALBERT, ELECTRA
    shared_layers: bool = False          # ALBERT: one layer's weights at every depth
    hidden_act: str = "gelu"             # gelu (exact) | gelu_new (tanh form; ALBERT)
    pooler: bool = True                  # the [CLS] Dense + tanh (ELECTRA has none)
    max_span_tokens: int = 32            # SBO relative positions embedded; longer spans share the last
    pre_norm: bool = False               # pre-LN blocks and a final LayerNorm (Xiong et al. 2020; Cramming): not
                                         # Hugging Face's BERT, so such a model does not export to it

    def __post_init__(self):
        # ALBERT factorises to save parameters: a table wider than the layers defeats it. (ELECTRA's generator,
        # not shared, reads the discriminator's wider table through a projection down, by design.)
        if self.shared_layers and self.embedding_size > self.hidden_size:
            raise ModelInputError(f"model.embedding_size={self.embedding_size} is above model.hidden_size="
                                  f"{self.hidden_size}: ALBERT's factorised embeddings project a narrower table up "
                                  f"(the paper uses 128); set embedding_size <= hidden_size, or 0 for hidden_size")
        if self.hidden_act not in layers.ACTIVATIONS:
            raise ModelInputError(f"model.hidden_act={self.hidden_act!r} is not one of {list(layers.ACTIVATIONS)}")
        super().__post_init__()

    @property
    def dims(self) -> Dims:
        return Dims(width=self.hidden_size, layers=self.num_layers, heads=self.num_heads,
                    head_dim=self.hidden_size // self.num_heads, mlp_width=self.intermediate_size,
                    positions=self.max_position_embeddings)

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden_size


class BertEmbeddings(nn.Module):
    config: BertConfig

    def setup(self):
        c = self.config
        init = layers.truncated_normal(c.initializer_range)
        self.word_embeddings = layers.Embed(c.vocab_size, c.embedding_width, "vocab", init, **c.kwargs)
        self.position_embeddings = layers.Embed(c.max_position_embeddings, c.embedding_width,
                                                "positions", init, **c.kwargs)
        if c.type_vocab_size:
            self.token_type_embeddings = layers.Embed(c.type_vocab_size, c.embedding_width,
                                                      "token_types", init, **c.kwargs)
        self.norm = layers.LayerNorm(c.layer_norm_eps, **c.kwargs)
        self.dropout = ops.Dropout(c.dropout_rate)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array,  # [B, L] each
                 deterministic: bool, leading: jax.Array | None = None,  # [B, P, D]: leading embeddings
                 first_position: int = 0) -> jax.Array:                  # -> [B, P + L, E]
        """Leading embeddings go first, with token type 0, at positions 0..P-1 (as a Hugging Face BERT given them
        as inputs_embeds). Leading keys and values start the positions at P (`first_position`), as a Hugging Face
        BERT given them as past keys and values does."""
        words = self.word_embeddings(input_ids)
        if leading is not None:
            words = jnp.concatenate([leading.astype(words.dtype), words], axis=1)
            segment_ids = jnp.pad(segment_ids, ((0, 0), (leading.shape[1], 0)))
        if first_position + words.shape[1] > self.config.max_position_embeddings:  # jnp.take would embed NaNs
            virtual = words.shape[1] - input_ids.shape[1] + first_position
            raise ModelInputError(f"{input_ids.shape[1]} tokens + {virtual} virtual ones exceed the model's "
                                  f"{self.config.max_position_embeddings} positions: shorten the input or the "
                                  "leading tokens")
        positions = first_position + jnp.arange(words.shape[1])[None, :]
        x = words + self.position_embeddings(positions)
        if self.config.type_vocab_size:
            x = x + self.token_type_embeddings(segment_ids)
        return self.dropout(self.norm(x), deterministic=deterministic)


class BertLayer(layers.Sublayers):
    """Post-LN block: x = LN(x + Attn(x)); x = LN(x + FFN(x)), dropout before each residual add. With `pre_norm`
    the norms move inside the residual branches, x = x + Attn(LN(x)); x = x + FFN(LN(x)), and BertModel adds a final
    LN: the residual stream is never normalised, which keeps early gradients sane at high learning rates.
    return_internals: -> (x, {'hidden': x, and the attention's 'scores', 'probs', 'values'}) (BertModel)."""
    config: BertConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool,
                 extra_keys_values: jax.Array | None = None,  # [2, P, H, K]: this layer's leading keys and values
                 return_internals: bool = False) -> jax.Array | tuple[jax.Array, dict[str, jax.Array]]:
        c = self.config
        init = layers.truncated_normal(c.initializer_range)
        dropout = ops.Dropout(c.dropout_rate)
        attention_norm = layers.LayerNorm(c.layer_norm_eps, name="attention_norm", **c.kwargs)
        output_norm = layers.LayerNorm(c.layer_norm_eps, name="output_norm", **c.kwargs)
        h = attention_norm(x) if c.pre_norm else x
        h = layers.MultiHeadAttention(c.num_heads, c.hidden_size // c.num_heads,
                                      dropout_rate=c.attention_dropout_rate, kernel_init=init, attention=c.attention,
                                      fused_qkv=c.fused_qkv, name="attention", **c.kwargs)(
            h, mask=mask, deterministic=deterministic, extra_keys_values=extra_keys_values,
            return_weights=return_internals)
        h, internals = h if return_internals else (h, None)
        h = self.sublayer_output("attention", dropout(h, deterministic=deterministic))
        x = x + h if c.pre_norm else attention_norm(x + h)
        h = layers.MLP(c.intermediate_size, layers.ACTIVATIONS[c.hidden_act], kernel_init=init, name="mlp",
                       **c.kwargs)(output_norm(x) if c.pre_norm else x, deterministic)
        h = self.sublayer_output("mlp", dropout(h, deterministic=deterministic))
        x = x + h if c.pre_norm else output_norm(x + h)
        return (x, {"hidden": x, **internals}) if return_internals else x


class BertModel(nn.Module):
    """Encoder + pooler. Returns (sequence_output [B, L, D], pooled_output [B, D])."""
    config: BertConfig

    def setup(self):
        c = self.config
        init = layers.truncated_normal(c.initializer_range)
        self.embeddings = BertEmbeddings(c)
        if c.embedding_width != c.hidden_size:  # factorised embeddings: E -> H once, below the first layer
            self.embeddings_project = layers.Dense(c.hidden_size, ("embed_out", "embed"), kernel_init=init, **c.kwargs)
        self.encoder = stack.build(BertLayer, c.num_layers, scan=c.scan_layers, remat=c.remat, static_argnums=(2, 4),
                                   per_layer_argnums=(3,), shared=c.shared_layers, config=c)
        if c.pre_norm:
            self.final_norm = layers.LayerNorm(c.layer_norm_eps, **c.kwargs)
        if c.pooler:
            self.pooler = layers.Dense(c.hidden_size, ("embed", "embed_out"), kernel_init=init, **c.kwargs)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,
                 deterministic: bool = True, embedded: jax.Array | None = None, return_internals: bool = False,
                 leading: jax.Array | None = None,      # [B, P, D]: embeddings in front of the input
                 keys_values: jax.Array | None = None,  # [layers, 2, P, H, K]: past keys and values of every layer
                 ) -> tuple[jax.Array, jax.Array | None] | tuple[jax.Array, jax.Array | None, dict[str, jax.Array]]:
        """-> sequence [B, L, D] (the input's positions), pooled [B, D] (position 0: [CLS], or with leading
        embeddings the first of them, as Hugging Face's BERT classifiers read it; None without a pooler).
        embedded [B, L, E]: another model's embedding output in place of this one's (ELECTRA's generator
        shares the discriminator's tables).
        leading: embeddings that join every row's tokens in front (Hugging Face's inputs_embeds with them
        prepended); keys_values: P keys and values each layer attends to first (Hugging Face's past_key_values),
        the tokens then numbered from P.
        return_internals (distillation, models/distillation/model.py): a third result, {'embeddings' [B, L, D] (the first
        layer's input: Hugging Face's hidden_states[0]), and per layer, stacked [N, ...]: 'hidden' [N, B, L, D] (its
        output), 'scores' and 'probs' [N, B, H, L, L] (scaled q.k before the mask; the softmax before dropout),
        'values' [N, B, L, H, K]}, with the leading embeddings where they come first. Every layer's attention then
        runs the einsum reference (models/attention.py: the fused kernels return no weights), looped or scanned
        alike."""
        c = self.config
        valid = input_mask.astype(jnp.int32)  # padding as segment ids: 1 = the row's tokens, 0 = padding
        if leading is not None:  # they join every row's tokens
            valid = jnp.pad(valid, ((0, 0), (leading.shape[1], 0)), constant_values=1)
        first_position = 0 if keys_values is None else keys_values.shape[2]
        mask = attention.SegmentMask(valid, valid)
        if embedded is None:
            embedded = self.embeddings(input_ids, segment_ids, deterministic, leading, first_position)
        x = self.embeddings_project(embedded) if c.embedding_width != c.hidden_size else embedded
        first = x
        x = self.encoder(x, mask, deterministic, keys_values, return_internals)
        x, internals = x if return_internals else (x, None)
        x = self.final_norm(x) if c.pre_norm else x
        pooled = jnp.tanh(self.pooler(x[:, 0])) if c.pooler else None  # the [CLS] position
        sequence = x[:, x.shape[1] - input_ids.shape[1]:]
        return (sequence, pooled, {"embeddings": first, **internals}) if return_internals else (sequence, pooled)


class BertForPreTraining(nn.Module):
    """BERT with its pretraining heads. Returns a dict the objectives read from."""
    config: BertConfig

    def setup(self):
        c = self.config
        self.bert = BertModel(c)
        self.mlm_head = heads.MaskedLMHead(c.vocab_size, c.initializer_range, c.layer_norm_eps, c.embedding_width,
                                           layers.ACTIVATIONS[c.hidden_act], **c.kwargs)
        if c.next_sentence:
            self.nsp_head = heads.ClassifierHead(2, c.initializer_range, **c.kwargs)
        if c.span_boundary:
            self.sbo_head = heads.SpanBoundaryHead(c.vocab_size, c.max_span_tokens, c.initializer_range,
                                                   c.layer_norm_eps, **c.kwargs)

    def __call__(self, input_ids: jax.Array,          # [B, L] int32
                 segment_ids: jax.Array,               # [B, L] int32 (0 = sentence A, 1 = B)
                 input_mask: jax.Array,                # [B, L] 1 = real token, 0 = padding
                 masked_lm_positions: jax.Array,       # [B, P] int32
                 span_left_boundary: jax.Array | None = None,   # [B, P] int32, SBO only: span start - 1
                 span_right_boundary: jax.Array | None = None,  # [B, P] int32, SBO only: span end + 1
                 span_position: jax.Array | None = None,        # [B, P] int32, SBO only: 1-based in span
                 deterministic: bool = True) -> dict[str, jax.Array]:
        sequence, pooled = self.bert(input_ids, segment_ids, input_mask, deterministic)
        masked = heads.gather_positions(sequence, masked_lm_positions)
        word_embeddings = self.bert.embeddings.word_embeddings
        out = {"mlm_logits": self.mlm_head(masked, word_embeddings)}                         # [B, P, V]
        if self.config.next_sentence:
            out["nsp_logits"] = self.nsp_head(pooled)                                        # [B, 2]
        if self.config.span_boundary:
            if span_left_boundary is None or span_right_boundary is None or span_position is None:
                raise ValueError("BertForPreTraining(span_boundary=True) needs span_left_boundary, "
                                 "span_right_boundary and span_position (objective 'spanbert' provides them)")
            out["sbo_logits"] = self.sbo_head(heads.gather_positions(sequence, span_left_boundary),
                                              heads.gather_positions(sequence, span_right_boundary),
                                              span_position, word_embeddings)                # [B, P, V]
        return out
