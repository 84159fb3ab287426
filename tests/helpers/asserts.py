"""Assertions several test files make: a one-line error naming what it must, two trees equal leaf for leaf."""
from __future__ import annotations

import jax
import numpy as np


def assert_one_line_error(excinfo, *needles) -> None:
    """The raised exception's message (pytest.raises' excinfo) is one line holding every needle."""
    message = str(excinfo.value)
    assert "\n" not in message, message
    for needle in needles:
        assert str(needle) in message, message


def assert_same_leaves(a, b) -> None:
    """Two pytrees (TrainStates, parameters) of the same structure, bitwise equal leaf for leaf."""
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b), (len(leaves_a), len(leaves_b))
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
