"""Device mesh and logical-axis sharding rules.

Models name their weight axes (`embed`, `mlp`, `heads`, `vocab`, ...); this module maps those
names onto a Mesh with axes (`data`, `fsdp`, `tensor`) and returns NamedShardings. A 1-device CPU
run, 8 fake CPU devices and a TPU pod all take this same path; only the mesh shape differs.
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

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
)


def create_mesh(mesh_shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """`mesh_shape` gives sizes for (data, fsdp, tensor); one entry may be -1 (= the rest)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = list(mesh_shape)
    if len(shape) != len(MESH_AXES):
        raise ValueError(f"config.mesh_shape={tuple(mesh_shape)} must have {len(MESH_AXES)} entries "
                         f"for the axes {MESH_AXES}, e.g. (-1, 1, 1)")
    if shape.count(-1) > 1:
        raise ValueError(f"config.mesh_shape={tuple(mesh_shape)}: at most one entry may be -1")
    known = int(np.prod([s for s in shape if s != -1]))
    if -1 in shape:
        shape[shape.index(-1)] = len(devices) // known
    if int(np.prod(shape)) != len(devices):
        raise ValueError(f"config.mesh_shape={tuple(mesh_shape)} needs {int(np.prod(shape))} devices "
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


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh, batch_dim: int = 0) -> dict[str, jax.Array]:
    """Host numpy batch -> global jax.Arrays split along `batch_dim` (1 under grad accumulation).

    Single-process: device_put of the global batch. Multi-host runs would assemble the global
    array from per-host shards with jax.make_array_from_process_local_data.
    """
    sharding = batch_sharding(mesh, batch_dim)
    if jax.process_count() > 1:
        return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
    return {k: jax.device_put(v, sharding) for k, v in batch.items()}
