"""Encoder-decoder (T5) pretraining objectives: span corruption, prefix LM, i.i.d. denoising, BERT-style.

The objectives compared in Raffel et al. 2020 (JMLR 21), Section 3.3, with the T5 library's
preprocessors (`span_corruption`, `prefix_lm`, `iid_denoising` in t5/data/preprocessors.py):

  span_corruption  15% of the tokens in spans of mean length 3; each span becomes one sentinel in
                   the inputs; targets = sentinel + span, for every span. The raw chunk length is
                   T5's `random_spans_helper` (568 tokens for 512 inputs), so a full chunk gives
                   exactly `inputs_length` inputs and `targets_length` (114) targets, EOS included.
  prefix_lm        a chunk of inputs_length - 1 tokens is split at a uniformly random point in
                   [1, n - 1]: the prefix is the input, the rest the target (Section 3.3.1).
  iid_denoising    every token is noise with probability noise_density (Section 3.3.2), with
                   `corruption` = "replace_spans" (T5's i.i.d. objective: each run of noise tokens
                   -> one sentinel in the inputs, each run of kept tokens -> one sentinel in the
                   targets) or "drop_tokens" (inputs without the noise tokens, targets = them).
  bert_style       Section 3.3.1's "BERT-style" objective (Table 4): noise_density of the tokens i.i.d.,
                   90% of them replaced by a mask token (the first sentinel, T5's `sentinel_id`) and 10%
                   by a random token; the target is the whole original chunk (T5's `noise_token_to_
                   random_token_or_sentinel` with random_prob 0.1, targets = the uncorrupted text).

Instances (once per data epoch): the documents in a random order, each one's sentences
concatenated, EOS between documents, cut into raw chunks (T5's reduce_concat_tokens +
split_tokens; T5 puts nothing between documents). Noise is dynamic: `make_batch` draws a new mask
for every batch, as our MLM does, where T5 draws one per example of its (single) pass. The tail
chunk of an epoch is shorter; `objectives.packing` packs short examples together, so every
batch has a fixed shape.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from objectives import packing
from objectives import span_corruption as sc
from objectives.interface import ObjectiveError
from objectives.losses import token_cross_entropy

MODES = ("span_corruption", "prefix_lm", "iid_denoising", "bert_style")
BERT_STYLE_RANDOM = 0.1  # of the corrupted tokens, the share replaced by a random token (Section 3.3.1)
IID_CORRUPTIONS = ("replace_spans", "drop_tokens")
BATCH_KEYS = ("encoder_input_ids", "encoder_segment_ids", "encoder_positions", "decoder_input_ids",
              "decoder_target_ids", "decoder_segment_ids", "decoder_positions", "decoder_loss_weights")
# No positions: T5's only positional signal is the relative bias, and inside one packed segment
# (attention never crosses segments) row offsets give the same distances as restarted positions.
# Without them the model builds one [1, H, L, S] bias per stack instead of a [B, H, L, S] one.
MODEL_INPUT_KEYS = ("encoder_input_ids", "decoder_input_ids", "encoder_segment_ids", "decoder_segment_ids")


class EncoderDecoderDenoising:
    """The objective interface of objectives/interface.py for encoder-decoder models.

    config (config.objective): mode (MODES), noise_density, mean_noise_span_length,
    corruption (iid_denoising only: IID_CORRUPTIONS), z_loss (coefficient, 0 = off),
    targets_length (decoder length; 0 = derive from the encoder length).
    """

    def __init__(self, config: ml_collections.ConfigDict, tokenizer):
        self.tokenizer = tokenizer
        self.mode = config.get("mode", "span_corruption")
        self.noise_density = float(config.get("noise_density", 0.15))
        self.mean_noise_span_length = float(config.get("mean_noise_span_length", 3.0))
        self.corruption = config.get("corruption", "replace_spans")
        self.z_loss = float(config.get("z_loss", 0.0))
        self.targets_length = int(config.get("targets_length", 0))
        if self.mode not in MODES:
            raise ObjectiveError(f"config.objective.mode={self.mode!r} is unknown; use one of {MODES}")
        if self.corruption not in IID_CORRUPTIONS:
            raise ObjectiveError(f"config.objective.corruption={self.corruption!r} is unknown; "
                                 f"use one of {IID_CORRUPTIONS}")
        if not 0.0 < self.noise_density < 1.0:
            raise ObjectiveError(f"config.objective.noise_density={self.noise_density} must be in (0, 1)")
        if self.mean_noise_span_length < 1.0:
            raise ObjectiveError(f"config.objective.mean_noise_span_length={self.mean_noise_span_length} "
                                 "must be >= 1")
        if self.targets_length < 0 or self.z_loss < 0:
            raise ObjectiveError("config.objective.targets_length and config.objective.z_loss must be >= 0")
        self.uses_sentinels = self.mode in ("span_corruption", "bert_style") or (
            self.mode == "iid_denoising" and self.corruption == "replace_spans")
        num_extra_ids = getattr(tokenizer, "num_extra_ids", 0)
        if self.uses_sentinels and not num_extra_ids:
            raise ObjectiveError(f"config.objective.mode={self.mode!r} needs sentinel ids but the tokenizer has "
                                 "none; load it with extra_ids=100 (T5's <extra_id_k>)")
        # [K] sentinel k = <extra_id_k> = vocab_size - 1 - k (seqio's convention).
        self.sentinel_ids = np.array([tokenizer.sentinel_id(k) for k in range(num_extra_ids)], np.int64)
        self._lengths_cache: dict[int, tuple[int, int]] = {}

    @staticmethod
    def check_config(config: ml_collections.ConfigDict, data: ml_collections.ConfigDict) -> list[str]:
        """Config validation's hook (objectives/registry.py): the decoder length against what span corruption of
        config.data.max_seq_length inputs produces, refused before the corpus is read rather than at its first
        instances (`lengths` checks the same)."""
        if config.get("mode", "span_corruption") != "span_corruption" or not config.get("targets_length", 0):
            return []
        inputs_length = data.get("max_seq_length", 0)
        if inputs_length < 4:  # too short for any denoising: the objective says so when it is built
            return []
        needed = sc.compute_input_and_target_lengths(inputs_length, config.get("noise_density", 0.15),
                                                     config.get("mean_noise_span_length", 3.0))[1]
        if config.targets_length < needed:
            raise ObjectiveError(f"config.objective.targets_length={config.targets_length} is shorter than the "
                                 f"{needed} tokens span corruption of config.data.max_seq_length={inputs_length} "
                                 "inputs produces; set it to 0 (derive) or >= that")
        return []

    # -----------------------------------------------------------------------------------------
    # Lengths.
    # -----------------------------------------------------------------------------------------
    def lengths(self, inputs_length: int) -> tuple[int, int]:
        """Encoder length -> (raw chunk length, decoder length)."""
        raw = self._raw_length(inputs_length)
        if self.mode != "span_corruption":
            return raw, self.targets_length or self._derived_targets_length(raw)
        _, targets = sc.compute_input_and_target_lengths(inputs_length, self.noise_density,
                                                         self.mean_noise_span_length)
        if self.targets_length and self.targets_length < targets:
            raise ObjectiveError(f"config.objective.targets_length={self.targets_length} is shorter than the "
                                 f"{targets} tokens span corruption of {inputs_length} inputs produces; "
                                 "set it to 0 (derive) or >= that")
        return raw, self.targets_length or targets

    def _raw_length(self, inputs_length: int) -> int:
        if inputs_length < 4:
            raise ObjectiveError(f"sequence length {inputs_length} is too short for {self.mode}; use >= 4 "
                                 "(config.data.max_seq_length)")
        if self.mode == "span_corruption":
            return sc.compute_input_and_target_lengths(inputs_length, self.noise_density,
                                                       self.mean_noise_span_length)[0]
        return inputs_length - 1  # + EOS = inputs_length (T5's split_tokens_to_inputs_length)

    def _derived_targets_length(self, raw: int) -> int:
        """prefix_lm: the longest possible target; bert_style: the whole chunk. iid: mean + 6 sqrt(mean)
        (a row past it, about never, is trimmed with its EOS kept), rounded up to a multiple of 8."""
        if self.mode in ("prefix_lm", "bert_style"):
            return raw + 1
        p = self.noise_density
        mean = raw * p + 1  # noise tokens + EOS
        if self.corruption == "replace_spans":  # + one sentinel per run of kept tokens
            mean += (1 - p) + (raw - 1) * p * (1 - p)
        return min(8 * math.ceil((mean + 6 * math.sqrt(mean)) / 8), raw + 1)  # never more than raw + 1

    def _lengths_of_raw(self, raw: int) -> tuple[int, int]:
        """(encoder, decoder) lengths of instances `raw` tokens wide (instances store only the chunks)."""
        if raw not in self._lengths_cache:
            length = raw + 1
            while length >= 4 and self._raw_length(length) > raw:
                length -= 1
            if length < 4 or self._raw_length(length) != raw:
                raise ValueError(f"{self.mode}: instances of width {raw} were not made by this objective")
            self._lengths_cache[raw] = length, self.lengths(length)[1]
        return self._lengths_cache[raw]

    # -----------------------------------------------------------------------------------------
    # Instances and batches (host side, numpy).
    # -----------------------------------------------------------------------------------------
    def create_instances(self, documents: list[list[np.ndarray]], rng: np.random.Generator,
                         max_seq_length: int) -> dict[str, np.ndarray]:
        """One epoch of raw chunks: {'input_ids': [N, raw] int32 (0 after the end), 'length': [N]}."""
        raw, _ = self.lengths(max_seq_length)
        if self.mode == "span_corruption":
            self._check_sentinels(raw, max_seq_length)
        docs = [np.concatenate(d) for d in documents if sum(len(s) for s in d)]
        if not docs:
            raise ObjectiveError("the corpus has no tokens: every document is empty")
        eos = np.array([self.tokenizer.eos_id], docs[0].dtype)
        pieces = []
        for i in rng.permutation(len(docs)):
            pieces += [docs[i], eos]
        stream = np.concatenate(pieces[:-1]).astype(np.int32)  # EOS between documents
        n_full, tail = divmod(len(stream), raw)
        ids = np.zeros((n_full + (tail > 0), raw), np.int32)
        ids.reshape(-1)[:len(stream)] = stream
        lengths = np.full(len(ids), raw, np.int32)
        lengths[-1] = tail or raw
        order = rng.permutation(len(ids))
        return {"input_ids": ids[order], "length": lengths[order]}

    def _check_sentinels(self, raw: int, inputs_length: int):
        _, num_spans = sc.noise_counts(np.array([max(raw, 2)]), self.noise_density, self.mean_noise_span_length)
        num_spans = int(num_spans[0])
        if num_spans > len(self.sentinel_ids):
            raise ObjectiveError(f"span corruption of {inputs_length} inputs makes {num_spans} noise spans but the "
                                 f"tokenizer has {len(self.sentinel_ids)} sentinels; shorten "
                                 "config.data.max_seq_length or raise config.objective.mean_noise_span_length")

    def make_batch(self, instances: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Corrupts the raw chunks afresh and packs them: the contract's batch, [B, L_enc] / [B, L_dec]."""
        tokens = np.asarray(instances["input_ids"])
        lengths = np.asarray(instances["length"], np.int64)
        raw = tokens.shape[1]
        inputs_length, targets_length = self._lengths_of_raw(raw)

        (inputs, n_in), (targets, n_tg) = self.corrupt(tokens, lengths, rng)
        eos = self.tokenizer.eos_id
        inputs, n_in = sc.append_eos(inputs, n_in, eos, inputs_length)
        targets, n_tg = sc.append_eos(targets, n_tg, eos, targets_length)
        packed = packing.pack_padded({"inputs": inputs, "targets": targets}, {"inputs": n_in, "targets": n_tg},
                                     {"inputs": inputs_length, "targets": targets_length},
                                     num_rows=len(tokens))
        decoder_segment_ids = packed["targets_segment_ids"]
        return {
            "encoder_input_ids": packed["inputs"],
            "encoder_segment_ids": packed["inputs_segment_ids"],
            "encoder_positions": packed["inputs_positions"],
            "decoder_input_ids": packing.shift_right_by_segment(packed["targets"], decoder_segment_ids),
            "decoder_target_ids": packed["targets"],
            "decoder_segment_ids": decoder_segment_ids,
            "decoder_positions": packed["targets_positions"],
            "decoder_loss_weights": (decoder_segment_ids > 0).astype(np.float32),
        }

    def corrupt(self, tokens: np.ndarray, lengths: np.ndarray, rng: np.random.Generator
                ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """Raw chunks [B, W] (+ lengths [B]) -> ((inputs, lengths), (targets, lengths)), before EOS."""
        width = tokens.shape[1]
        if self.mode == "prefix_lm":
            split = sc.random_prefix_split(lengths, rng)
            in_prefix = np.arange(width) < split[:, None]
            return sc.drop_tokens(tokens, lengths, ~in_prefix), sc.drop_tokens(tokens, lengths, in_prefix)
        if self.mode == "span_corruption":
            noise = sc.random_spans_noise_mask(lengths, self.noise_density, self.mean_noise_span_length,
                                               rng, width=width)
        else:
            noise = sc.iid_noise_mask(lengths, width, self.noise_density, rng)
        if self.mode == "bert_style":
            return (self._mask_or_random(tokens, noise, rng), lengths), (tokens, lengths)
        if self.uses_sentinels:
            return (sc.noise_span_to_unique_sentinel(tokens, lengths, noise, self.sentinel_ids),
                    sc.nonnoise_span_to_unique_sentinel(tokens, lengths, noise, self.sentinel_ids))
        return sc.drop_tokens(tokens, lengths, noise), sc.drop_tokens(tokens, lengths, ~noise)

    def _mask_or_random(self, tokens: np.ndarray, noise: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """[B, W] -> the noise tokens replaced: by a random token of the vocabulary without its sentinels
        with probability BERT_STYLE_RANDOM, else by the mask token (sentinel 0)."""
        random = noise & (rng.random(tokens.shape) < BERT_STYLE_RANDOM)
        vocabulary = int(min(self.sentinel_ids))  # the sentinels are the last ids
        replaced = np.where(noise, self.sentinel_ids[0], tokens)
        return np.where(random, rng.integers(0, vocabulary, tokens.shape), replaced).astype(tokens.dtype)

    # -----------------------------------------------------------------------------------------
    # Device side.
    # -----------------------------------------------------------------------------------------
    @staticmethod
    def model_inputs(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return {k: batch[k] for k in MODEL_INPUT_KEYS}

    def loss(self, outputs: dict[str, jax.Array], batch: dict[str, jax.Array]
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
        return denoising_loss(outputs["logits"], batch, z_loss=self.z_loss)


def denoising_loss(logits: jax.Array, batch: dict[str, jax.Array], z_loss: float = 0.0
                   ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token cross-entropy over the decoder targets, + z_loss * log(Z)^2 (t5x's
    `cross_entropy_with_logits`), both averaged over real target tokens (weights > 0).

    logits: [B, L_dec, V] (computed in float32). Returns (loss, {'loss', 'cross_entropy', 'z_loss',
    'accuracy', 'tokens'}); 'tokens' counts real encoder + decoder tokens, for tokens/s.
    """
    metrics = token_cross_entropy(logits, batch["decoder_target_ids"], batch["decoder_loss_weights"], z_loss)
    loss = metrics["cross_entropy"] + metrics["z_loss"]
    tokens = ((batch["encoder_segment_ids"] > 0).sum() + (batch["decoder_segment_ids"] > 0).sum())
    return loss, {**metrics, "loss": loss, "tokens": tokens.astype(jnp.float32)}
