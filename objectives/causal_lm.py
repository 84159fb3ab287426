"""Decoder-only (GPT) language modelling: predict every token from the tokens before it.

The loss is the cross-entropy of the next token summed over positions, i.e. maximum likelihood of
the sequence, sum_i log Pr(x_{i+1} | x_0..x_i) (Xiao & Zhu 2025, "Foundations of Large Language Models",
Section 1.2.1, eqs. 1.5-1.7; Radford et al. 2018, Section 3.1), here averaged over the real target tokens
of a batch.

Instances (once per data epoch) are rows of max_seq_length + 1 tokens: inputs are a row's first L
tokens, targets its last L (the row shifted by one), so no target is lost at a row's end. The
documents are taken in a random order and `config.objective.pack_documents` picks how rows are cut:

  True (default, nanoGPT / GPT-2)  every document's sentences concatenated, EOS between documents
        (none when the tokenizer has no EOS), the stream cut into windows of L + 1 tokens that
        start every L tokens from a random offset in [0, L) drawn per data epoch (the first
        offset + 1 tokens form a short window of their own): consecutive rows share one token, so
        every next-token pair of the stream is trained once per epoch, and a token does not sit at
        the same position every epoch (nanoGPT draws each window's start at random). Attention and
        the loss run across document boundaries (the EOS tells the model a new document begins),
        as in GPT-2's training.
  False  each document (+ EOS) is its own example, packed whole into rows by objectives.packing
        with segment ids and restarted positions: no attention and no loss crosses a document.
        A document longer than a row is cut into windows as above, each its own segment.

Rows carry only `input_ids` and `segment_ids` ([N, L + 1]); `make_batch` shifts them and derives
positions. Nothing is random per batch: `make_batch` of a given set of instances is deterministic.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from objectives import packing
from objectives.interface import ObjectiveError, eos_id_or_none
from objectives.losses import token_cross_entropy

BATCH_KEYS = ("input_ids", "target_ids", "loss_weights", "segment_ids", "positions")
MODEL_INPUT_KEYS = ("input_ids", "segment_ids", "positions")


def join_documents(documents: list[np.ndarray], eos_id: int | None) -> np.ndarray:
    """Documents [n_i] -> one int32 stream with eos_id between consecutive documents (none if None):
    how GPT-2 and nanoGPT lay out a corpus, for training rows and for perplexity alike."""
    separator = [] if eos_id is None else [np.array([eos_id], np.int32)]
    return np.concatenate([p for d in documents for p in (*separator, np.asarray(d, np.int32))][len(separator):])


class CausalLM:
    """The objective interface of objectives/interface.py for decoder-only models (models/gpt.py).

    config (config.objective): pack_documents (bool, see the module docstring), z_loss
    (coefficient of t5x's log(Z)^2 auxiliary loss, 0 = off).
    """

    def __init__(self, config: ml_collections.ConfigDict, tokenizer):
        self.tokenizer = tokenizer
        self.pack_documents = config.get("pack_documents", True)
        self.z_loss = float(config.get("z_loss", 0.0))
        if not isinstance(self.pack_documents, bool):
            raise ObjectiveError(f"config.objective.pack_documents={self.pack_documents!r} must be True or False")
        if self.z_loss < 0:
            raise ObjectiveError(f"config.objective.z_loss={self.z_loss} must be >= 0")
        self.eos_id = eos_id_or_none(tokenizer)
        self.pad_id = int(tokenizer.pad_id)

    # -----------------------------------------------------------------------------------------
    # Instances and batches (host side, numpy).
    # -----------------------------------------------------------------------------------------
    def create_instances(self, documents: list[list[np.ndarray]], rng: np.random.Generator,
                         max_seq_length: int) -> dict[str, np.ndarray]:
        """One epoch of rows: {'input_ids': [N, L + 1] int32 (pad_id after the end),
        'segment_ids': [N, L + 1] int32 (0 = padding, 1.. = example of the row)}."""
        if max_seq_length < 1:
            raise ObjectiveError(f"config.data.max_seq_length={max_seq_length} must be >= 1")
        docs = [np.concatenate(d).astype(np.int32) for d in documents if sum(len(s) for s in d)]
        if not docs:
            raise ObjectiveError("the corpus has no tokens: every document is empty")
        docs = [docs[i] for i in rng.permutation(len(docs))]
        eos = [] if self.eos_id is None else [self.eos_id]
        if self.pack_documents:
            # One stream, EOS between documents, its window grid shifted by a random offset per epoch so
            # that a token is not always at the same position (nanoGPT draws every window's start at
            # random). The stream's first `offset` + 1 tokens form a short example of their own, so
            # every next-token pair is still trained exactly once per epoch.
            stream = join_documents(docs, self.eos_id)
            offset = int(rng.integers(max_seq_length)) if len(stream) > 2 * max_seq_length else 0
            examples = [stream[:offset + 1], stream[offset:]] if offset else [stream]
        else:
            examples = [np.concatenate([d, np.array(eos, np.int32)]) for d in docs]
        lengths = np.array([len(e) for e in examples], np.int64)
        starts, sizes = _windows(lengths, max_seq_length)
        if not len(sizes):
            raise ObjectiveError("the corpus has fewer than 2 tokens per document: nothing to predict; add text")
        flat = np.concatenate(examples)[_ranges(starts, sizes)]
        packed = packing.pack_flat({"tokens": flat}, {"tokens": sizes}, {"tokens": max_seq_length + 1})
        ids, segment_ids = packed["tokens"], packed["tokens_segment_ids"]
        ids[segment_ids == 0] = self.pad_id
        order = rng.permutation(len(ids))
        return {"input_ids": ids[order], "segment_ids": segment_ids[order]}

    def make_batch(self, instances: dict[str, np.ndarray], rng: np.random.Generator | None
                   ) -> dict[str, np.ndarray]:
        """Rows [B, L + 1] -> the contract's batch, [B, L] each (see BATCH_KEYS).

        loss_weights is 1 where the target (the next token) belongs to the same example as the
        input token, 0 on padding and at each packed example's last token.
        """
        del rng  # nothing is random: the rows were cut and shuffled in create_instances
        ids = np.asarray(instances["input_ids"], np.int32)
        segments = np.asarray(instances["segment_ids"], np.int32)
        same_example = (segments[:, :-1] > 0) & (segments[:, 1:] == segments[:, :-1])
        return {
            "input_ids": ids[:, :-1],
            "target_ids": np.where(same_example, ids[:, 1:], self.pad_id).astype(np.int32),
            "loss_weights": same_example.astype(np.float32),
            "segment_ids": segments[:, :-1],
            "positions": positions_from_segments(segments)[:, :-1],
        }

    # -----------------------------------------------------------------------------------------
    # Device side.
    # -----------------------------------------------------------------------------------------
    @staticmethod
    def model_inputs(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return {k: batch[k] for k in MODEL_INPUT_KEYS}

    def loss(self, outputs: dict[str, jax.Array], batch: dict[str, jax.Array]
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
        return causal_lm_loss(outputs["logits"], batch, z_loss=self.z_loss)


# ---------------------------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------------------------
def _windows(lengths: np.ndarray, max_seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of up to L + 1 tokens starting every L tokens of each example, each with >= 2 tokens
    (one input and its target). lengths [E] -> (global start [W], size [W]) over the concatenation."""
    L = max_seq_length
    per_example = np.maximum(-(-(lengths - 1) // L), 0)  # ceil((n - 1) / L) windows of n tokens
    example = np.repeat(np.arange(len(lengths)), per_example)
    index = np.arange(len(example)) - np.repeat(np.cumsum(per_example) - per_example, per_example)
    local = index * L
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return offsets[example] + local, np.minimum(L + 1, lengths[example] - local)


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """[starts[i], starts[i] + sizes[i]) for every i, concatenated (a vectorised gather index)."""
    within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return np.repeat(starts, sizes) + within


def positions_from_segments(segment_ids: np.ndarray) -> np.ndarray:
    """[B, L] packed segment ids -> [B, L] int32 position inside each segment (0 on padding).

    Segments are contiguous runs (objectives.packing); a run starts where the id changes.
    """
    columns = np.broadcast_to(np.arange(segment_ids.shape[1]), segment_ids.shape)
    starts_run = np.ones(segment_ids.shape, bool)
    starts_run[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    run_start = np.maximum.accumulate(np.where(starts_run, columns, 0), axis=1)
    return np.where(segment_ids > 0, columns - run_start, 0).astype(np.int32)


def causal_lm_loss(logits: jax.Array, batch: dict[str, jax.Array], z_loss: float = 0.0
                   ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(loss, {'loss', 'cross_entropy', 'z_loss', 'accuracy', 'perplexity', 'tokens'}).

    loss = cross_entropy + z_loss term; perplexity = exp(cross_entropy) (= exp(loss) when z_loss
    is 0); 'tokens' counts real input tokens (segment_ids > 0), for tokens/s.
    """
    metrics = token_cross_entropy(logits, batch["target_ids"], batch["loss_weights"], z_loss)
    loss = metrics["cross_entropy"] + metrics["z_loss"]
    metrics.update(loss=loss, perplexity=jnp.exp(metrics["cross_entropy"]),
                   tokens=(batch["segment_ids"] > 0).sum().astype(jnp.float32))
    return loss, metrics
