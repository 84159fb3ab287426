"""ELECTRA (Clark et al., 2020): replaced-token detection.

A small generator (a masked LM a fraction of the discriminator's width) fills the masked positions with
tokens sampled from its softmax; the discriminator, the model that is kept, reads the whole corrupted
sequence and tells for every token whether it was replaced. Both are the BERT encoder of models/bert.py
with factorised embeddings (`embedding_size`) and no pooler, and they share one set of token, position
and token-type embeddings (the paper's Section 3.2): the tables live in the discriminator and the
generator reads their output through its own E -> H_gen projection. The sample is a stop-gradient:
the discriminator's loss does not reach the generator (the paper's footnote on sampling).

A sample equal to the original token counts as original ("real"), as in the paper: `replaced` is
`corrupted != original`, not "was masked". The loss (objectives/electra.py) is
MLM(generator) + disc_weight * BCE(discriminator), disc_weight = 50 in the paper.

Parameter names follow Hugging Face's ElectraForPreTraining (the discriminator) and ElectraForMaskedLM
(the generator) so that models/convert/hf_electra.py maps them one to one.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import bert, heads, layers
from models.errors import ModelInputError

_BERT_FIELDS = tuple(f.name for f in dataclasses.fields(bert.BertConfig))


@dataclasses.dataclass(frozen=True)
class ElectraConfig(bert.BertConfig):
    """The discriminator's BERT fields, plus the generator's width. Defaults: ELECTRA-Base."""
    embedding_size: int = 768
    generator_hidden_size: int = 256        # the paper's 1/3 of Base's 768 (1/4 for Small and Large)
    generator_num_heads: int = 4
    generator_intermediate_size: int = 1024
    generator_num_layers: int = 0           # 0: the discriminator's depth, as the paper's generators
    sampling_temperature: float = 1.0       # the generator's softmax temperature when sampling replacements
    pooler: bool = False                    # the discriminator classifies tokens; fine-tuning adds its own
    next_sentence: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.generator_hidden_size > self.hidden_size:
            raise ModelInputError(
                f"model.generator_hidden_size={self.generator_hidden_size} is wider than the discriminator's "
                f"hidden_size={self.hidden_size}: ELECTRA's generator is a fraction of it (1/4 to 1/3 in the "
                f"paper; a generator as wide trains worse); set generator_hidden_size <= hidden_size")
        if self.generator_hidden_size % self.generator_num_heads:
            raise ModelInputError(f"model.generator_hidden_size={self.generator_hidden_size} is not a multiple of "
                                  f"model.generator_num_heads={self.generator_num_heads}")
        if self.next_sentence or self.span_boundary:
            raise ModelInputError("ELECTRA has no next-sentence or span-boundary head: set model.next_sentence "
                                  "and model.span_boundary to False")

    def discriminator(self) -> bert.BertConfig:
        return bert.BertConfig(**{name: getattr(self, name) for name in _BERT_FIELDS})

    def generator(self) -> bert.BertConfig:
        return dataclasses.replace(
            self.discriminator(), hidden_size=self.generator_hidden_size, num_heads=self.generator_num_heads,
            intermediate_size=self.generator_intermediate_size,
            num_layers=self.generator_num_layers or self.num_layers)


class DiscriminatorHead(nn.Module):
    """Hugging Face's `discriminator_predictions`: Dense H -> H, the activation, Dense H -> 1 per token."""
    config: bert.BertConfig

    @nn.compact
    def __call__(self, sequence: jax.Array) -> jax.Array:  # [B, L, H] -> [B, L] float32 logits
        c = self.config
        init = layers.truncated_normal(c.initializer_range)
        h = layers.Dense(c.hidden_size, ("embed", "embed_out"), kernel_init=init, name="dense", **c.kwargs)(sequence)
        h = layers.ACTIVATIONS[c.hidden_act](h)
        logits = layers.Dense(1, ("embed_out", None), kernel_init=init, name="dense_prediction", **c.kwargs)(h)
        return logits[..., 0].astype(jnp.float32)


