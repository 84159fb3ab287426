"""Autoregressive generation for any model family: greedy, sampling and beam search.

Every routine drives a model through one callback,

    tokens_to_logits(token_ids [B, 1] int32, cache: pytree, step: int32 scalar)
        -> (logits [B, V] float32, new cache)

which feeds the token at position `step` (position 0 is the start token: T5's decoder start 0,
GPT's first prompt token or BOS) and returns the distribution of the token at position step + 1.
Outputs leave the start token out: `tokens[:, i]` is the token produced at step i, so
`tokens [B, max_length]` is what T5 compares with `decoder_target_ids`.

All routines are jittable (one `lax.while_loop`, static shapes; `max_length`, `beam_size`,
`top_k` and the stop ids are Python values, i.e. static under `jax.jit`). Rows stop on their own
at a stop token (kept in the output), emit pad 0 afterwards, and the loop ends as soon as every
row has stopped.

Prompts of different lengths (decoder-only models): `prompt [B, P]` with `prompt_lengths [B]`
forces `tokens[b, i] = prompt[b, i]` for i < prompt_lengths[b]; the model's choice is discarded
there and stop tokens do not count. For a GPT prompt p_0..p_{n-1}, pass `start_tokens = p_0`
and `prompt = p_1..p_{n-1}`, lengths n - 1 (see `split_prompts`).

Beam search follows t5x's `decoding.beam_search` (itself from the Flax WMT example): `beam_size`
live beams and `beam_size` finished ones, 2 * beam_size candidates per step so that beams reaching
EOS together never starve the live set, the GNMT length penalty ((5 + len) / 6) ** alpha
(Wu et al. 2016, arXiv:1609.08144, eq. 14) on finished hypotheses, and an early exit once no live
beam can beat the worst finished one. Unlike t5x, beams are returned best first.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from models.errors import ModelInputError

PyTree = Any
TokensToLogits = Callable[[jax.Array, PyTree, jax.Array], tuple[jax.Array, PyTree]]

PAD_ID = 0
# t5x's "effective -inf" for beam scores: finite so that sums and divisions stay finite.
NEG_INF = -1.0e7
# Temperatures below this are greedy: dividing logits by ~0 would overflow.
MIN_TEMPERATURE = 1e-4


# ----------------------------------------------------------------------------------------------
# Logit filters (usable on their own)
# ----------------------------------------------------------------------------------------------

def top_k_filter(logits: jax.Array, k: int) -> jax.Array:
    """[..., V] logits -> the same with all but the k largest set to -inf (k <= 0: no filter).

    Ties with the k-th largest value are kept. k is static (lax.top_k needs a static size).
    """
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth_largest = jax.lax.top_k(logits, k)[0][..., -1:]
    return jnp.where(logits < kth_largest, -jnp.inf, logits)


def top_p_filter(logits: jax.Array, p: float | jax.Array) -> jax.Array:
    """Nucleus filter (Holtzman et al. 2020, arXiv:1904.09751): [..., V] -> [..., V].

    Keeps the smallest set of most probable tokens whose probability mass reaches p (always at
    least the most probable token) and sets the others to -inf. Ties with the last kept value
    are kept. p may be traced.
    """
    sorted_logits = jnp.flip(jnp.sort(logits, axis=-1), axis=-1)           # descending
    probs = jax.nn.softmax(sorted_logits.astype(jnp.float32), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs                       # exclusive cumsum
    keep = (mass_before < p).at[..., 0].set(True)
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < threshold, -jnp.inf, logits)


def brevity_penalty(alpha: float, length: int | jax.Array) -> jax.Array:
    """GNMT length penalty ((5 + length) / 6) ** alpha; beam scores are log-probs divided by it."""
    return jnp.power((5.0 + jnp.asarray(length, jnp.float32)) / 6.0, alpha)


# ----------------------------------------------------------------------------------------------
# Shared argument handling
# ----------------------------------------------------------------------------------------------

def split_prompts(prompts: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Decoder-only prompts [B, P] with lengths [B] (>= 1) -> (start_tokens [B], prompt [B, P-1],
    prompt_lengths [B]) for the routines below; their output then continues the whole prompt."""
    prompts = jnp.asarray(prompts, jnp.int32)
    return prompts[:, 0], prompts[:, 1:], jnp.maximum(jnp.asarray(lengths, jnp.int32) - 1, 0)


