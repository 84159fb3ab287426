"""Sentence / sentence-pair examples -> BERT features -> padded batches for fine-tuning.

Features are `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` with segment ids 0/1, truncated as BERT's
`_truncate_seq_pair` does (drop the last token of the longer text until the pair fits). Batches
are padded to the longest sequence in the batch rounded up to a multiple of `pad_to_multiple_of`,
so a CPU does not spend time on 128-token padding, and then up to the next of `length_buckets`
(`data.length_buckets` halvings of max_seq_length: 16, 32, 64, 128 for 4), so that jit compiles at most
that many shapes (a varied task otherwise spends its first epoch compiling up to 16 of them).
The batch dimension is always `batch_size`: the last batch is filled with rows of weight 0.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from pretrain.data.tokenizers import Tokenizer


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """Trims the longer of the two from the end until len(a) + len(b) <= max_tokens."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_tokens:
        (a if len(a) > len(b) else b).pop()
    return a, b


def encode_texts(tokenizer: Tokenizer, texts_a: Sequence[str], texts_b: Sequence[str | None] | None,
                 max_seq_length: int) -> list[tuple[list[int], list[int]]]:
    """-> per example (token ids, segment ids), each at most max_seq_length long."""
    ids_a = tokenizer.encode_batch(list(texts_a))
    ids_b = tokenizer.encode_batch([t or "" for t in texts_b]) if texts_b is not None else [None] * len(ids_a)
    features = []
    for a, b in zip(ids_a, ids_b):
        if b is None:
            a = a[:max_seq_length - 2]
            tokens = [tokenizer.cls_id, *a, tokenizer.sep_id]
            segments = [0] * len(tokens)
        else:
            a, b = truncate_pair(a, b, max_seq_length - 3)
            tokens = [tokenizer.cls_id, *a, tokenizer.sep_id, *b, tokenizer.sep_id]
            segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        features.append((tokens, segments))
    return features


def padding(data_config) -> dict:
    """config.data -> FineTuningData's padding fields: the multiple, and `length_buckets` halvings of
    max_seq_length (rounded up to the multiple) as the allowed padded lengths (0 buckets: any multiple)."""
    multiple, longest = data_config.pad_to_multiple_of, data_config.max_seq_length
    count = data_config.get("length_buckets", 0)
    buckets = {-(-(longest >> k) // multiple) * multiple for k in range(count)}
    return dict(pad_to_multiple_of=multiple, length_buckets=tuple(sorted(b for b in buckets if b > 0)))


def subset_indices(num_examples: int, size: int, seed: int = 0) -> np.ndarray:
    """A fixed subset (the same for every training seed): sorted indices of `size` examples."""
    if size <= 0 or size >= num_examples:
        return np.arange(num_examples)
    return np.sort(np.random.default_rng(seed).permutation(num_examples)[:size])


@dataclasses.dataclass
class FineTuningData:
    """Encoded examples plus per-example fields (label, ...) batched on demand."""
    features: list[tuple[list[int], list[int]]]
    fields: dict[str, np.ndarray]          # name -> [N, ...] (e.g. 'label')
    batch_size: int
    pad_id: int
    pad_to_multiple_of: int = 8
    length_buckets: tuple[int, ...] = ()   # the padded lengths allowed (empty: every multiple)
    token_fields: tuple[str, ...] = ()     # fields of [N, max length] cut to each batch's padded length

    def __len__(self) -> int:
        return len(self.features)

    @property
    def steps_per_epoch(self) -> int:
        return -(-len(self) // self.batch_size)

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        """One pass in file order (evaluation); training draws its own order (see `epoch_order`)."""
        for start in range(0, len(self), self.batch_size):
            yield self.batch(np.arange(start, min(start + self.batch_size, len(self))))

    def epoch_order(self, seed: int, epoch: int) -> list[np.ndarray]:
        """Shuffled index chunks of one training epoch, a pure function of (seed, epoch)."""
        order = np.random.default_rng([seed, epoch]).permutation(len(self))
        return [order[s:s + self.batch_size] for s in range(0, len(self), self.batch_size)]

    def example_columns(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """'weight' (0 on the rows that fill the last batch), 'index' (-1 there) and the fields, [B, ...]."""
        b = self.batch_size
        out = {"weight": np.zeros((b,), np.float32), "index": np.full((b,), -1, np.int32)}
        out["weight"][:len(indices)] = 1.0
        out["index"][:len(indices)] = indices
        for name, values in self.fields.items():
            column = np.zeros((b, *values.shape[1:]), values.dtype)
            column[:len(indices)] = values[indices]
            out[name] = column
        return out

    def padded_length(self, indices: np.ndarray) -> int:
        """The longest first feature of the batch, rounded up to pad_to_multiple_of (few jit shapes)."""
        longest = max(len(self.features[i][0]) for i in indices)
        length = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        return min((b for b in self.length_buckets if b >= length), default=length)

    def batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        b, length = self.batch_size, self.padded_length(indices)
        input_ids = np.full((b, length), self.pad_id, np.int32)
        segment_ids = np.zeros((b, length), np.int32)
        input_mask = np.zeros((b, length), np.int32)
        for row, i in enumerate(indices):
            tokens, segments = self.features[i]
            input_ids[row, :len(tokens)] = tokens
            segment_ids[row, :len(tokens)] = segments
            input_mask[row, :len(tokens)] = 1
        out = {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask}
        out |= self.example_columns(indices)
        return out | {name: out[name][:, :length] for name in self.token_fields}


@dataclasses.dataclass
class Seq2SeqData(FineTuningData):
    """Text-to-text examples: features are (encoder ids, target ids), each ending with EOS.

    Encoder rows pad to the longest in the batch (rounded up to `pad_to_multiple_of`); targets pad
    to `targets_length`, one shape for every batch. Decoder inputs are the targets shifted right
    with 0 (T5's pad) as the start token.
    """
    targets_length: int = 8

    def batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        b, length = self.batch_size, self.padded_length(indices)
        inputs = np.full((b, length), self.pad_id, np.int32)
        targets = np.full((b, self.targets_length), self.pad_id, np.int32)
        for row, i in enumerate(indices):
            encoder_ids, target_ids = self.features[i]
            inputs[row, :len(encoder_ids)] = encoder_ids
            targets[row, :len(target_ids)] = target_ids[:self.targets_length]
        decoder_inputs = np.zeros_like(targets)
        decoder_inputs[:, 1:] = targets[:, :-1]
        real = targets != self.pad_id
        # Segment ids (1 = the row's one example, 0 = padding) as the pretraining batches carry them.
        out = {"encoder_input_ids": inputs, "decoder_input_ids": decoder_inputs, "decoder_target_ids": targets,
               "decoder_loss_weights": real.astype(np.float32),
               "encoder_segment_ids": (inputs != self.pad_id).astype(np.int32),
               "decoder_segment_ids": real.astype(np.int32)}
        return out | self.example_columns(indices)
