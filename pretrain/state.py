"""Train state, optimizers and learning-rate schedules (optax).

BERT's recipe: AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 on every weight except
LayerNorm parameters and biases), linear warmup then linear decay to zero, global-norm clipping 1.0.
"""
from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax.training import train_state


class TrainState(train_state.TrainState):
    """Flax's TrainState (step, apply_fn, params, tx, opt_state); the step counts optimizer updates."""


def learning_rate_schedule(config: ml_collections.ConfigDict, num_train_steps: int) -> optax.Schedule:
    """`warmup_linear_decay`: 0 -> peak over warmup_steps, then linear to end_learning_rate at
    num_train_steps. `constant` after warmup is also available for short experiments."""
    peak, warmup, total = config.learning_rate, config.warmup_steps, num_train_steps
    warmup_fn = optax.linear_schedule(0.0, peak, max(warmup, 1))
    if config.schedule == "warmup_linear_decay":
        after = optax.linear_schedule(peak, config.end_learning_rate, max(total - warmup, 1))
    elif config.schedule == "constant":
        after = optax.constant_schedule(peak)
    else:
        raise ValueError(f"config.optimizer.schedule={config.schedule!r} is unknown; "
                         "use 'warmup_linear_decay' or 'constant'")
    return optax.join_schedules([warmup_fn, after], [warmup])


def weight_decay_mask(params: Any) -> Any:
    """True for weights that decay: every kernel / embedding, never LayerNorm scales or biases."""
    def decays(path, _):
        # Only dict keys name parameters; nn.Partitioned boxes add a `.value` attribute step.
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return names[-1] not in ("bias", "scale")
    return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(config: ml_collections.ConfigDict, num_train_steps: int) -> optax.GradientTransformation:
    """config = config.optimizer. Clipping comes first, as in BERT (clip the raw gradient)."""
    if config.name != "adamw":
        raise ValueError(f"config.optimizer.name={config.name!r} is unknown; use 'adamw'")
    return optax.chain(
        optax.clip_by_global_norm(config.grad_clip_norm) if config.grad_clip_norm else optax.identity(),
        optax.adamw(learning_rate_schedule(config, num_train_steps), b1=config.b1, b2=config.b2, eps=config.eps,
                    weight_decay=config.weight_decay, mask=weight_decay_mask),
    )


def create_train_state(model: flax.linen.Module, example_inputs: dict[str, jax.Array],
                       rng: jax.Array, tx: optax.GradientTransformation) -> TrainState:
    """Initialise parameters and the optimizer state, both kept in nn.Partitioned boxes.

    The boxes carry each weight's logical axes; they stay on for the whole run (Flax unboxes them
    inside `apply`, optax maps through them), so the abstract state always yields its shardings.
    Called under jax.eval_shape for the abstract state, then under jit with out_shardings so that
    no full copy of the weights ever lives on one device.
    """
    variables = model.init({"params": rng, "dropout": rng}, **example_inputs, deterministic=True)
    # `tx` is built once by the caller: TrainState treats it as static pytree metadata, and the
    # abstract and concrete states must carry the very same object.
    return TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx)


def unbox(tree: Any) -> Any:
    """Strip nn.Partitioned boxes (metadata) to plain arrays."""
    return flax.core.meta.unbox(tree)


def count_params(params: Any) -> int:
    return int(sum(jnp.size(x) for x in jax.tree.leaves(unbox(params))))
