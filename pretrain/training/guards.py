"""The non-finite guard shared by the pretraining and fine-tuning loops.

`steps.train_step` reports `nonfinite` (1.0 when the loss or the gradient norm is NaN or inf). One
such update turns every weight into NaN, and every later checkpoint with it, so the loops call
`check_finite` on each step's metrics before they log them and before every checkpoint save: the
run stops with one line while the latest checkpoint is still a good one. With
`config.skip_nonfinite_updates` the step has already left the weights untouched and the loop only
counts it. `check_params_finite` runs before every save: no checkpoint ever holds a NaN or an
infinity, so checkpoint rotation can never delete the last finite one.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from pretrain.runtime.errors import UserError


class NonFiniteError(UserError):
    """A step whose loss or gradient is not finite, with skipping off (one-line message)."""

    def __init__(self, step: int, loss: float, grad_norm: float | None):
        self.step, self.loss, self.grad_norm = step, loss, grad_norm
        norm = "" if grad_norm is None else f", gradient norm {grad_norm}"
        super().__init__(f"the update of step {step} is not finite (loss {loss}{norm}) and no checkpoint holds it: "
                         "lower the learning rate (--config.optimizer.learning_rate) or skip such updates with "
                         "--config.skip_nonfinite_updates=true")


def is_nonfinite(metrics: Mapping[str, Any]) -> bool:
    """From train_step's `nonfinite` flag, or from the loss and gradient norm of a step without it."""
    if "nonfinite" in metrics:
        return bool(float(metrics["nonfinite"]))
    return not all(math.isfinite(float(metrics[k])) for k in ("loss", "grad_norm") if k in metrics)


def check_finite(step: int, metrics: Mapping[str, Any], skip: bool) -> bool:
    """-> True when the update that made `step` was non-finite and skipped (train_step with
    skip_nonfinite=True left params and optimizer state as they were), False when it was finite.
    Raises NonFiniteError for a non-finite step when not skipping. `metrics`: host values."""
    if not is_nonfinite(metrics):
        return False
    if skip:
        return True
    grad_norm = float(metrics["grad_norm"]) if "grad_norm" in metrics else None
    raise NonFiniteError(step, float(metrics.get("loss", float("nan"))), grad_norm)


class NonFiniteParamsError(UserError):
    """Parameters that are not finite at a save (one-line message): the checkpoint is not written."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"the parameters after step {step} are not finite, so they were not saved (the latest "
                         "checkpoint is still a good one): lower the learning rate (--config.optimizer.learning_rate)")


@jax.jit
def _all_finite(tree: Any) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def check_params_finite(step: int, params: Any) -> None:
    """Before every save: a finite loss and gradient do not make finite parameters when the update itself
    overflows (a learning rate of 1e9), and such a checkpoint must never become the latest."""
    if not bool(_all_finite(params)):
        raise NonFiniteParamsError(step)
