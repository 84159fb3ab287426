"""Run by test_shard_map.py under 8 fake CPU devices: the shard_map step against the jit step, and
validation.check_mesh's verdict on meshes of these 8 devices. Prints one JSON line: the largest parameter
differences after two updates, and per mesh shape the ConfigError's message (null where the mesh is accepted)."""
from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import bert
from models.gpt import GPT, GPTConfig
from pretrain.loops.steps import shard_map_train_step, train_step
from pretrain.runtime import partitioning
from pretrain.runtime.errors import ConfigError
from pretrain.training import train_state, validation

B, L, V = 16, 12, 50


class WeightedLM:
    """Next-token cross-entropy averaged over the tokens whose weight is 1: a data-dependent count per row,
    like BERT's masked positions (weights all 1: every row counts alike, like packed causal LM)."""

    def model_inputs(self, batch):
        return {"input_ids": batch["ids"]}

    def loss(self, outputs, batch):
        ce = optax.softmax_cross_entropy_with_integer_labels(outputs["logits"][:, :-1], batch["ids"][:, 1:])
        weights = batch["weights"][:, 1:]
        loss = jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1)
        return loss, {"loss": loss, "tokens": jnp.sum(weights)}


@functools.lru_cache(maxsize=None)
def compiled(step_fn, accum: int, dropout: float):
    """(the jitted step, the initial state) for a step function, accumulation and dropout: built once, so
    the runs that differ only in their weights' values share one compilation."""
    mesh = partitioning.create_mesh((-1, 1, 1))
    model = GPT(GPTConfig(vocab_size=V, n_positions=L, d_model=16, num_layers=2, num_heads=2, d_ff=32,
                          dropout_rate=dropout, attention_dropout_rate=dropout, attention="einsum"))
    tx = optax.adamw(1e-2)
    initialize, shardings, _ = train_state.init_sharded(model, {"input_ids": jnp.ones((1, L), jnp.int32)},
                                                        jax.random.key(0), tx, mesh)
    with mesh:
        state = initialize()
    schedule = optax.constant_schedule(1e-2)
    # the reference's micro-batches of 2 rows do not split over 8 devices: it takes the batch replicated
    batch_sharding = (partitioning.batch_sharding(mesh, batch_dim=1) if B // accum % 8 == 0
                      else partitioning.replicated(mesh))
    jitted = jax.jit(functools.partial(step_fn, objective=WeightedLM(), schedule=schedule),
                     in_shardings=(shardings, batch_sharding, partitioning.replicated(mesh)),
                     out_shardings=(shardings, partitioning.replicated(mesh)))
    return jitted, state, mesh


def run(step_fn, accum: int, weights: np.ndarray, dropout: float) -> dict:
    jitted, state, mesh = compiled(step_fn, accum, dropout)
    rng = np.random.default_rng(0)
    metrics = []
    for _ in range(2):
        ids = rng.integers(0, V, (B, L)).astype(np.int32)
        batch = {k: v.reshape(accum, B // accum, L) for k, v in (("ids", ids), ("weights", weights))}
        with mesh:
            state, m = jitted(state, batch, jax.random.key(1))
        metrics.append(jax.device_get(m))
    return {"params": jax.device_get(state.params), "metrics": metrics}


def max_difference(a, b) -> float:
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(jax.tree.leaves(a),
                                                                                jax.tree.leaves(b)))


MESH_SHAPES = ((-1, 1, 1), (8, 1, 1), (-1, 2, 1), (-1, 1, 2), (2, 2, 2), (1, 8, 1))


def mesh_verdict(mode: str, shape: tuple[int, int, int]) -> str | None:
    """validation.check_mesh on the tiny BERT config with this mesh: the error's message, or None."""
    config = bert.get_config("size=tiny")
    config.mesh_mode, config.mesh_shape = mode, shape
    try:
        validation.check_mesh(config)
    except ConfigError as e:
        return str(e)
    return None


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    shard_map_step = functools.partial(shard_map_train_step, mesh=partitioning.create_mesh((-1, 1, 1)))  # one object
    uneven = (np.random.default_rng(1).random((B, L)) < np.linspace(0.2, 0.9, B)[:, None]).astype(np.int32)
    even = np.ones((B, L), np.int32)
    results = {}
    # uneven counts, dropout on: the shard_map step is the jit step with one micro-batch per device
    a, b = run(shard_map_step, 1, uneven, 0.1), run(train_step, 8, uneven, 0.1)
    results["uneven_vs_jit_accum8"] = max_difference(a["params"], b["params"])
    results["loss_uneven"] = [float(m["loss"]) for m in a["metrics"]] + [float(m["loss"]) for m in b["metrics"]]
    results["tokens"] = [float(a["metrics"][0]["tokens"]), float(b["metrics"][0]["tokens"]), float(uneven[:, 1:].sum())]
    # every row alike: also the jit step with one micro-batch
    a, b = run(shard_map_step, 1, even, 0.0), run(train_step, 1, even, 0.0)
    results["even_vs_jit_accum1"] = max_difference(a["params"], b["params"])
    # and the difference that weighting makes where counts differ (the test checks it is not tiny)
    a, b = run(shard_map_step, 1, uneven, 0.0), run(train_step, 1, uneven, 0.0)
    results["uneven_vs_jit_accum1"] = max_difference(a["params"], b["params"])
    results["check_mesh"] = {}
    for mode in ("shard_map", "jit"):
        for shape in MESH_SHAPES:
            results["check_mesh"][f"{mode} {shape}"] = mesh_verdict(mode, shape)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
