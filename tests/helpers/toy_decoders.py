"""Toy models for models/decoding.py, driving its routines through `tokens_to_logits(ids [B, 1], cache, step)`,
and the plain-Python loops and brute force that give their answers (tests/models/test_decoding.py,
test_beam_search.py):
- a Markov chain: logits depend only on the fed token, through a [V, V] table;
- a history model: logits depend on the whole prefix, read back from cache leaves of several
  shapes ([B] hash, [B, L] token history, [B, 2, V] counts, a scalar) -- if beam search gathered
  any leaf from the wrong beam, its scores would stop matching brute-force enumeration.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def markov_model(table: np.ndarray):
    """logits = table[fed token]; the cache only counts calls per row."""
    table = jnp.asarray(table, jnp.float32)

    def tokens_to_logits(ids, cache, step):
        return table[ids[:, 0]], {"calls": cache["calls"] + 1}
    return tokens_to_logits


def markov_cache(batch: int) -> dict:
    return {"calls": jnp.zeros((batch,), jnp.int32)}


HASH_MOD = 7


class HistoryModel:
    """logits(prefix) = A[hash(prefix)] + Bm[token fed one step earlier] + 0.5 * (even - odd counts) @ C."""

    def __init__(self, vocab: int, max_length: int, seed: int):
        rng = np.random.default_rng(seed)
        self.vocab, self.max_length = vocab, max_length
        self.a = rng.normal(size=(HASH_MOD, vocab)).astype(np.float32) * 1.5
        self.b = rng.normal(size=(vocab, vocab)).astype(np.float32)
        self.c = rng.normal(size=(vocab, vocab)).astype(np.float32)

    def reference_logits(self, fed: list[int]) -> np.ndarray:
        """fed = [start, t_0, ..., t_{i-1}] -> logits of t_i, in numpy."""
        h = 0
        counts = np.zeros((2, self.vocab), np.float32)
        for position, token in enumerate(fed):
            h = (h * 3 + token + 1) % HASH_MOD
            counts[position % 2, token] += 1
        earlier = fed[-2] if len(fed) > 1 else fed[-1]
        return self.a[h] + self.b[earlier] + 0.5 * (counts[0] - counts[1]) @ self.c

    def init_cache(self, batch: int) -> dict:
        return {"hash": jnp.zeros((batch,), jnp.int32),
                "history": jnp.zeros((batch, self.max_length + 1), jnp.int32),
                "counts": jnp.zeros((batch, 2, self.vocab), jnp.float32),
                "calls": jnp.int32(0)}

    def __call__(self, ids, cache, step):
        token = ids[:, 0]
        hash_ = (cache["hash"] * 3 + token + 1) % HASH_MOD
        history = cache["history"].at[:, step].set(token)
        counts = cache["counts"].at[:, step % 2].add(jax.nn.one_hot(token, self.vocab))
        earlier = history[:, jnp.maximum(step - 1, 0)]
        logits = (jnp.asarray(self.a)[hash_] + jnp.asarray(self.b)[earlier]
                  + 0.5 * (counts[:, 0] - counts[:, 1]) @ jnp.asarray(self.c))
        return logits, {"hash": hash_, "history": history, "counts": counts, "calls": cache["calls"] + 1}


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - np.log(np.sum(np.exp(x - x.max()))) - x.max()


def softmax(x: np.ndarray) -> np.ndarray:
    return np.exp(log_softmax(x))


def python_greedy(logits_of, start: int, max_length: int, eos: int | None, prompt=()) -> list[int]:
    """logits_of(fed tokens) -> [V]; the obvious loop, with forced prompt positions."""
    fed, out = [start], []
    for i in range(max_length):
        token = prompt[i] if i < len(prompt) else int(np.argmax(logits_of(fed)))
        out.append(token)
        fed.append(token)
        if token == eos and i >= len(prompt):
            break
    return out + [0] * (max_length - len(out))


def brute_force_beams(logits_of, start: int, vocab: int, max_length: int, eos: int, alpha: float,
                      prompt=()) -> list[tuple[float, list[int]]]:
    """Every sequence that ends at EOS within max_length, scored log p / ((5 + n) / 6) ** alpha, best first.

    Forced prompt tokens add 0 to log p (t5x's prompt forcing) but count in the length n.
    """
    finished = []

    def extend(seq: list[int], logprob: float):
        step = len(seq)
        if step == max_length:
            return
        if step < len(prompt):
            extend(seq + [prompt[step]], logprob)
            return
        logprobs = log_softmax(logits_of([start] + seq))
        for token in range(vocab):
            if token == eos:
                finished.append((float((logprob + logprobs[token]) / ((5 + step + 1) / 6) ** alpha),
                                 seq + [token] + [0] * (max_length - step - 1)))
            else:
                extend(seq + [token], logprob + logprobs[token])
    extend([], 0.0)
    return sorted(finished, key=lambda x: -x[0])


def markov_logits_of(table):
    return lambda fed: table[fed[-1]]


def jit_call(fn, *args, **static):
    """Runs a decoding routine under jax.jit (arrays traced, the rest static)."""
    return jax.jit(lambda *a: fn(*a, **static))(*args)
