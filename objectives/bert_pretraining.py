"""BERT pretraining: masked LM (+ next sentence prediction), total loss = MLM + NSP. With
`sentence_order` (ALBERT) the pairs are sentence-order ones and the NSP head's metrics are named sop_loss
and sop_accuracy.

Instances (sentence pairs, or single segments without NSP) are made once per data epoch by
`nsp.create_instances`; masking is dynamic: `mlm.mask_tokens` draws a new mask every time a
batch is built, as RoBERTa does, instead of BERT's 10 static copies.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from objectives import mlm, nsp
from objectives.interface import ObjectiveError


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

    def for_long_phase(self) -> BertPretraining:
        return type(self)(self.config, self.tokenizer, long_phase=True)

    def create_instances(self, documents: list[list[np.ndarray]], rng: np.random.Generator,
                         max_seq_length: int) -> dict[str, np.ndarray]:
        """One epoch of fixed-length instances, [N, L] each."""
        t = self.tokenizer
        try:
            return nsp.create_instances(
                documents, rng, max_seq_length=max_seq_length, short_seq_prob=self.config.short_seq_prob,
                cls_id=t.cls_id, sep_id=t.sep_id, pad_id=t.pad_id, next_sentence=self.next_sentence,
                sentence_order=self.sentence_order)
        except ValueError as e:  # too few documents, sequences too short: the user's corpus/config
            raise ObjectiveError(str(e)) from None

    def make_batch(self, instances: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Host side: mask a batch of instances afresh (dynamic masking)."""
        t, c = self.tokenizer, self.config
        word_starts = t.word_start[instances["input_ids"]] if c.whole_word_masking else None
        masked = mlm.mask_tokens(
            instances["input_ids"], rng, vocab_size=t.vocab_size, mask_id=t.mask_id,
            special_ids=t.special_ids, max_predictions=self.max_predictions, mask_prob=c.mask_prob,
            replace_with_mask=c.replace_with_mask, replace_with_random=c.replace_with_random,
            word_starts=word_starts)
        batch = {k: v for k, v in instances.items() if k != "input_ids"}
        batch.update(masked)
        return batch

    @staticmethod
    def model_inputs(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return {k: batch[k] for k in ("input_ids", "segment_ids", "input_mask", "masked_lm_positions")}

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
        metrics["tokens"] = jnp.sum(batch["input_mask"]).astype(jnp.float32)
        return loss, metrics
