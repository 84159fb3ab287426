"""A trained decoder-only LM ready to use: load it, score text with it.

`load_language_model(path)` takes what `--config.init` takes (a pretrain.train GPT workdir or a
Hugging Face GPT-2 directory) and returns the module, its parameters and its tokenizer; generation
(pretrain/lm/generation.py), perplexity (pretrain/lm/perplexity.py) and few-shot prompting
(pretrain/lm/fewshot.py) all start here. `next_token_scores` is the one scoring function they share.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

import models
from models import peft, qkv_layout, stack
from models.gpt import GPT, GPTConfig
from pretrain.data import tokenizers
from pretrain.runtime.errors import UserError
from pretrain.training import peft as parameter_efficient
from pretrain.training import pretrained


@dataclasses.dataclass
class LanguageModel:
    model: GPT | peft.PeftModel    # a PEFT run's GPT with its method attached
    params: dict
    tokenizer: tokenizers.Tokenizer
    source: str                    # 'orbax:<dir>/<step>' or 'huggingface:<dir>'
    peft: peft.PeftConfig = peft.NONE  # the PEFT method a fine-tuning run trained (none: a pretrained GPT)

    @property
    def config(self) -> GPTConfig:
        return self.model.config


def load_language_model(path: str, *, tokenizer_path: str = "", dtype: str = "float32",
                        flag: str = "--init") -> LanguageModel:
    """path: a GPT workdir (its latest checkpoint), a Hugging Face GPT-2 directory, or a pretrain.finetune
    workdir of a GPT with a PEFT method (its base, fingerprint checked, with the trained LoRA / prefix /
    adapter weights; its task head is not used). `tokenizer_path` replaces the one the checkpoint names (a
    relative path there is relative to where it trained)."""
    peft_run = parameter_efficient.peft_workdir(path)
    if peft_run:
        part, init, _ = parameter_efficient.load_stored(path)
    else:
        part, init = None, pretrained.load_pretrained(path, flag)
    family = models.family(init.family)
    if not family.causal:  # the capability these tools read (models/families.py), whatever the family's name
        raise UserError(f"{flag}={path} holds a {init.family} model; this needs a decoder-only GPT "
                        "(a configs/gpt2.py workdir or a Hugging Face GPT-2 directory)")
    config = models.model_config({**init.model, "name": family.name}, dropout_rate=0.0, attention_dropout_rate=0.0,
                                 dtype=dtype)
    try:
        tokenizer = tokenizers.from_config(init.tokenizer, path=tokenizer_path)
    except tokenizers.TokenizerError as e:  # the tokenizer names training's option; these tools have their own
        raise tokenizers.TokenizerError(str(e).replace("--config.tokenizer.path", "--tokenizer_path")) from None
    method = parameter_efficient.peft_config(peft_run or {})
    model = peft.attach(family.model_cls()(config), method)
    if part is None:
        params = qkv_layout.to_qkv_layout(stack.to_layout(init.params, scan=config.scan_layers), config.fused_qkv)
    else:  # the base + the trained weights of the fine-tuned body (its task head is left out)
        def merge(blank, init):
            return pretrained.merge_params(blank, init.params, init.source)
        example = {"input_ids": jnp.zeros((1, 8), jnp.int32)}
        params = parameter_efficient.rebuild(model, example, part[family.body.key], init, merge)
    return LanguageModel(model, jax.tree.map(jnp.asarray, params), tokenizer, init.source, method)


def _next_token_scores(model: GPT, params: dict, input_ids: jax.Array,
                      segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """input_ids [B, L] -> ([B, L - 1] float32: log P(x_{t+1} | x_0..x_t) of each row's actual next token,
    [B, L - 1] bool: whether that token is the model's first choice there).

    segment_ids [B, L] (0 = padding) keep padded or packed rows apart exactly as in training; entries
    whose next token is padding are meaningless and left to the caller's mask. The model runs on the
    first L - 1 tokens only (the last has nothing to predict), so L may be the context + 1.
    """
    segments = None if segment_ids is None else segment_ids[:, :-1]
    logits = model.apply({"params": params}, input_ids[:, :-1], segment_ids=segments, deterministic=True)["logits"]
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    chosen = jnp.take_along_axis(log_probs, input_ids[:, 1:, None], axis=-1)[..., 0]
    return chosen, jnp.argmax(logits, axis=-1) == input_ids[:, 1:]


next_token_scores = jax.jit(_next_token_scores, static_argnums=0)


@functools.partial(jax.jit, static_argnums=0)
def next_token_log_probs(model: GPT, params: dict, input_ids: jax.Array,
                         segment_ids: jax.Array | None = None) -> jax.Array:
    """next_token_scores' log-probabilities alone: [B, L - 1] float32 (compiled on its own, so that perplexity's
    and few-shot's steps skip the argmax over the vocabulary)."""
    return _next_token_scores(model, params, input_ids, segment_ids)[0]


def pad_rows(rows: list[list[int]], pad_id: int, multiple: int = 8,
             max_length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token lists -> (ids [B, L] right-padded with pad_id, segment_ids [B, L]: 1 on tokens, 0 on padding),
    L rounded up to `multiple` so that few shapes compile, but never past `max_length` (a model's context)."""
    if not rows or not all(rows):
        raise ValueError("pad_rows needs at least one row and no empty rows")
    longest = max(len(r) for r in rows)
    if max_length is not None and longest > max_length:
        raise ValueError(f"a row of {longest} tokens is longer than the model's context of {max_length} tokens")
    length = -(-longest // multiple) * multiple
    length = length if max_length is None else min(length, max_length)
    ids = np.full((len(rows), length), pad_id, np.int32)
    segment_ids = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
        segment_ids[i, :len(row)] = 1
    return ids, segment_ids


def continuation_scores(lm: LanguageModel, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                        batch_size: int = 8) -> list[tuple[float, bool]]:
    """(context, continuation) token lists -> (log P(continuation | context) summed over its tokens, whether greedy
    decoding gives every one of them), per pair. A row longer than the context keeps its last n_positions + 1
    tokens, as lm-eval's `hf` model type cuts it. Rows are sorted by length and batched `batch_size` a call (the
    last call padded with copies), lengths rounded up to 16: few shapes compile."""
    context = lm.config.n_positions
    rows = [(list(before) + list(after))[-(context + 1):] for before, after in pairs]
    order = sorted(range(len(rows)), key=lambda r: -len(rows[r]))
    results: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = [rows[r] for r in chunk] + [rows[chunk[0]]] * (batch_size - len(chunk))
        ids, segments = pad_rows(batch, lm.tokenizer.pad_id, multiple=16, max_length=context + 1)
        log_probs, greedy = map(np.asarray, next_token_scores(lm.model, lm.params, ids, segments))
        for i, r in enumerate(chunk):
            n, length = len(pairs[r][1]), len(rows[r])
            span = slice(length - 1 - n, length - 1)  # log_probs[t] scores token t + 1
            results[r] = (float(log_probs[i, span].astype(np.float64).sum()), bool(greedy[i, span].all()))
    return results
