"""What the attention tests share (tests/models/test_attention.py, test_attention_window.py): the tolerances,
the implementations this machine runs, padded and packed layouts, the inputs, and the shapes of Pallas' cases."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Largest |fused - reference| allowed, relative to the output's scale (values are O(1) here).
TOLERANCE = {"float32": 2e-6, "bfloat16": 2e-2}
RUNNABLE = ["xla"] + (["cudnn"] if jax.default_backend() == "gpu" else [])
B, L, H, K = 3, 24, 4, 16


def layouts(length: int = L, batch: int = B) -> tuple[jax.Array, jax.Array]:
    """[B, L] padding (True = real token) and packed segment ids (0 = padding), drawn for 24 tokens, stretched."""
    at = lambda position: position * length // 24  # noqa: E731
    lengths = np.array([length, at(17), at(5)])[:batch]
    valid = jnp.asarray(np.arange(length)[None] < lengths[:, None])
    segments = np.zeros((batch, length), np.int32)
    for row, cuts in enumerate(([0, 10, 24], [0, 3, 15, 20], [0, 24])[:batch]):
        for number, (start, end) in enumerate(zip(cuts, cuts[1:]), 1):
            segments[row, at(start):at(end)] = number
    if batch > 1:
        segments[1, at(20):] = 0  # padding after the packed examples
    return valid, jnp.asarray(segments)


def attending(mask, batch: int, length: int) -> np.ndarray:
    """[B, L]: queries with at least one key (padding queries are meaningless in every implementation)."""
    if mask is None:
        return np.ones((batch, length), bool)
    return np.asarray(jnp.broadcast_to(mask, (batch, 1, length, length)).any(-1))[:, 0]


def inputs(dtype):
    q, k, v = (jax.random.normal(key, (B, L, H, K), dtype) for key in jax.random.split(jax.random.key(1), 3))
    return q, k, v


# cuDNN takes half precision only: it is compared in bfloat16
CASES = [(implementation, dtype) for implementation in RUNNABLE for dtype in TOLERANCE
         if not (implementation == "cudnn" and dtype == "float32")]


# Pallas' TPU kernel, run by its TPU interpreter on this CPU (slow: one shape, B=2, 128 tokens, 2 heads).
PB, PL, PH, PK = 2, 128, 2, 32
