"""Text generation from a trained GPT, as nanoGPT's sample.py.

--init takes what `load_language_model` takes (a pretrain.train GPT workdir or a Hugging Face GPT-2
directory). Each prompt's samples are printed under a `----- prompt i/n, sample j/k (reason) -----`
header, the prompt followed by its completion. Backslash escapes (\\n, \\t) in --prompt, --stop and
prompt-file lines are interpreted, so a shell can pass a newline. Without a prompt the model starts
from the tokenizer's end-of-text token (GPT-2's <|endoftext|>, as nanoGPT does) or, for tokenizers
without one (char), from "\\n" (nanoGPT's default start for shakespeare_char).

Decoding reuses the model's KV cache and models/decoding.py (greedy_search, or sample with
temperature, then top-k, then top-p), one batch for all prompts and samples, prompts of different
lengths forced token by token (decoding.split_prompts). Context: like nanoGPT, the model reads at
most its last n_positions tokens. Up to that length decoding runs on the cache; past it, each new
token costs a full forward pass over the last n_positions tokens (positions restart at 0 for that
window, exactly nanoGPT's `idx[:, -block_size:]` crop), since learned absolute position embeddings
make cached keys and values invalid once the window slides. A prompt longer than the context is
likewise read through its last n_positions tokens.

Stopping: the tokenizer's end-of-text id ends a row (it is not printed). A stop string cuts the
completion before its first occurrence (the stop string is not printed, as in OpenAI's API); a row
ends at once when it emits a token whose text contains a stop string (that is exact: the cut is
then at or before that token). A stop string that only forms across several tokens ("\\n\\n" of a
char model) cuts the text but lets the row run to max_new_tokens.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from models import decoding
from models.gpt import GPT, init_cache, make_tokens_to_logits
from objectives.interface import eos_id_or_none
from pretrain.data.tokenizers import UnknownTextError
from pretrain.lm.language_model import LanguageModel, pad_rows
from pretrain.runtime.errors import UserError


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is chosen (hashable: a static argument of the jitted decoders).
    greedy or temperature 0: argmax; else softmax(logits / temperature) filtered by top-k then top-p
    (top_k 0 and top_p 1 turn a filter off)."""
    greedy: bool = False
    temperature: float = 0.8
    top_k: int = 200
    top_p: float = 1.0

    def __post_init__(self):  # models/decoding.py would take a negative top_k as "no filter", silently
        if not self.temperature >= 0:
            raise UserError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise UserError(f"top_k={self.top_k} must be >= 0 (0 = no top-k filter: sample among all tokens)")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p={self.top_p} must be in (0, 1] (1 = no nucleus filter)")


# The most tokens one sample may ask for. Past n_positions each new token is a full forward pass over the
# window, and the decoding loop holds every row's new tokens in one [rows, max_new_tokens] int32 buffer with
# int32 step counters: 10**10 overflows them (a traceback), and long before that the buffer outgrows memory
# and the run would take days. A million tokens (4 MB a row; ~2000 nanoGPT default samples) is ample.
MAX_NEW_TOKENS = 1_000_000


def check_max_new_tokens(max_new_tokens: int) -> None:
    """One line for a max_new_tokens outside [1, MAX_NEW_TOKENS] (before any model is loaded or compiled)."""
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens={max_new_tokens} must be >= 1")
    if max_new_tokens > MAX_NEW_TOKENS:
        raise UserError(f"max_new_tokens={max_new_tokens} exceeds {MAX_NEW_TOKENS:,} tokens per sample, the most a "
                        f"run can hold; ask for at most {MAX_NEW_TOKENS} (or generate in several runs)")


@dataclasses.dataclass(frozen=True)
class Completion:
    prompt: str          # the prompt as given ("" = unconditional, "\n" for the char default)
    text: str            # what the model wrote after it, cut before a stop string
    finish_reason: str   # 'eos' (end-of-text token) | 'stop' (a stop string) | 'length' (max_new_tokens)


# ----------------------------------------------------------------------------------------------
# Token ids -> token ids
# ----------------------------------------------------------------------------------------------

