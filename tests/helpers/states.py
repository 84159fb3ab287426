"""Parameter and train-state trees as tests compare them: a saved checkpoint's leaves, two runs' equality, and a
fresh tree filled from another where both have a leaf."""
from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp


def state_leaves(step_dir) -> list[np.ndarray]:
    """The train state saved in a checkpoint's step folder, as numpy leaves."""
    return [np.asarray(x) for x in jax.tree.leaves(ocp.StandardCheckpointer().restore(os.path.join(step_dir, "state")))]


def assert_same_states(step_dir, other_step_dir) -> None:
    """Two checkpoints hold the same train state, bit for bit."""
    for x, y in zip(state_leaves(step_dir), state_leaves(other_step_dir), strict=True):
        np.testing.assert_array_equal(x, y)


def with_base(params, base):
    """`params` with every leaf that `base` has at the same path taken from it (a PEFT method's own leaves stay)."""
    def take(path, leaf):
        node = base
        for key in path:
            node = node.get(key.key) if isinstance(node, dict) else None
        return leaf if node is None else node
    return jax.tree_util.tree_map_with_path(take, params)
