"""What every pretraining objective is, what it reads of a tokenizer, and the error it raises.

The loop (pretrain/loops/pretraining.py) and the batch pipeline (pretrain/data/streaming.py) know an
objective only through `Objective`; BERT, SpanBERT, T5 denoising, causal and prefix LM all implement
it, nothing more and nothing less. Host side (numpy): once per data epoch `create_instances` cuts
the tokenized documents into fixed-width instances, and for every batch `make_batch` turns a slice
of them into model-ready arrays (masking, corruption, shifting: whatever is random per batch).
Device side (jax): `model_inputs` picks the module's keyword arguments, `loss` scores its outputs.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import jax
import numpy as np

Documents = list[list[np.ndarray]]   # documents -> sentences -> token ids [n] int32
Arrays = dict[str, np.ndarray]       # every value has the example (batch) axis first


class ObjectiveError(ValueError):
    """An objective setting or a corpus it cannot work with; the message names the key and the fix."""


@runtime_checkable
class StepObjective(Protocol):
    """What the jitted train and eval steps (pretrain/loops/steps.py) need: pretraining objectives and
    the fine-tuning ones (objectives/task_heads/objective.py, the T5 and GPT finetuners') alike."""

    def model_inputs(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """The module's keyword arguments, taken from the batch; besides arrays, an objective may add a static
        option (a hashable Python value: what distillation asks the model to return), which the steps, jitted,
        pass on as it is."""

    def loss(self, outputs: dict[str, jax.Array], batch: dict[str, jax.Array]
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """-> (scalar loss, metrics incl. 'loss'; pretraining also 'tokens', the real tokens for tokens/s)."""


@runtime_checkable
class Objective(StepObjective, Protocol):
    """A pretraining objective: the step's side plus how batches are made from documents."""

    def create_instances(self, documents: Documents, rng: np.random.Generator, max_seq_length: int) -> Arrays:
        """One data epoch: a shuffled set of instances, [N, ...] each (a pure function of rng)."""

    def make_batch(self, instances: Arrays, rng: np.random.Generator) -> Arrays:
        """A batch of instances [B, ...] -> the batch the step consumes [B, ...] (a pure function of rng)."""


@runtime_checkable
class PhasedObjective(Objective, Protocol):
    """An objective that changes for BERT's second, long-sequence phase (20 -> 80 masked positions)."""

    def for_long_phase(self) -> Objective:
        """The objective for batches of the long phase (config.data.long_seq_length)."""


def eos_id_or_none(tokenizer) -> int | None:
    """The tokenizer's end-of-sequence id, or None when it has none: a tokenizer signals a missing
    special token with a LookupError (GPT-2's and T5's have an EOS; the char vocabulary and a
    SentencePiece model without </s> or [SEP] do not)."""
    try:
        eos = getattr(tokenizer, "eos_id", None)
    except LookupError:
        return None
    return None if eos is None else int(eos)
