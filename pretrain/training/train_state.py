"""The train state, and its one sharded initialisation shared by the pretraining and fine-tuning loops.

Parameters and optimizer state are created directly on the mesh: `jax.eval_shape` gives the abstract
state (with each weight's logical axes in its nn.Partitioned box), the partitioning rules turn those
axes into shardings, and one jit with those out_shardings materialises the state, so no device ever
holds a full copy of the weights.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from jax.sharding import Mesh

from pretrain.runtime import partitioning


class TrainState(train_state.TrainState):
    """Flax's TrainState (step, apply_fn, params, tx, opt_state); the step counts optimizer updates."""


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


def init_sharded(model: nn.Module, example_inputs: dict[str, jax.Array], rng: jax.Array,
                 tx: optax.GradientTransformation, mesh: Mesh
                 ) -> tuple[Callable[[], TrainState], TrainState, TrainState]:
    """-> (the jitted initializer, whose out_shardings place the state on the mesh; its shardings; the
    unboxed abstract state), for a model initialised from `example_inputs` ([1, ...] arrays). Called
    (under the mesh) it materialises the state; lowered, it is what ahead-of-time compilation measures; a
    run that resumes never calls it and restores into the abstract state instead."""
    init_fn = functools.partial(create_train_state, model, example_inputs, rng, tx)
    boxed_abstract = jax.eval_shape(init_fn)
    shardings = partitioning.logical_shardings(boxed_abstract, mesh)
    return jax.jit(lambda: unbox(init_fn()), out_shardings=shardings), shardings, unbox(boxed_abstract)


def jit_train_step(step: Callable, shardings: TrainState, mesh: Mesh) -> Callable:
    """step(state, batch, rng) -> (state, metrics), jitted as every loop runs it: the state on its shardings
    and donated, the batch [accum, micro_batch, ...] split over the batch axes along its second axis, the
    rng and the metrics replicated."""
    replicated = partitioning.replicated(mesh)

    def train_step(state, batch, rng):
        # The models' activation constraints (the residual stream, the logits) map by the rules onto the mesh
        # flax finds as JAX's abstract mesh; the loops' `with mesh:` does not set that one, and without it
        # flax drops every constraint silently.
        with nn.logical_axis_rules(partitioning.DEFAULT_RULES), jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return step(state, batch, rng)

    batch_sharding = partitioning.batch_sharding(mesh, batch_dim=1)
    return jax.jit(train_step, in_shardings=(shardings, batch_sharding, replicated),
                   out_shardings=(shardings, replicated), donate_argnums=(0,))
