"""BERT pretraining: masked LM (+ next sentence prediction), total loss = MLM + NSP. With
`sentence_order` (ALBERT) the pairs are sentence-order ones and the NSP head's metrics are named sop_loss
and sop_accuracy. SpanBertPretraining (objective "spanbert", below) adds SpanBERT's spans and SBO loss.

Instances (sentence pairs, or single segments without NSP) are made once per data epoch by
`nsp.create_instances`; masking is dynamic: a new mask is drawn every time a batch is built, as RoBERTa does,
instead of BERT's 10 static copies. `masking` chooses how:
  tokens  BERT's: single tokens, or whole words with `whole_word_masking` (`mlm.mask_tokens`);
  ngrams  ALBERT's (Lan et al. 2020, Section 4.1): n-grams of up to `ngram_max` words, P(n) proportional to 1/n,
          80/10/10 drawn per token as ALBERT's code (`span_masking.mask_spans` with `ngram_length_pmf`); words are
          whole words with `whole_word_masking` (ALBERT's default), single tokens without.
Both mask the same budget: mask_prob of the non-special tokens, at most max_predictions_per_seq.
`packing` (without NSP; configs/modernbert.py): the instances of a window packed greedily into full rows, input_mask
holding each token's example (1..n, 0 = padding) and `positions` its position inside it, so attention stays inside
an example (models/attention.SegmentMask) and no row is mostly padding: the TPU's equivalent of unpadding.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from objectives import mlm, nsp, packing, span_masking
from objectives.interface import ObjectiveError

MASKINGS = ("tokens", "ngrams")
MLM_KEYS = ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


def capped_masking(config: ml_collections.ConfigDict, data: ml_collections.ConfigDict) -> list[str]:
    """A budget max_predictions_per_seq cuts below what mask_prob asks of a full row masks less than configured,
    silently, on every batch (ALBERT's recipe does so on purpose: 20 of a 512-token row): a warning per phase."""
    phases = [("max_seq_length", "max_predictions_per_seq")]
    if data.get("long_seq_length", 0):
        phases.append(("long_seq_length", "long_max_predictions_per_seq"))
    rates = [key for key in ("mask_prob", "eval_mask_prob") if config.get(key, 0) > 0]
    warnings = []
    for length_key, budget_key in phases:
        length, budget = data.get(length_key, 0), config.get(budget_key, 0)
        for rate in rates:
            candidates = length - 2  # a row's [CLS] and [SEP] are never masked; a pair's second [SEP] neither
            asked = max(1, round(candidates * config[rate]))
            if budget and asked > budget:
                warnings.append(f"config.objective.{rate}={config[rate]:g} asks {asked} masked tokens of a "
                                f"config.data.{length_key}={length} row, but config.objective.{budget_key}={budget} "
                                f"masks at most {budget} ({budget / candidates:.1%}); raise {budget_key} to {asked}")
    return warnings


class BertPretraining:
    """Objective "bert_pretraining" (a PhasedObjective: the long phase masks more positions).

    `max_predictions`: the masked positions per row, BERT's max_predictions_per_seq (20 for the
    128-token phase) or, in the object `for_long_phase()` returns, long_max_predictions_per_seq (80
    for the 512-token phase).
    """

    def __init__(self, config: ml_collections.ConfigDict, tokenizer, *, long_phase: bool = False):
        self.config = config
        self.tokenizer = tokenizer
        self.next_sentence = config.next_sentence
        self.sentence_order = bool(config.get("sentence_order", False))
        if self.sentence_order and not self.next_sentence:
            raise ObjectiveError("config.objective.sentence_order=True needs config.objective.next_sentence=True "
                                 "(sentence-order prediction trains the NSP head)")
        self.max_predictions = (config.long_max_predictions_per_seq if long_phase
                                else config.max_predictions_per_seq)
        self.masking = config.get("masking", "tokens")  # the objectives built on this one may not name it
        if self.masking not in MASKINGS:
            raise ObjectiveError(f"config.objective.masking={self.masking!r} is unknown; use one of "
                                 f"{', '.join(MASKINGS)}")
        self.packing = bool(config.get("packing", False))
        if self.packing and self.next_sentence:
            raise ObjectiveError("config.objective.packing=True packs single segments: it needs "
                                 "config.objective.next_sentence=False (a sentence pair is one example)")
        if self.masking == "ngrams" and not config.get("ngram_max", 0) >= 1:
            raise ObjectiveError(f"config.objective.ngram_max={config.get('ngram_max')!r} must be an integer >= 1 "
                                 "for masking='ngrams' (ALBERT uses 3)")

    @staticmethod
    def check_config(config: ml_collections.ConfigDict, data: ml_collections.ConfigDict) -> list[str]:
        """Config validation's hook (objectives/registry.py): the warnings of a config this objective trains on
        but not as it reads; `config` is config.objective, `data` config.data."""
        return capped_masking(config, data)

    def for_long_phase(self) -> BertPretraining:
        return type(self)(self.config, self.tokenizer, long_phase=True)

    def create_instances(self, documents: list[list[np.ndarray]], rng: np.random.Generator,
                         max_seq_length: int) -> dict[str, np.ndarray]:
        """One epoch of fixed-length instances, [N, L] each."""
        t = self.tokenizer
        try:
            instances = nsp.create_instances(
                documents, rng, max_seq_length=max_seq_length, short_seq_prob=self.config.short_seq_prob,
                cls_id=t.cls_id, sep_id=t.sep_id, pad_id=t.pad_id, next_sentence=self.next_sentence,
                sentence_order=self.sentence_order)
        except ValueError as e:  # too few documents, sequences too short: the user's corpus/config
            raise ObjectiveError(str(e)) from None
        return pack_instances(instances, max_seq_length, t.pad_id) if self.packing else instances

    def make_batch(self, instances: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Host side: mask a batch of instances afresh (dynamic masking)."""
        batch = {k: v for k, v in instances.items() if k != "input_ids"}
        batch.update(self.mask(instances, rng))
        return batch

    def mask(self, instances: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """instances' input_ids [B, L] (and input_mask) -> MLM_KEYS, masked as `masking` says."""
        ids, c = instances["input_ids"], self.config
        if self.masking == "tokens":
            return mlm.mask_tokens(ids, rng, **self.masker_arguments(ids, c.whole_word_masking))
        spans = span_masking.mask_spans(ids, rng, input_mask=instances["input_mask"],
                                        span_lengths=span_masking.ngram_length_pmf(c.ngram_max), draw_per_token=True,
                                        **self.masker_arguments(ids, c.whole_word_masking))
        return {k: spans[k] for k in MLM_KEYS}  # the span boundaries are for SpanBERT's SBO head, which has none

    def masker_arguments(self, ids: np.ndarray, whole_words: bool) -> dict:
        """What mlm.mask_tokens and span_masking.mask_spans both take: the tokenizer's ids, the budget, the
        80/10/10 and, for whole words, word_starts [B, L] from the tokenizer (None: every token is a word)."""
        t, c = self.tokenizer, self.config
        return dict(vocab_size=t.vocab_size, mask_id=t.mask_id, special_ids=t.special_ids,
                    max_predictions=self.max_predictions, mask_prob=c.mask_prob,
                    replace_with_mask=c.replace_with_mask, replace_with_random=c.replace_with_random,
                    word_starts=t.word_start[ids] if whole_words else None)

    @staticmethod
    def model_inputs(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        keys = ("input_ids", "segment_ids", "input_mask", "masked_lm_positions") + (
            ("positions",) if "positions" in batch else ())  # packed rows
        return {k: batch[k] for k in keys}

    def loss(self, outputs: dict[str, jax.Array], batch: dict[str, jax.Array]
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
        loss, metrics = mlm.mlm_loss(outputs["mlm_logits"], batch["masked_lm_ids"],
                                     batch["masked_lm_weights"])
        if self.next_sentence:
            nsp_loss, nsp_metrics = nsp.nsp_loss(outputs["nsp_logits"], batch["next_sentence_labels"],
                                                 "sop" if self.sentence_order else "nsp")
            loss = loss + nsp_loss
            metrics.update(nsp_metrics)
        metrics["loss"] = loss
        # Real (non-padding) tokens, for tokens/s.
        metrics["tokens"] = jnp.sum(batch["input_mask"] > 0).astype(jnp.float32)  # packed rows hold ids 1..n
        return loss, metrics


def pack_instances(instances: dict[str, np.ndarray], max_seq_length: int, pad_id: int) -> dict[str, np.ndarray]:
    """Single-segment instances [N, L] -> rows [R, L], R <= N, each holding whole instances in order (objectives/
    packing.py): input_mask = the example's number 1..n (0 = padding), positions = the place inside the example."""
    lengths = instances["input_mask"].sum(axis=1)
    examples = [{"input_ids": row[:n]} for row, n in zip(instances["input_ids"], lengths)]
    packed = packing.pack_examples(examples, {"input_ids": max_seq_length})
    ids, segments = packed["input_ids"], packed["input_ids_segment_ids"]
    rows = len(ids)
    return {"input_ids": np.where(segments > 0, ids, pad_id).astype(np.int32),
            "segment_ids": np.zeros_like(ids, np.int32), "input_mask": segments.astype(np.int32),
            "positions": packed["input_ids_positions"].astype(np.int32),
            "next_sentence_labels": np.zeros(rows, np.int32)}


class SpanBertPretraining(BertPretraining):
    """Objective "spanbert" (SpanBERT, Joshi et al., 2020): span masking (`span_masking.mask_spans`, lengths in
    words ~ Geometric(geometric_p) clipped at max_span_length), loss = MLM + SBO (+ NSP when next_sentence is on).

    Loss (J&M eq. 11.7): L = L_MLM + L_SBO, both cross-entropies over the same masked tokens; the SBO predicts
    each token from the span's boundary states and its position in the span (`models.heads.SpanBoundaryHead`).
    Instances and the NSP switch are BertPretraining's (SpanBERT itself trains single segments without NSP:
    configs/spanbert.py). Reads config keys mask_prob, replace_with_mask, replace_with_random, geometric_p,
    max_span_length, max_predictions_per_seq, long_max_predictions_per_seq, next_sentence,
    short_seq_prob. The model must have the SBO head (config.model.span_boundary=True).
    """

    def __init__(self, config: ml_collections.ConfigDict, tokenizer, *, long_phase: bool = False):
        super().__init__(config, tokenizer, long_phase=long_phase)
        if not 0 < config.geometric_p <= 1:
            raise ObjectiveError(f"config.objective.geometric_p={config.geometric_p} must be in (0, 1]; "
                                 "SpanBERT uses 0.2")
        if config.max_span_length < 1:
            raise ObjectiveError(f"config.objective.max_span_length={config.max_span_length} must be >= 1; "
                                 "SpanBERT uses 10")

    def mask(self, instances: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Host side: span-mask a batch of instances afresh (dynamic masking), in whole words; MLM and span keys."""
        c = self.config
        return span_masking.mask_spans(instances["input_ids"], rng, input_mask=instances["input_mask"],
                                       span_lengths=span_masking.span_length_pmf(c.geometric_p, c.max_span_length),
                                       **self.masker_arguments(instances["input_ids"], whole_words=True))

    @staticmethod
    def model_inputs(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return {**BertPretraining.model_inputs(batch), **{k: batch[k] for k in span_masking.SPAN_KEYS}}

    def loss(self, outputs: dict[str, jax.Array], batch: dict[str, jax.Array]
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
        if "sbo_logits" not in outputs:
            raise ObjectiveError("objective 'spanbert' needs the model's span boundary head: "
                                 "set --config.model.span_boundary=True")
        loss, metrics = super().loss(outputs, batch)  # MLM (+ NSP)
        sbo_loss, sbo_metrics = mlm.mlm_loss(outputs["sbo_logits"], batch["masked_lm_ids"],
                                             batch["masked_lm_weights"])
        metrics.update({"sbo_loss": sbo_loss, "sbo_accuracy": sbo_metrics["mlm_accuracy"]})
        metrics["loss"] = loss + sbo_loss
        return metrics["loss"], metrics
