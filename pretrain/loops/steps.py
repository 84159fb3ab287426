"""The step functions shared by the pretraining and fine-tuning loops: pure, jitted once by each loop
with explicit in/out shardings. The objective (objectives/interface.py) says what the module reads
and how its outputs are scored; nothing here knows the model family."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from objectives.interface import StepObjective
from pretrain.training.train_state import TrainState

BATCH_AXES = ("data", "fsdp")  # the mesh axes that split the batch (pretrain/runtime/partitioning.py)


def micro_batches(batch: dict[str, np.ndarray], accum: int) -> dict[str, np.ndarray]:
    """[B, ...] -> [accum, B / accum, ...]: the step scans over the leading axis."""
    return {k: v.reshape(accum, v.shape[0] // accum, *v.shape[1:]) for k, v in batch.items()}


def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, *,
               objective: StepObjective, schedule: optax.Schedule,
               skip_nonfinite: bool = False) -> tuple[TrainState, dict]:
    """batch leaves are [accum, micro_batch, ...]; gradients are averaged over micro-batches.

    metrics["nonfinite"] is 1.0 when the loss or the gradients' global norm is NaN or inf (the loop
    stops there, pretrain/training/guards.py). With `skip_nonfinite` such an update is dropped: params
    and optimizer state (optax's own step counts included) stay bitwise as they were, while
    `state.step` still advances, because it counts the batches consumed: the data position, the
    dropout RNG and the logged step stay those of the loop, so a skip changes nothing but that one
    update (the schedule inside optax then runs one step behind `learning_rate`).
    """
    grads, metrics = _gradients(state, batch, jax.random.fold_in(rng, state.step), objective)
    return _update(state, grads, metrics, schedule, skip_nonfinite)


def shard_map_train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, *,
                         objective: StepObjective, schedule: optax.Schedule, mesh: Mesh,
                         skip_nonfinite: bool = False) -> tuple[TrainState, dict]:
    """The same update written per device (`config.mesh_mode="shard_map"`, the design card's "pmap"):
    every device holds the whole state, computes loss and gradients on its own rows of each micro-batch,
    and the gradients are averaged across devices with one `pmean` before the identical update everywhere.

    Devices are averaged like micro-batches: with D devices and one micro-batch this is the jit step with
    `grad_accum_steps=D` (device d plays micro-batch d, dropout included); where every row carries the same
    weight in the loss (packed causal LM) it is also the jit step with one micro-batch. The mesh must be
    data-parallel only: (data, fsdp) split the batch, tensor must be 1.
    """
    def per_device(state, batch, rng):
        accum = jax.tree.leaves(batch)[0].shape[0]
        device = jax.lax.axis_index(BATCH_AXES)
        grads, metrics = _gradients(state, batch, jax.random.fold_in(rng, state.step), objective,
                                    first_index=device * accum)
        grads = jax.lax.pmean(grads, BATCH_AXES)
        metrics = {k: jax.lax.psum(v, BATCH_AXES) if k == "tokens" else jax.lax.pmean(v, BATCH_AXES)
                   for k, v in metrics.items()}
        return _update(state, grads, metrics, schedule, skip_nonfinite)

    return jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, BATCH_AXES), P()), out_specs=(P(), P()),
                         check_vma=False)(state, batch, rng)


def _gradients(state: TrainState, batch: dict[str, jax.Array], step_rng: jax.Array, objective: StepObjective,
               first_index: jax.Array | int = 0) -> tuple[dict, dict]:
    """Gradients and metrics averaged over the micro-batches [accum, micro_batch, ...]; micro-batch i draws
    its dropout from fold_in(step_rng, first_index + i)."""
    def loss_fn(params, micro_batch, micro_rng):
        outputs = state.apply_fn({"params": params}, **objective.model_inputs(micro_batch),
                                 deterministic=False, rngs={"dropout": micro_rng})
        return objective.loss(outputs, micro_batch)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    accum = jax.tree.leaves(batch)[0].shape[0]

    def accumulate(carry, xs):
        grads_sum, metrics_sum = carry
        micro_batch, index = xs
        (_, metrics), grads = grad_fn(state.params, micro_batch, jax.random.fold_in(step_rng, first_index + index))
        return (jax.tree.map(jnp.add, grads_sum, grads), jax.tree.map(jnp.add, metrics_sum, metrics)), None

    zeros_grads = jax.tree.map(jnp.zeros_like, state.params)
    zero_metrics = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(
        lambda: loss_fn(state.params, jax.tree.map(lambda x: x[0], batch), step_rng)[1]))
    (grads, metrics), _ = jax.lax.scan(accumulate, (zeros_grads, zero_metrics),
                                       (batch, jnp.arange(accum)))
    grads = jax.tree.map(lambda g: g / accum, grads)
    metrics = {k: (v if k == "tokens" else v / accum) for k, v in metrics.items()}
    return grads, metrics


def _update(state: TrainState, grads: dict, metrics: dict, schedule: optax.Schedule,
            skip_nonfinite: bool) -> tuple[TrainState, dict]:
    metrics = dict(metrics, grad_norm=optax.global_norm(grads), learning_rate=schedule(state.step))
    nonfinite = ~(jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"]))
    metrics["nonfinite"] = nonfinite.astype(jnp.float32)
    new_state = state.apply_gradients(grads=grads)
    if skip_nonfinite:
        # lax.cond, not jnp.where: a select fused into the update would let XLA rearrange its arithmetic,
        # and finite updates would then differ in the last bit from those of a run without skipping.
        params, opt_state = jax.lax.cond(nonfinite, lambda: (state.params, state.opt_state),
                                         lambda: (new_state.params, new_state.opt_state))
        new_state = new_state.replace(params=params, opt_state=opt_state)
    return new_state, metrics


def eval_step(state: TrainState, batch: dict[str, jax.Array], *, objective: StepObjective) -> dict:
    outputs = state.apply_fn({"params": state.params}, **objective.model_inputs(batch), deterministic=True)
    return objective.loss(outputs, batch)[1]