def generate_ids(model: GPT, params, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                 sampling: Sampling = Sampling(), rng: jax.Array | None = None,
                 stop_ids: Sequence[int] = ()) -> list[list[int]]:
    """Continues each prompt (a list of >= 1 token ids; prompts may differ in length).

    Returns, per prompt, its new tokens: max_new_tokens of them, or fewer ending with the first
    stop id (kept). `rng` (a jax key) drives sampling; step i of a phase draws with fold_in(key, i),
    so the same (rng, prompts, settings) always give the same tokens.
    """
    check_max_new_tokens(max_new_tokens)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("every prompt needs at least one token (start an unconditional sample from the "
                        "end-of-text token, see unconditional_start)")
    if not sampling.greedy and sampling.temperature >= decoding.MIN_TEMPERATURE and rng is None:
        raise UserError("sampling needs an rng (jax.random.key(seed)); or pass Sampling(greedy=True)")
    rng = jax.random.key(0) if rng is None else rng
    context = model.config.n_positions
    cropped = [[int(t) for t in p][-context:] for p in prompts]   # nanoGPT: idx[:, -block_size:]
    lengths = np.array([len(p) for p in cropped], np.int32)
    padded, _ = pad_rows(cropped, 0, multiple=1)                 # pad never read: prompts are forced by length
    stop_ids = tuple(sorted({int(i) for i in stop_ids}))

    # The longest row ends with lengths.max() + max_new_tokens tokens; all but the last are fed to the model.
    total = int(lengths.max()) + max_new_tokens
    cached_steps = min(total - 1, context)
    rng_cached, rng_windowed = jax.random.split(rng)
    sequences = np.asarray(_cached_phase(model, params, padded, lengths, rng_cached, steps=cached_steps,
                                         sampling=sampling, stop_ids=stop_ids))         # [B, cached_steps + 1]
    if total > sequences.shape[1]:
        finished = np.array([_first_stop(sequences[row, n:], stop_ids) is not None for row, n in enumerate(lengths)])
        finished |= sequences.shape[1] - lengths >= max_new_tokens
        if not finished.all():
            more = _windowed_phase(model, params, sequences, finished, rng_windowed,
                                   steps=total - sequences.shape[1], sampling=sampling, stop_ids=stop_ids)
            sequences = np.concatenate([sequences, np.asarray(more)], axis=1)
    out = []
    for row, n in enumerate(lengths):
        new = sequences[row, n:n + max_new_tokens].tolist()
        stop_at = _first_stop(new, stop_ids)
        out.append(new if stop_at is None else new[:stop_at + 1])
    return out


def _first_stop(tokens: Sequence[int], stop_ids: tuple[int, ...]) -> int | None:
    hits = np.flatnonzero(np.isin(np.asarray(tokens), stop_ids)) if stop_ids else []
    return int(hits[0]) if len(hits) else None


def _decode(tokens_to_logits, cache, start_tokens, steps: int, rng, sampling: Sampling, stop_ids, prompt=None,
            prompt_lengths=None) -> jax.Array:
    """One models/decoding.py loop -> tokens [B, steps]."""
    if sampling.greedy:
        return decoding.greedy_search(tokens_to_logits, cache, start_tokens, steps, stop_ids=stop_ids,
                                      prompt=prompt, prompt_lengths=prompt_lengths)
    return decoding.sample(tokens_to_logits, cache, start_tokens, steps, rng, temperature=sampling.temperature,
                           top_k=sampling.top_k, top_p=sampling.top_p, stop_ids=stop_ids, prompt=prompt,
                           prompt_lengths=prompt_lengths)


@functools.partial(jax.jit, static_argnames=("model", "steps", "sampling", "stop_ids"))
def _cached_phase(model: GPT, params, prompts: jax.Array, lengths: jax.Array, rng: jax.Array, *, steps: int,
                  sampling: Sampling, stop_ids: tuple[int, ...]) -> jax.Array:
    """prompts [B, P] (lengths [B]) -> whole rows [B, steps + 1] (prompt, then new tokens; pad 0 after a
    stop), decoded on the KV cache; steps <= n_positions."""
    start, forced, forced_lengths = decoding.split_prompts(prompts, lengths)
    cache = init_cache(model, params, prompts.shape[0], steps)
    tokens = _decode(make_tokens_to_logits(model, params), cache, start, steps, rng, sampling, stop_ids,
                     forced, forced_lengths)
    return jnp.concatenate([start[:, None], tokens], axis=1)


@functools.partial(jax.jit, static_argnames=("model", "steps", "sampling", "stop_ids"))
def _windowed_phase(model: GPT, params, sequences: jax.Array, finished: jax.Array, rng: jax.Array, *,
                    steps: int, sampling: Sampling, stop_ids: tuple[int, ...]) -> jax.Array:
    """Rows of n_positions + 1 tokens [B, C + 1] -> the next `steps` tokens [B, steps], each predicted from
    the last C tokens by a full forward pass (nanoGPT's crop). The 'cache' is that window [B, C]."""
    context = model.config.n_positions
    if stop_ids:  # rows that need nothing more emit a stop token at once, so the loop can end early
        only_stop = jnp.full((model.config.vocab_size,), -jnp.inf).at[stop_ids[0]].set(0.0)

    def tokens_to_logits(token_ids, window, step):
        del step
        window = jnp.concatenate([window[:, 1:], token_ids], axis=1)
        logits = model.apply({"params": params}, window)["logits"][:, -1]
        if stop_ids:
            logits = jnp.where(finished[:, None], only_stop, logits)
        return logits, window

    return _decode(tokens_to_logits, sequences[:, :context], sequences[:, context], steps, rng, sampling, stop_ids)


