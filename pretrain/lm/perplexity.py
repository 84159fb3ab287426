"""Perplexity of a GPT on held-out text, with sliding windows.

Prints the tokens scored, the mean negative log-likelihood (nats per token), the perplexity
exp(mean NLL) and bits per character.

Windows follow Hugging Face's guide "Perplexity of fixed-length models"
(https://huggingface.co/docs/transformers/perplexity): windows of the model's context C = n_positions
tokens start every `stride` tokens; a window scores only the tokens after the previous window's end,
so each token is scored once, with as much left context as its window gives (C - stride tokens or
more, except in the first window). Within a window, a token needs at least one earlier token: the
text's first token is never scored, and with stride = C (disjoint windows) neither is the first token
of each window, as in the guide. The guide weights each window's mean loss by its label count minus
one, which undercounts windows whose first label is masked (transformers issue #30975 discusses its
off-by-one); here every scored token counts once, so the mean is the exact per-token mean.

Text: --raw_text reads the file verbatim (newlines kept) as one stream, as data.source='raw_text'
trains; otherwise blank lines separate documents whose lines are joined, with the end-of-text token
between documents when the tokenizer has one, as objectives/causal_lm.py packs them for training.
--eval_fraction scores only the end of the file: raw text, the last fraction of its characters
(nanoGPT's val split, 0.1); documents, the last fraction of the documents; 1 = the whole file.

Bits per character = (mean NLL / ln 2) * tokens / characters of the scored text: exact for the
char tokenizer (one token per character) and the usual tokenizer-independent figure otherwise.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from objectives.causal_lm import join_documents
from objectives.interface import eos_id_or_none
from pretrain.data import sources
from pretrain.lm.language_model import LanguageModel, next_token_log_probs, pad_rows
from pretrain.runtime.errors import UserError


class Window(NamedTuple):
    begin: int          # the window is tokens [begin, end)
    end: int
    first_target: int   # it scores tokens [first_target, end); begin < first_target


def sliding_windows(num_tokens: int, context: int, stride: int) -> list[Window]:
    """The guide's loop: begin = 0, stride, 2 * stride, ...; end = min(begin + context, num_tokens);
    targets are the tokens after the previous window's end (and after the window's first token)."""
    if not 1 <= stride <= context:
        raise UserError(f"stride={stride} must be in [1, {context}] (the model's context n_positions); "
                        "a larger stride would skip tokens")
    windows, previous_end = [], 0
    for begin in range(0, num_tokens, stride):
        end = min(begin + context, num_tokens)
        first_target = max(previous_end, begin + 1)
        if first_target < end:
            windows.append(Window(begin, end, first_target))
        previous_end = end
        if end == num_tokens:
            break
    return windows


def token_nlls(lm: LanguageModel, ids: np.ndarray, *, stride: int, batch_size: int = 8) -> np.ndarray:
    """ids [N] -> [N] float64: -log P(token | its window's earlier tokens), NaN where not scored.

    Windows go through the model batch_size at a time, each batch padded to [batch_size, C] (padding
    kept apart by segment ids), so that one shape compiles."""
    if batch_size < 1:
        raise UserError(f"batch_size={batch_size} must be >= 1")
    ids = np.asarray(ids, np.int32)
    context = lm.config.n_positions
    windows = sliding_windows(len(ids), context, stride)
    if not windows:
        raise UserError(f"the text has {len(ids)} token(s); perplexity needs at least 2 (give more text)")
    nll = np.full(len(ids), np.nan)
    for start in range(0, len(windows), batch_size):
        chunk = windows[start:start + batch_size]
        rows = [ids[w.begin:w.end].tolist() for w in chunk]
        rows += [rows[0]] * (batch_size - len(rows))                  # a full batch: one compiled shape
        batch, segment_ids = pad_rows(rows, lm.tokenizer.pad_id, multiple=context)
        log_probs = np.asarray(next_token_log_probs(lm.model, lm.params, batch, segment_ids), np.float64)
        for row, w in enumerate(chunk):
            # log_probs[row, j] scores the window's token j + 1
            nll[w.first_target:w.end] = -log_probs[row, w.first_target - w.begin - 1:w.end - w.begin - 1]
    return nll


@dataclasses.dataclass(frozen=True)
class PerplexityResult:
    tokens: int           # tokens of the evaluated text
    tokens_scored: int
    characters: int       # characters of the evaluated text
    nll_sum: float        # nats, over the scored tokens
    context: int
    stride: int

    @property
    def mean_nll(self) -> float:
        return self.nll_sum / self.tokens_scored

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll)

    @property
    def bits_per_character(self) -> float:
        return self.mean_nll / math.log(2) * self.tokens / self.characters


def evaluation_tokens(path: str, tokenizer, *, raw_text: bool, eval_fraction: float) -> tuple[np.ndarray, int]:
    """The file's held-out end -> (token ids [N], its number of characters)."""
    if not 0 < eval_fraction <= 1:
        raise UserError(f"--eval_fraction={eval_fraction} must be in (0, 1] (nanoGPT's val split: 0.1; 1 = all)")
    if raw_text:
        # as data.source=raw_text
        _, text = sources.split_tail(sources.read_raw_text(path, flag="--data"), eval_fraction)
        return np.asarray(tokenizer.encode(text), np.int32), len(text)
    documents = sources.read_text_corpus(path, flag="--data")
    documents = documents[-max(1, round(len(documents) * eval_fraction)):]
    characters = sum(len(line) for document in documents for line in document)
    tokenized = [np.concatenate(document) for document in sources.tokenize_documents(documents, tokenizer)]
    return join_documents(tokenized, eos_id_or_none(tokenizer)), characters  # the stream causal_lm trains on


def perplexity(lm: LanguageModel, path: str, *, raw_text: bool = False, eval_fraction: float = 0.1,
               stride: int = 0, batch_size: int = 8) -> PerplexityResult:
    """stride 0 = half the context (the guide's 512 of GPT-2's 1024)."""
    context = lm.config.n_positions
    stride = stride or max(1, context // 2)
    ids, characters = evaluation_tokens(path, lm.tokenizer, raw_text=raw_text, eval_fraction=eval_fraction)
    nll = token_nlls(lm, ids, stride=stride, batch_size=batch_size)
    scored = ~np.isnan(nll)
    return PerplexityResult(len(ids), int(scored.sum()), characters, float(nll[scored].sum()), context, stride)


def format_result(result: PerplexityResult) -> str:
    return "\n".join([
        f"tokens scored: {result.tokens_scored} of {result.tokens} (context {result.context}, stride {result.stride})",
        f"mean NLL: {result.mean_nll:.6f} nats/token",
        f"perplexity: {result.perplexity:.6f}",
        f"bits per character: {result.bits_per_character:.6f}",
    ])