def sample_replacements(logits: jax.Array, rng: jax.Array, temperature: float) -> jax.Array:
    """[B, P, V] generator logits -> [B, P] int32 tokens drawn from softmax(logits / temperature), with no
    gradient to the generator (the paper trains it by its MLM loss alone)."""
    logits = jax.lax.stop_gradient(logits.astype(jnp.float32)) / temperature
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def corrupt(input_ids: jax.Array,            # [B, L] the masked input the generator read
            masked_lm_positions: jax.Array,  # [B, P] int32
            masked_lm_ids: jax.Array,        # [B, P] the original tokens there
            masked_lm_weights: jax.Array,    # [B, P] 1 = a real prediction, 0 = padding
            sampled: jax.Array,              # [B, P] the generator's samples
            ) -> tuple[jax.Array, jax.Array]:
    """-> (corrupted [B, L]: the original sequence with the samples at the masked positions,
    replaced [B, L] int32: 1 where the corrupted token differs from the original). A sample equal to
    the original is not a replacement. Padding entries of the position list (weight 0, position 0) write
    back what is there."""
    rows = jnp.arange(input_ids.shape[0])[:, None]
    present = jnp.take_along_axis(input_ids, masked_lm_positions, axis=1)
    real = masked_lm_weights > 0
    original = input_ids.at[rows, masked_lm_positions].set(jnp.where(real, masked_lm_ids, present))
    corrupted = input_ids.at[rows, masked_lm_positions].set(jnp.where(real, sampled, present))
    return corrupted, (corrupted != original).astype(jnp.int32)


class Electra(nn.Module):
    """Generator + discriminator with shared embeddings. Returns the dict objectives/electra.py reads."""
    config: ElectraConfig

    def setup(self):
        c = self.config
        self.discriminator = bert.BertModel(c.discriminator())
        self.discriminator_head = DiscriminatorHead(c.discriminator())
        generator = c.generator()
        self.generator = bert.BertModel(generator)
        self.generator_head = heads.MaskedLMHead(c.vocab_size, c.initializer_range, c.layer_norm_eps, c.embedding_width,
                                                 layers.ACTIVATIONS[c.hidden_act], **c.kwargs)

    def generate(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,  # [B, L] each
                 masked_lm_positions: jax.Array, deterministic: bool = True) -> jax.Array:  # -> [B, P, V]
        """The generator's MLM logits at the masked positions (Hugging Face's ElectraForMaskedLM)."""
        embeddings = self.discriminator.embeddings  # shared: the generator reads the discriminator's tables
        embedded = embeddings(input_ids, segment_ids, deterministic)
        sequence, _ = self.generator(input_ids, segment_ids, input_mask, deterministic, embedded=embedded)
        return self.generator_head(heads.gather_positions(sequence, masked_lm_positions), embeddings.word_embeddings)

    def discriminate(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,
                     deterministic: bool = True) -> jax.Array:  # [B, L] each -> [B, L] "replaced" logits
        """The discriminator's per-token logits (Hugging Face's ElectraForPreTraining)."""
        sequence, _ = self.discriminator(input_ids, segment_ids, input_mask, deterministic)
        return self.discriminator_head(sequence)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,
                 masked_lm_positions: jax.Array, masked_lm_ids: jax.Array, masked_lm_weights: jax.Array,
                 deterministic: bool = True) -> dict[str, jax.Array]:
        mlm_logits = self.generate(input_ids, segment_ids, input_mask, masked_lm_positions, deterministic)
        # Training samples with the step's key; evaluation (no key given) with a fixed one, so that held-out
        # metrics of different steps see the same draw where the generator agrees.
        rng = self.make_rng("dropout") if self.has_rng("dropout") else jax.random.key(0)
        sampled = sample_replacements(mlm_logits, rng, self.config.sampling_temperature)
        corrupted, replaced = corrupt(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights, sampled)
        return {"mlm_logits": mlm_logits,                                                         # [B, P, V]
                "disc_logits": self.discriminate(corrupted, segment_ids, input_mask, deterministic),  # [B, L]
                "replaced": replaced}                                                             # [B, L]