def _stop_ids(eos_id: int | None, stop_ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted({int(i) for i in stop_ids} | ({int(eos_id)} if eos_id is not None else set())))


def _forced(prompt, prompt_lengths, batch: int, max_length: int) -> tuple[jax.Array, jax.Array]:
    """-> (forced tokens [B, max_length], forced lengths [B]); no prompt = nothing forced."""
    if max_length < 1:
        raise ModelInputError(f"max_length={max_length} must be >= 1 (the number of tokens to generate)")
    if prompt is None:
        return jnp.zeros((batch, max_length), jnp.int32), jnp.zeros((batch,), jnp.int32)
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.ndim != 2 or prompt.shape[0] != batch:
        raise ModelInputError(f"prompt has shape {prompt.shape}; it must be [batch={batch}, P]")
    if prompt.shape[1] > max_length:
        raise ModelInputError(f"prompt is {prompt.shape[1]} tokens long but max_length={max_length}; "
                              "raise max_length to at least the prompt length")
    if prompt_lengths is None:
        prompt_lengths = jnp.full((batch,), prompt.shape[1], jnp.int32)
    forced = jnp.pad(prompt, ((0, 0), (0, max_length - prompt.shape[1])))
    return forced, jnp.minimum(jnp.asarray(prompt_lengths, jnp.int32), prompt.shape[1])


def _is_stop(tokens: jax.Array, stop_ids: tuple[int, ...]) -> jax.Array:
    if not stop_ids:
        return jnp.zeros(tokens.shape, bool)
    return jnp.any(tokens[..., None] == jnp.asarray(stop_ids, jnp.int32), axis=-1)


# ----------------------------------------------------------------------------------------------
# Greedy search and sampling: one loop, a different token chooser
# ----------------------------------------------------------------------------------------------

def _generate(tokens_to_logits: TokensToLogits, cache: PyTree, start_tokens: jax.Array, max_length: int,
              choose: Callable[[jax.Array, jax.Array], jax.Array], stop_ids: tuple[int, ...],
              prompt, prompt_lengths) -> jax.Array:
    """choose(logits [B, V] float32, step) -> [B] tokens. Returns tokens [B, max_length]."""
    start_tokens = jnp.asarray(start_tokens, jnp.int32)
    batch = start_tokens.shape[0]
    forced, forced_lengths = _forced(prompt, prompt_lengths, batch, max_length)

    def keep_going(state):
        step, _, done, _, _ = state
        return (step < max_length) & ~jnp.all(done)

    def one_step(state):
        step, fed, done, tokens, cache = state
        logits, cache = tokens_to_logits(fed[:, None], cache, step)
        chosen = choose(logits.astype(jnp.float32), step).astype(jnp.int32)
        in_prompt = step < forced_lengths
        token = jnp.where(in_prompt, forced[:, step], chosen)
        token = jnp.where(done, PAD_ID, token)
        done = done | (~in_prompt & _is_stop(token, stop_ids))
        return step + 1, token, done, tokens.at[:, step].set(token), cache

    state = (jnp.int32(0), start_tokens, jnp.zeros((batch,), bool),
             jnp.zeros((batch, max_length), jnp.int32), cache)
    return jax.lax.while_loop(keep_going, one_step, state)[3]


def greedy_search(tokens_to_logits: TokensToLogits, cache: PyTree, start_tokens: jax.Array, max_length: int,
                  eos_id: int | None = None, *, stop_ids: Sequence[int] = (),
                  prompt: jax.Array | None = None, prompt_lengths: jax.Array | None = None) -> jax.Array:
    """Argmax decoding: start_tokens [B] -> tokens [B, max_length] (pad 0 after a row's stop token)."""
    return _generate(tokens_to_logits, cache, start_tokens, max_length,
                     lambda logits, step: jnp.argmax(logits, axis=-1),
                     _stop_ids(eos_id, stop_ids), prompt, prompt_lengths)


