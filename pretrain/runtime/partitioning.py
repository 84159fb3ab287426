"""Device mesh and logical-axis sharding rules.

Models name their weight axes (`embed`, `mlp`, `heads`, `vocab`, ...); this module maps those
names onto a Mesh with axes (`data`, `fsdp`, `tensor`) and returns NamedShardings. A 1-device CPU
run, 8 fake CPU devices and a TPU pod all take this same path; only the mesh shape differs.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pretrain.runtime.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axis. Weights are sharded over `fsdp` along their embed dimension and over
# `tensor` along heads / mlp / vocab (Megatron-style); the batch is split over data x fsdp.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("embed_out", None),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("positions", None),
    ("token_types", None),
    ("classes", None),
    ("layers", None),     # the stacked axis of a scanned layer stack (models/stack.py)
)


def create_mesh(mesh_shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """`mesh_shape` gives sizes for (data, fsdp, tensor); one entry may be -1 (= the rest)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = list(mesh_shape)
    if len(shape) != len(MESH_AXES):
        raise ConfigError(f"config.mesh_shape={tuple(mesh_shape)} must have {len(MESH_AXES)} entries "
                         f"for the axes {MESH_AXES}, e.g. (-1, 1, 1)")
    if shape.count(-1) > 1:
        raise ConfigError(f"config.mesh_shape={tuple(mesh_shape)}: at most one entry may be -1")
    known = int(np.prod([s for s in shape if s != -1]))
    if -1 in shape:
        shape[shape.index(-1)] = len(devices) // known
    if int(np.prod(shape)) != len(devices):
        raise ConfigError(f"config.mesh_shape={tuple(mesh_shape)} needs {int(np.prod(shape))} devices "
                         f"but {len(devices)} are visible; use -1 for the data axis to fill it")
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """A tree of (abstract) values with nn.Partitioned boxes -> a tree of NamedShardings."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh, batch_dim: int = 0) -> NamedSharding:
    """Dimension `batch_dim` (1 under gradient accumulation) split over data x fsdp; the rest replicated."""
    return NamedSharding(mesh, P(*([None] * batch_dim), ("data", "fsdp")))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh, batch_dim: int = 0, *,
                global_batch: bool = False) -> dict[str, jax.Array]:
    """Host numpy batch -> global jax.Arrays split along `batch_dim` (1 under grad accumulation).

    By default `batch` holds this process's rows (process p of P feeds the p-th block of the global
    batch, as the streaming pipeline builds it), assembled with jax.make_array_from_process_local_data. With
    `global_batch=True` every process passes the whole batch (fine-tuning and scoring compute it
    everywhere) and each device takes its own rows of it. One process: a device_put either way.
    """
    sharding = batch_sharding(mesh, batch_dim)
    rows = jax.tree.leaves(batch)[0].shape[batch_dim]
    held = _held_batch_shards(mesh)
    shards = len(held) if global_batch else int(held.sum())
    if rows % shards:
        per_process = not global_batch and jax.process_count() > 1
        whose = " of this process's devices" if per_process else ""
        raise ConfigError(f"a batch of {rows} rows{' per process' if per_process else ''}"
                          f"{' per micro-batch' if batch_dim else ''} does not split over the {shards} batch "
                          f"shards{whose} (mesh {dict(mesh.shape)}, batch over data x fsdp): "
                          "make the batch size a multiple of it")
    if jax.process_count() == 1:
        return {k: jax.device_put(v, sharding) for k, v in batch.items()}
    if global_batch:
        return {k: jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index])
                for k, v in batch.items()}
    p, count = jax.process_index(), jax.process_count()
    block = len(held) // count
    if len(held) % count or not held[p * block:(p + 1) * block].all() or held.sum() != block:
        raise ConfigError(f"the mesh {dict(mesh.shape)} does not give each of the {count} processes its own "
                          "block of the batch (data x fsdp): use a mesh_shape whose data and fsdp axes span "
                          "the processes, e.g. (-1, 1, 1)")
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


@functools.lru_cache(maxsize=8)
def _held_batch_shards(mesh: Mesh) -> np.ndarray:
    """[data x fsdp] booleans, in the order the batch is split: does this process hold that shard?"""
    mine = np.vectorize(lambda d: d.process_index == jax.process_index(), otypes=[bool])(mesh.devices)
    return mine.any(axis=MESH_AXES.index("tensor")).reshape(-1)
