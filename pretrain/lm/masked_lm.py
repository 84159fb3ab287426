"""Pseudo-log-likelihood scoring with a masked LM (BERT, ALBERT, ModernBERT, ELECTRA's generator).

Salazar et al. 2020, "Masked Language Model Scoring": a sentence W = w_1..w_n is scored by masking each token in
turn and summing the log-probabilities the model gives it, PLL(W) = sum_t log P(w_t | W without w_t). Each token is
one forward pass: a sentence of n tokens is n rows, all rows of all sentences batched together. The "word-l2r"
variant of Kauf & Ivanova 2023 (`within_word_l2r`, minicons' name) also masks the tokens to the right of w_t
within w_t's word, so that a word split into pieces cannot be guessed from its own later pieces.

Rows are [CLS] context tokens [SEP]; only the tokens `score` is given are masked and counted (the context is read,
not scored: lm-eval's loglikelihood of a continuation). Words are the tokenizer pipeline's pre-tokenized words
(what transformers' `word_ids()` gives, so the variant matches minicons'), or, for a kind without a pipeline, the
runs that start at a word-start piece.

`load_masked_lm(path)` takes a pretrain.train workdir of a family registered in MASKED_LMS or a Hugging Face BERT,
ALBERT or ModernBERT directory.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import models
from models import qkv_layout, stack
from models.registry import Registry
from pretrain.data import tokenizers
from pretrain.runtime.errors import UserError
from pretrain.training import pretrained
from pretrain.workdir import checkpoints, storage

VARIANTS = ("original", "within_word_l2r")
ROWS_PER_CALL = 64  # masked rows per forward pass: one compiled shape per padded length


@dataclasses.dataclass(frozen=True)
class MaskedFamily:
    """How one family's pretraining module gives MLM logits: (module, params, ids, mask, positions) -> [B, P, V]."""
    logits: Callable[..., jax.Array]
    config: Callable[[dict, dict], dict] = lambda fields, params: fields  # the config fields the scorer builds with


def _bert_logits(module, params, ids, mask, positions):
    return module.apply({"params": params}, ids, jnp.zeros_like(ids), mask, positions)["mlm_logits"]


def _bert_fields(fields: dict, params: dict) -> dict:
    """The pretraining heads the checkpoint has: NSP only with its weights, never SpanBERT's boundary head."""
    return {**fields, "next_sentence": "nsp_head" in params, "span_boundary": False}


# config.model.name -> how its MLM scores; a family not here cannot be scored by PLL.
MASKED_LMS: Registry[MaskedFamily] = Registry("masked LM", key="config.model.name", error=UserError)
MASKED_LMS.register("bert", MaskedFamily(_bert_logits, _bert_fields))
MASKED_LMS.register("modernbert", MaskedFamily(
    lambda module, params, ids, mask, positions: module.apply({"params": params}, ids, None, mask,
                                                              positions)["mlm_logits"]))
MASKED_LMS.register("electra", MaskedFamily(  # the generator: a masked LM (the discriminator is not one)
    lambda module, params, ids, mask, positions: module.apply({"params": params}, ids, jnp.zeros_like(ids), mask,
                                                              positions, method="generate")))


@dataclasses.dataclass
class MaskedLM:
    family: str
    module: object
    params: dict
    tokenizer: tokenizers.Tokenizer
    source: str
    max_length: int          # the position table: the longest row, [CLS] and [SEP] included

    @functools.cached_property
    def pipeline(self):
        """The tokenizer's `tokenizers` pipeline (None for a kind without one), built once: it gives the words."""
        return self.tokenizer.hf_pipeline()


def _checkpoint(path: str, flag: str) -> tuple[dict, dict, dict, str]:
    """-> (config.model fields, params with the MLM head, tokenizer spec, source)."""
    if pretrained.hf_model_type(path) is not None:
        loaded = pretrained.load_pretrained(path, flag, heads=True)
        return loaded.model, loaded.params, loaded.tokenizer, loaded.source
    workdir, ckpt = pretrained.find_workdir(storage.absolute(os.path.expanduser(path)), flag)
    config = json.loads(storage.read_text(os.path.join(workdir, "config.json")))
    if "task" in config:
        raise UserError(f"{flag}={path} holds a fine-tuned {config['model'].get('name')} model, which has no masked-LM "
                        "head to score with: give its pretraining run")
    params, step = checkpoints.restore_params(ckpt)
    return config["model"], params, dict(config["tokenizer"]), f"orbax:{ckpt}/{step}"


