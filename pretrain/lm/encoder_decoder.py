"""A trained T5 as a scorer and generator of text: the encoder reads a context, the decoder scores or writes the
continuation (transformers' T5ForConditionalGeneration with `labels`, and its greedy `generate`).

`load_seq2seq(path)` takes a pretrain.train T5 workdir or a Hugging Face T5 directory. Rows are right-padded with
id 0, T5's padding and its decoder's start token, so the decoder reads [0] + the continuation shifted right.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

import models
from models import qkv_layout, stack
from models import t5 as t5_model
from pretrain.data import tokenizers
from pretrain.runtime.errors import UserError
from pretrain.training import pretrained


@dataclasses.dataclass
class Seq2SeqModel:
    model: t5_model.T5
    params: dict
    tokenizer: tokenizers.Tokenizer
    source: str


def load_seq2seq(path: str, *, tokenizer_path: str = "", flag: str = "workdir") -> Seq2SeqModel:
    init = pretrained.load_pretrained(path, flag)
    if not models.family(init.family).encoder_decoder:
        raise UserError(f"{flag}={path} holds a {init.family} model; this needs an encoder-decoder (a T5)")
    config = models.model_config({**init.model, "name": "t5"}, dropout_rate=0.0, dtype="float32")
    params = qkv_layout.to_qkv_layout(stack.to_layout(init.params, scan=config.scan_layers), config.fused_qkv)
    tokenizer = tokenizers.from_config(init.tokenizer, path=tokenizer_path)
    return Seq2SeqModel(t5_model.T5(config), jax.tree.map(jnp.asarray, params), tokenizer, init.source)


@functools.partial(jax.jit, static_argnums=0)
def _target_scores(model: t5_model.T5, params: dict, encoder_ids: jax.Array,  # [B, S], 0 = padding
                   targets: jax.Array) -> tuple[jax.Array, jax.Array]:      # [B, T], 0 past each row's end
    """-> (log P(targets[t] | encoder input, targets[:t]) [B, T], whether it is the argmax [B, T])."""
    decoder_ids = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))  # the start token 0, then the targets shifted right
    logits = model.apply({"params": params}, encoder_ids, decoder_ids)["logits"]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return chosen, jnp.argmax(logits, axis=-1) == targets


def _padded(rows: Sequence[Sequence[int]], count: int) -> np.ndarray:
    """Rows right-padded with 0 to a multiple of 16, `count` rows (copies of the first fill the batch)."""
    rows = list(rows) + [rows[0]] * (count - len(rows))
    out = np.zeros((count, -(-max(len(r) for r in rows) // 16) * 16), np.int32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def continuation_scores(lm: Seq2SeqModel, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                        batch_size: int = 8) -> list[tuple[float, bool]]:
    """(encoder input, continuation) token lists -> (log P(continuation | input) summed, whether greedy decoding
    gives every token of it), `batch_size` pairs a call."""
    results = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        chosen, greedy = map(np.asarray, _target_scores(lm.model, lm.params, _padded([p for p, _ in chunk], batch_size),
                                                        _padded([c for _, c in chunk], batch_size)))
        for i, (_, continuation) in enumerate(chunk):
            n = len(continuation)
            results.append((float(chosen[i, :n].astype(np.float64).sum()), bool(greedy[i, :n].all())))
    return results


_greedy = jax.jit(t5_model.generate, static_argnums=(0, 3, 4))  # compiled once per model, batch and length


def generate_greedy(lm: Seq2SeqModel, inputs: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """Encoder inputs -> each one's greedy continuation (KV cache), up to max_new_tokens, without its end of
    sequence and what follows."""
    eos = lm.tokenizer.eos_id
    out = np.asarray(_greedy(lm.model, lm.params, jnp.asarray(_padded(inputs, len(inputs))), max_new_tokens, eos))
    new = []
    for row in out.tolist():
        new.append(row[:row.index(eos)] if eos in row else row)
    return new
