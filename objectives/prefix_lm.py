"""Decoder-only prefix language modelling (Raffel et al. 2020, Section 3.2.1, Figures 3 and 4;
UniLM, Dong et al. 2019): one Transformer stack sees a prefix bidirectionally and predicts the
rest causally.

Rows are those of `objectives.causal_lm` (max_seq_length + 1 tokens x_0..x_{n-1}, n real). For
every batch, each row is split afresh at a point p drawn uniformly from [1, n - 1], T5's
`random_prefix_noise_mask` (objectives.span_corruption.random_prefix_split): the prefix is
x_0..x_{p-1}, every input position i < p attends to the whole prefix, and the loss covers only the
tokens after the prefix, x_p..x_{n-1}, i.e. input positions i >= p - 1. A target inside the
prefix would be visible to the bidirectional attention, so its loss weight is 0. Rows packed with
several documents (pack_documents=False) are split as a whole; the model still keeps documents
apart by segment id.
"""
from __future__ import annotations

import jax
import numpy as np

from objectives import span_corruption as sc
from objectives.causal_lm import MODEL_INPUT_KEYS as CAUSAL_MODEL_INPUT_KEYS
from objectives.causal_lm import CausalLM

BATCH_KEYS = ("input_ids", "target_ids", "loss_weights", "segment_ids", "positions", "prefix_lengths",
              "bidirectional_mask")
# models/gpt.py takes prefix_lengths or bidirectional_mask; the [B] lengths are the smaller input.
MODEL_INPUT_KEYS = CAUSAL_MODEL_INPUT_KEYS + ("prefix_lengths",)


class PrefixLM(CausalLM):
    """CausalLM's rows and loss, with a random bidirectional prefix per row and no loss on it.

    config (config.objective): as CausalLM (pack_documents, z_loss).
    """

    def make_batch(self, instances: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """CausalLM's batch + prefix_lengths [B] int32 and bidirectional_mask [B, L] bool."""
        batch = super().make_batch(instances, rng)
        real_tokens = (np.asarray(instances["segment_ids"]) > 0).sum(axis=1)  # n, over L + 1 columns
        prefix_lengths = sc.random_prefix_split(real_tokens, rng).astype(np.int32)  # [B], in [1, n - 1]
        columns = np.arange(batch["input_ids"].shape[1])
        batch["prefix_lengths"] = prefix_lengths
        batch["bidirectional_mask"] = columns < prefix_lengths[:, None]
        batch["loss_weights"] = batch["loss_weights"] * (columns >= prefix_lengths[:, None] - 1)
        return batch

    @staticmethod
    def model_inputs(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return {k: batch[k] for k in MODEL_INPUT_KEYS}