def sample(tokens_to_logits: TokensToLogits, cache: PyTree, start_tokens: jax.Array, max_length: int,
           rng: jax.Array, temperature: float | jax.Array = 1.0, top_k: int = 0,
           top_p: float | jax.Array = 1.0, eos_id: int | None = None, *, stop_ids: Sequence[int] = (),
           prompt: jax.Array | None = None, prompt_lengths: jax.Array | None = None) -> jax.Array:
    """Ancestral sampling: start_tokens [B] -> tokens [B, max_length].

    Logits are divided by `temperature` (below 1e-4, i.e. 0: argmax of the raw logits), then
    filtered by top-k and then by top-p, in that order (as Hugging Face's generate does).
    Step i draws with `fold_in(rng, i)`, so a (rng, inputs) pair always gives the same tokens.
    """
    if isinstance(temperature, (int, float)) and temperature < 0:
        raise ModelInputError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if isinstance(top_p, (int, float)) and not 0 < top_p <= 1:
        raise ModelInputError(f"top_p={top_p} must be in (0, 1] (1 = no nucleus filter)")
    if isinstance(temperature, (int, float)) and temperature < MIN_TEMPERATURE:
        return greedy_search(tokens_to_logits, cache, start_tokens, max_length, eos_id,
                             stop_ids=stop_ids, prompt=prompt, prompt_lengths=prompt_lengths)

    def choose(logits, step):
        temp = jnp.asarray(temperature, jnp.float32)
        scaled = top_k_filter(logits / jnp.maximum(temp, MIN_TEMPERATURE), top_k)
        if not (isinstance(top_p, (int, float)) and top_p >= 1):
            scaled = top_p_filter(scaled, top_p)
        drawn = jax.random.categorical(jax.random.fold_in(rng, step), scaled, axis=-1)
        return jnp.where(temp < MIN_TEMPERATURE, jnp.argmax(logits, axis=-1), drawn)

    return _generate(tokens_to_logits, cache, start_tokens, max_length, choose,
                     _stop_ids(eos_id, stop_ids), prompt, prompt_lengths)


# ----------------------------------------------------------------------------------------------
# Beam search
# ----------------------------------------------------------------------------------------------

def expand_to_beams(tree: PyTree, beam_size: int) -> PyTree:
    """Repeats every leaf's leading batch axis: [B, ...] -> [B * beam_size, ...] (row b*K + k).

    Use it on anything `tokens_to_logits` closes over with a batch axis (T5's encoder outputs and
    encoder mask); beam_search does it to the cache. Scalar leaves (e.g. a shared cache index)
    are left alone.
    """
    return jax.tree_util.tree_map(lambda x: x if jnp.ndim(x) == 0 else jnp.repeat(x, beam_size, axis=0), tree)


def _gather_beams(x: jax.Array, beam_indices: jax.Array) -> jax.Array:
    """x [B, K, ...], beam_indices [B, K'] -> [B, K', ...]."""
    return x[jnp.arange(x.shape[0])[:, None], beam_indices]


def _gather_cache(cache: PyTree, beam_indices: jax.Array) -> PyTree:
    """Every non-scalar leaf [B*K, ...] takes, for row b*K + k, row b*K + beam_indices[b, k]."""
    batch, beams = beam_indices.shape

    def gather(x):
        if jnp.ndim(x) == 0:
            return x
        return _gather_beams(x.reshape((batch, beams) + x.shape[1:]), beam_indices).reshape(x.shape)
    return jax.tree_util.tree_map(gather, cache)


def _check_cache_batch(cache: PyTree, batch: int) -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
        if jnp.ndim(leaf) and jnp.shape(leaf)[0] != batch:
            raise ModelInputError(f"cache leaf {jax.tree_util.keystr(path)} has shape {jnp.shape(leaf)}; beam search "
                                  f"needs the batch ({batch}) as the leading axis of every non-scalar cache leaf")


