"""objectives/losses.py: token_cross_entropy's accuracy is argmax's, ties (first index wins) included."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from objectives import losses


def test_accuracy_is_argmax_accuracy_ties_included():
    logits = jax.random.normal(jax.random.key(0), (3, 5, 7)).round(0)  # rounded: many ties for the peak
    logits = logits.at[0, 0].set(0.0)  # a row of ties: argmax says 0
    targets = jax.random.randint(jax.random.key(1), (3, 5), 0, 7).at[0, 0].set(0)
    weights = jnp.ones((3, 5)).at[2, 4].set(0.0)
    for row_targets in (targets, jnp.argmax(logits, -1), jnp.argmax(logits[..., ::-1], -1)):
        want = float(((jnp.argmax(logits, -1) == row_targets) * weights).sum() / weights.sum())
        got = float(losses.token_cross_entropy(logits, row_targets, weights)["accuracy"])
        assert got == want
    ties = np.asarray((logits == logits.max(-1, keepdims=True)).sum(-1))
    assert (ties > 1).sum() >= 3  # the case argmax's first index decides is exercised
