"""Discriminative fine-tuning (Howard & Ruder 2018, "Universal Language Model Fine-tuning for Text Classification",
ULMFiT, Section 3.2): each layer of the pretrained body at its own learning rate, eta^(l-1) = eta^l / factor
(config.discriminative_factor; ULMFiT's 2.6), because lower layers hold more general features that fine-tuning
should move less.

The top layer, the blocks above it (pooler, final norm: the family's `top`), shared weights (ALBERT's one layer is the
top layer too, as under gradual unfreezing) and everything outside the body (the task head, ModernBERT's pretrained
prediction head) train at the base rate; layer_i at base / factor^(num_layers - 1 - i); the embeddings at
base / factor^num_layers, one step below the lowest layer. Distances are freezing.depth_from_top's, so gradual
unfreezing thaws the blocks in the order of their rates. A scanned stack (`layers`, [n, ...]) gets one rate per slice
along its layer axis. Weights the checkpoint lacked (freezing.train_fresh's) are as new as the head: base rate.

The rates are a per-parameter scale of the optimizer's updates after it has run (`scale_updates`), which for AdamW,
Adafactor and LAMB is a per-parameter learning rate: their updates (weight decay included) are linear in it.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from models.families import body
from models.stack import LOOPED, SCANNED
from pretrain.runtime.errors import ConfigError
from pretrain.training.freezing import depth_from_top, path_names


def rate_scales(params: Any, factor: float, num_layers: int, fresh: Collection[str] = ()) -> Any:
    """params (arrays or shapes) -> the same tree of each weight's rate relative to the base: a float, or for a
    scanned stack's weights [n, ...] a float32 array [n, 1, ...] (one rate per layer). fresh: "bert/pooler/kernel"-
    style names of body weights the checkpoint lacked."""
    bodies = [key for key in params if body(key) is not None]
    if not bodies:
        raise ConfigError(f"config.discriminative_factor={factor:g} sets a rate per layer of a pretrained body, and "
                          f"this model registers none (its parameters: {', '.join(params)}); set it to 1")

    def scale(path, leaf):
        names = path_names(path)
        pretrained = body(names[0])
        if pretrained is None or "/".join(names) in fresh:
            return 1.0
        if names[1] != SCANNED:
            return float(factor ** -depth_from_top(names[1], pretrained, num_layers))
        # The stack holds the layers after the looped ones beside it (ModernBERT keeps layer 0 looped).
        first = sum(1 for key in params[names[0]] if LOOPED.match(key))
        depths = num_layers - 1 - (first + np.arange(leaf.shape[0]))
        return (factor ** -depths.astype(np.float64)).astype(np.float32).reshape((-1,) + (1,) * (len(leaf.shape) - 1))

    return jax.tree_util.tree_map_with_path(scale, params)


def scale_updates(scales: Any) -> optax.GradientTransformation:
    """Multiplies each update by its entry in `scales` (rate_scales' tree), in the update's dtype (a bfloat16 weight
    keeps bfloat16 updates); weights at the base rate pass untouched."""
    def update(updates, state, params=None):
        del params

        def scaled(u, s):
            return u if isinstance(s, float) and s == 1.0 else u * jnp.asarray(s, u.dtype)
        return jax.tree.map(scaled, updates, scales), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def describe(scales: Any) -> str:
    """One line for the log: each top-level block's rate(s), e.g. 'bert/layer_0 x0.148, ..., head x1'."""
    parts = []
    for top, subtree in scales.items():
        blocks = subtree.items() if body(top) is not None else [(None, subtree)]
        for name, block in blocks:
            rates = sorted({float(r) for leaf in jax.tree.leaves(block) for r in np.ravel(leaf)})
            label = f"{top}/{name}" if name else top
            parts.append(f"{label} x{rates[0]:.3g}" if len(rates) == 1 else f"{label} x{rates[0]:.3g}..{rates[-1]:.3g}")
    return ", ".join(parts)