def beam_search(tokens_to_logits: TokensToLogits, cache: PyTree, start_tokens: jax.Array, max_length: int,
                eos_id: int, beam_size: int = 4, alpha: float = 0.6, *,
                prompt: jax.Array | None = None, prompt_lengths: jax.Array | None = None,
                ) -> tuple[jax.Array, jax.Array]:
    """Beam search -> (sequences [B, beam_size, max_length], scores [B, beam_size]), best first.

    `cache` holds batch B; it is expanded to B * beam_size rows (see expand_to_beams) and every
    non-scalar leaf is gathered along its leading axis whenever beams are reordered. A finished
    hypothesis of n tokens (EOS included) scores log p / brevity_penalty(alpha, n); it ends with
    EOS followed by pad 0. Rows where no hypothesis reached EOS return their live beams with raw
    log-probs (as t5x does); unfilled finished slots score about NEG_INF. Forced prompt tokens add
    0 to the log-prob and keep a single beam alive (t5x's prompt forcing).
    """
    if beam_size < 1:
        raise ModelInputError(f"beam_size={beam_size} must be >= 1")
    start_tokens = jnp.asarray(start_tokens, jnp.int32)
    batch = start_tokens.shape[0]
    forced, forced_lengths = _forced(prompt, prompt_lengths, batch, max_length)
    _check_cache_batch(cache, batch)
    beams, candidates = beam_size, 2 * beam_size
    only_first_beam = jnp.tile(jnp.asarray([0.0] + [NEG_INF] * (beams - 1), jnp.float32), (batch, 1))

    def keep_going(state):
        step, _, live_logprobs, _, finished_scores, finished_flags, _, _ = state
        # Log-probs only fall and the penalty is largest at max_length: an upper bound on any live beam.
        best_live = live_logprobs[:, 0] / brevity_penalty(alpha, max_length)
        worst_finished = jnp.where(jnp.all(finished_flags, axis=1), finished_scores[:, -1], NEG_INF)
        return (step < max_length) & ~jnp.all(worst_finished > best_live)

    def one_step(state):
        step, live_seqs, live_logprobs, live_last, finished_scores, finished_flags, finished_seqs, cache = state
        logits, cache = tokens_to_logits(live_last.reshape(batch * beams, 1), cache, step)
        vocab = logits.shape[-1]
        logprobs = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(batch, beams, vocab)
        logprobs = logprobs + live_logprobs[..., None]
        # [B, 2K] best continuations over all (beam, token) pairs.
        cand_logprobs, flat_index = jax.lax.top_k(logprobs.reshape(batch, beams * vocab), candidates)
        cand_tokens, cand_parents = flat_index % vocab, flat_index // vocab
        in_prompt = (step < forced_lengths)[:, None]
        cand_tokens = jnp.where(in_prompt, forced[:, step][:, None], cand_tokens)
        cand_parents = jnp.where(in_prompt, 0, cand_parents)
        prompt_logprobs = jnp.concatenate([live_logprobs[:, :1], jnp.full((batch, candidates - 1), NEG_INF)], 1)
        cand_logprobs = jnp.where(in_prompt, prompt_logprobs, cand_logprobs)
        cand_seqs = _gather_beams(live_seqs, cand_parents).at[:, :, step].set(cand_tokens)
        newly_finished = (cand_tokens == eos_id) & ~in_prompt

        # Live set: the best K candidates that did not just finish.
        alive_logprobs = jnp.where(newly_finished, cand_logprobs + NEG_INF, cand_logprobs)
        live_logprobs, keep = jax.lax.top_k(alive_logprobs, beams)
        live_seqs = _gather_beams(cand_seqs, keep)
        live_last = _gather_beams(cand_tokens, keep)
        cache = _gather_cache(cache, _gather_beams(cand_parents, keep))

        # Finished set: the best K of the old finished ones and the new ones, by penalised score.
        new_scores = cand_logprobs / brevity_penalty(alpha, step + 1)
        new_scores = jnp.where(newly_finished, new_scores, new_scores + NEG_INF)
        all_scores = jnp.concatenate([finished_scores, new_scores], axis=1)
        finished_scores, best = jax.lax.top_k(all_scores, beams)
        finished_flags = _gather_beams(jnp.concatenate([finished_flags, newly_finished], axis=1), best)
        finished_seqs = _gather_beams(jnp.concatenate([finished_seqs, cand_seqs], axis=1), best)
        return (step + 1, live_seqs, live_logprobs, live_last, finished_scores, finished_flags,
                finished_seqs, cache)

    empty_seqs = jnp.zeros((batch, beams, max_length), jnp.int32)
    state = (jnp.int32(0), empty_seqs, only_first_beam, jnp.repeat(start_tokens[:, None], beams, axis=1),
             jnp.full((batch, beams), NEG_INF, jnp.float32), jnp.zeros((batch, beams), bool), empty_seqs,
             expand_to_beams(cache, beams))
    _, live_seqs, live_logprobs, _, finished_scores, finished_flags, finished_seqs, _ = jax.lax.while_loop(
        keep_going, one_step, state)
    any_finished = jnp.any(finished_flags, axis=1)
    sequences = jnp.where(any_finished[:, None, None], finished_seqs, live_seqs)
    scores = jnp.where(any_finished[:, None], finished_scores, live_logprobs)
    return sequences, scores


__all__ = ["NEG_INF", "PAD_ID", "beam_search", "brevity_penalty", "expand_to_beams", "greedy_search", "sample",
           "split_prompts", "top_k_filter", "top_p_filter"]