def load_masked_lm(path: str, *, tokenizer_path: str = "", flag: str = "workdir") -> MaskedLM:
    family = pretrained.family_of(path, flag)  # before any weight is read
    if family not in MASKED_LMS:
        raise UserError(f"{flag}={path} holds a {family} model, which has no masked-LM head to score with: give a "
                        f"pretraining run of {', '.join(MASKED_LMS.names())} or a Hugging Face BERT, ALBERT or "
                        "ModernBERT directory")
    fields, params, tokenizer_spec, source = _checkpoint(path, flag)
    fields = MASKED_LMS.get(family).config(dict(fields, name=family), params)
    config = models.model_config(fields, dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32")
    params = qkv_layout.to_qkv_layout(stack.to_layout(params, scan=config.scan_layers), config.fused_qkv)
    tokenizer = tokenizers.from_config(tokenizer_spec, path=tokenizer_path)
    module = models.family(family).model_cls()(config)
    return MaskedLM(family, module, jax.tree.map(jnp.asarray, params), tokenizer, source,
                    config.max_position_embeddings)


# ----------------------------------------------------------------------------------------------
# Rows: one per scored token
# ----------------------------------------------------------------------------------------------

def word_ids(lm: MaskedLM, text: str, ids: Sequence[int]) -> list[int]:
    """The word each of `ids` (text's tokens) belongs to: the tokenizer pipeline's words where it encodes `text` as
    `ids`, else runs that start at a word-start piece."""
    if text and lm.pipeline is not None:
        encoding = lm.pipeline.encode(text, add_special_tokens=False)
        if list(encoding.ids) == list(ids):
            return [-1 if w is None else w for w in encoding.word_ids]
    return list(np.cumsum([bool(lm.tokenizer.word_start[i]) for i in ids]) - 1)


def masked_rows(ids: Sequence[int], scored: range, words: Sequence[int] | None, mask_id: int
                ) -> list[tuple[list[int], int, int]]:
    """ids: a row with its [CLS] and [SEP]; scored: the positions counted. -> (masked row, position, target) per
    scored position; with `words` (one per position) the later scored tokens of the same word are masked too."""
    rows = []
    for t in scored:
        masked = list(ids)
        masked[t] = mask_id
        if words is not None:
            for j in range(t + 1, scored.stop):
                if words[j] == words[t]:
                    masked[j] = mask_id
        rows.append((masked, t, int(ids[t])))
    return rows


@functools.partial(jax.jit, static_argnums=(0, 1))
def _target_scores(family: str, module, params: dict, ids: jax.Array, mask: jax.Array,  # [B, L] each
                   positions: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:  # [B] each
    """-> (log P(target) at the masked position [B], whether the target is the argmax [B])."""
    logits = MASKED_LMS.get(family).logits(module, params, ids, mask, positions[:, None])[:, 0]  # [B, V]
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
    return chosen, jnp.argmax(logits, axis=-1) == targets


def score_rows(lm: MaskedLM, rows: list[tuple[list[int], int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Masked rows -> (log-probability of each target, whether it is the argmax), ROWS_PER_CALL rows a call, rows
    sorted by length and padded to a multiple of 16 (few shapes compile)."""
    log_probs, greedy = np.zeros(len(rows), np.float64), np.zeros(len(rows), bool)
    order = sorted(range(len(rows)), key=lambda r: len(rows[r][0]))
    for start in range(0, len(order), ROWS_PER_CALL):
        chunk = order[start:start + ROWS_PER_CALL]
        length = min(-(-max(len(rows[r][0]) for r in chunk) // 16) * 16, lm.max_length)
        ids = np.full((ROWS_PER_CALL, length), lm.tokenizer.pad_id, np.int32)
        mask = np.zeros((ROWS_PER_CALL, length), np.int32)
        positions, targets = np.zeros(ROWS_PER_CALL, np.int32), np.zeros(ROWS_PER_CALL, np.int32)
        for i, r in enumerate(chunk):
            row, positions[i], targets[i] = rows[r]
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
        chosen, top = _target_scores(lm.family, lm.module, lm.params, jnp.asarray(ids), jnp.asarray(mask),
                                     jnp.asarray(positions), jnp.asarray(targets))
        log_probs[chunk], greedy[chunk] = np.asarray(chosen)[:len(chunk)], np.asarray(top)[:len(chunk)]
    return log_probs, greedy


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise UserError(f"PLL variant {variant!r} is not one of {', '.join(VARIANTS)}")


def score(lm: MaskedLM, requests: Sequence[tuple[str, Sequence[int], Sequence[int]]], variant: str = "original"
          ) -> list[tuple[float, bool]]:
    """(text, context ids, continuation ids) -> (PLL of the continuation's tokens with the context visible, whether
    every one of them is the model's first choice), per request. Rows are [CLS] context continuation [SEP]."""
    check_variant(variant)
    cls, sep, mask_id = lm.tokenizer.cls_id, lm.tokenizer.sep_id, lm.tokenizer.mask_id
    rows, owner = [], []
    for r, (text, context, continuation) in enumerate(requests):
        context = list(context)[1:] if list(context)[:1] == [cls] else list(context)
        ids = [cls] + context + list(continuation) + [sep]
        if len(ids) > lm.max_length:
            raise UserError(f"a request of {len(ids)} tokens ([CLS] and [SEP] included) is longer than the model's "
                            f"{lm.max_length} positions; shorten it (PLL reads the whole text at once)")
        words = None
        if variant == "within_word_l2r":
            words = [-1] + word_ids(lm, text, context + list(continuation)) + [-1]
        scored = range(1 + len(context), 1 + len(context) + len(continuation))
        new = masked_rows(ids, scored, words, mask_id)
        rows += new
        owner += [r] * len(new)
    log_probs, greedy = score_rows(lm, rows) if rows else (np.zeros(0), np.zeros(0, bool))
    owner = np.asarray(owner, np.int64)
    totals = np.bincount(owner, weights=log_probs, minlength=len(requests))       # one pass, however many requests
    misses = np.bincount(owner, weights=~greedy, minlength=len(requests))
    return [(float(total), not miss) for total, miss in zip(totals, misses)]


def sentence_scores(lm: MaskedLM, sentences: Sequence[str], variant: str = "original") -> np.ndarray:
    """PLL of each whole sentence ([CLS] sentence [SEP], every sentence token scored): minicons' sequence_score
    summed."""
    requests = [(text, [], lm.tokenizer.encode(text)) for text in sentences]
    return np.array([pll for pll, _ in score(lm, requests, variant)])