# ----------------------------------------------------------------------------------------------
# Text -> text
# ----------------------------------------------------------------------------------------------

def unconditional_start(tokenizer) -> tuple[list[int], str]:
    """-> (ids, shown text) an unprompted sample starts from: the end-of-text token (shown as nothing),
    else a newline (nanoGPT's start="\\n" for its char models)."""
    eos = eos_id_or_none(tokenizer)
    if eos is not None:
        return [eos], ""
    try:
        ids = tokenizer.encode("\n")
    except UnknownTextError:
        ids = []
    if len(ids) != 1:
        raise UserError(f"{tokenizer!r} has no end-of-text token and no newline token to start an unprompted "
                        "sample from; give --prompt")
    return ids, "\n"


def stop_token_ids(tokenizer, stop: Sequence[str]) -> list[int]:
    """Ids whose own text contains a stop string: once one is generated the completion is cut at or
    before it, so its row may end there."""
    if not stop:
        return []
    return [i for i in range(tokenizer.vocab_size) if any(s in tokenizer.decode([i]) for s in stop)]


def continuation_text(tokenizer, prompt_ids: Sequence[int], new_ids: Sequence[int]) -> str:
    """The text the new ids add after the prompt. Decoded together with the prompt, because a
    tokenizer may render a token differently at the start of a text (sentencepiece drops a word's space)."""
    before = tokenizer.decode(list(prompt_ids))
    full = tokenizer.decode(list(prompt_ids) + list(new_ids))
    return full[len(before):] if full.startswith(before) else tokenizer.decode(list(new_ids))


def generate(lm: LanguageModel, prompts: Sequence[str] = ("",), *, max_new_tokens: int = 500,
             sampling: Sampling = Sampling(), num_samples: int = 1, seed: int = 0,
             stop: Sequence[str] = ()) -> list[list[Completion]]:
    """Each prompt ("" = unconditional) -> its num_samples completions, all drawn in one batch."""
    if num_samples < 1:
        raise UserError(f"num_samples={num_samples} must be >= 1")
    if any(s == "" for s in stop):
        raise UserError("a stop string is empty; give non-empty --stop strings")
    tokenizer = lm.tokenizer
    eos = eos_id_or_none(tokenizer)
    starts = [unconditional_start(tokenizer) if p == "" else (tokenizer.encode(p), p) for p in prompts]
    for (ids, _), p in zip(starts, prompts):
        if not ids:
            raise UserError(f"prompt {p!r} encodes to no tokens; give a prompt with text the tokenizer knows")
    rows = [ids for ids, _ in starts for _ in range(num_samples)]
    stop_ids = set(stop_token_ids(tokenizer, stop)) | ({eos} if eos is not None else set())
    new = generate_ids(lm.model, lm.params, rows, max_new_tokens, sampling=sampling,
                       rng=jax.random.key(seed), stop_ids=sorted(stop_ids))
    results = []
    for i, (ids, shown) in enumerate(starts):
        completions = []
        for tokens in new[i * num_samples:(i + 1) * num_samples]:
            ended_by_eos = eos is not None and tokens and tokens[-1] == eos
            text = continuation_text(tokenizer, ids, tokens[:-1] if ended_by_eos else tokens)
            cuts = [text.find(s) for s in stop if s in text]
            if cuts:
                completions.append(Completion(shown, text[:min(cuts)], "stop"))
            else:
                completions.append(Completion(shown, text, "eos" if ended_by_eos else "length"))
        results.append(completions)
    return results


def format_completions(results: list[list[Completion]]) -> str:
    lines = []
    for i, completions in enumerate(results):
        for j, c in enumerate(completions):
            lines += [f"----- prompt {i + 1}/{len(results)}, sample {j + 1}/{len(completions)} "
                      f"({c.finish_reason}) -----", c.prompt + c.text]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

def unescape(text: str) -> str:
    r"""Backslash escapes as in a Python string ('\n' -> newline); other characters are kept as they are."""
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as e:
        raise UserError(f"{text!r}: bad backslash escape ({e.reason}); write \\\\ for a backslash") from None


def read_prompts(prompts: Sequence[str] | None, prompt_file: str | None) -> list[str]:
    """--prompt values, or a file's non-blank lines (one prompt each); neither = one unconditional sample."""
    if prompts and prompt_file:
        raise UserError("give --prompt or --prompt_file, not both")
    if prompt_file:
        try:
            with open(prompt_file, encoding="utf-8") as f:
                lines = [line.rstrip("\r\n") for line in f]
        except OSError as e:
            raise UserError(f"--prompt_file={prompt_file}: {e.strerror}; give a text file, one prompt per line"
                            ) from None
        prompts = [line for line in lines if line.strip()]
        if not prompts:
            raise UserError(f"--prompt_file={prompt_file} has no non-blank line; write one prompt per line")
    return [unescape(p) for p in prompts] if prompts else [""]
