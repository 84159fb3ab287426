"""config.mesh_mode="shard_map" (pretrain/loops/steps.py): the explicit per-device step equals the jit step
on 8 fake CPU devices, and the config rules around it."""
from __future__ import annotations

import json

import jax
import pytest

from configs import bert
from pretrain.runtime import partitioning
from pretrain.runtime.errors import ConfigError
from pretrain.training import validation
from tests.helpers.commands import run_module

TOLERANCE = 1e-5  # float32, two Adam updates: only the order of the cross-device sums differs


@pytest.mark.slow
def test_the_shard_map_step_equals_the_jit_step_on_8_devices():
    proc = run_module("tests.pretrain.loops.shard_map_check", [],
                      env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # rows with different numbers of scored tokens, dropout on: one micro-batch per device
    assert result["uneven_vs_jit_accum8"] < TOLERANCE
    assert result["loss_uneven"][:2] == pytest.approx(result["loss_uneven"][2:], abs=1e-6)
    assert result["tokens"][0] == result["tokens"][1] == result["tokens"][2]  # summed over devices, not averaged
    # every row alike: the same as the jit step without accumulation
    assert result["even_vs_jit_accum1"] < TOLERANCE
    # where counts differ, averaging devices is not averaging tokens: the comparison above can fail
    assert result["uneven_vs_jit_accum1"] > 100 * TOLERANCE
    # the config rule on 8 real devices: shard_map only on a data-parallel mesh; jit on any
    verdicts = result["check_mesh"]
    assert verdicts["shard_map (-1, 1, 1)"] is None and verdicts["shard_map (8, 1, 1)"] is None
    for shape in ("(-1, 2, 1)", "(-1, 1, 2)", "(2, 2, 2)", "(1, 8, 1)"):
        assert verdicts[f"shard_map {shape}"] == SHARDED.format(shape=shape)
    jit = [verdict for key, verdict in verdicts.items() if key.startswith("jit ")]
    assert len(jit) == 6 and jit == [None] * 6


SHARDED = ("config.mesh_mode='shard_map' replicates the state on every device, but config.mesh_shape={shape} "
           "shards it: use --config.mesh_shape=-1,1,1 or mesh_mode=jit")


def test_shard_map_needs_a_data_parallel_mesh(monkeypatch):
    config = bert.get_config("size=tiny")
    config.mesh_mode = "shard_map"
    validation.check_mesh(config)  # one device: (1, 1, 1) is data-parallel
    # This process as one that sees 8 devices (its one CPU device, 8 times over): partitioning.create_mesh builds
    # its (data, fsdp, tensor) mesh of them, whose shape is all that check_mesh reads. The slow test above
    # checks the same rule on 8 real (fake CPU) devices.
    monkeypatch.setattr(jax, "devices", lambda *args, **kwargs: [jax.local_devices()[0]] * 8)
    for shape in ((-1, 1, 1), (8, 1, 1)):
        config.mesh_mode, config.mesh_shape = "shard_map", shape
        validation.check_mesh(config)
    assert dict(partitioning.create_mesh((-1, 1, 1)).shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    for shape in ((-1, 2, 1), (-1, 1, 2), (2, 2, 2), (1, 8, 1), (4, 1, 2)):
        mesh = partitioning.create_mesh(shape)
        assert mesh.devices.size == 8 and (mesh.shape["fsdp"], mesh.shape["tensor"]) != (1, 1)  # really sharded
        config.mesh_mode, config.mesh_shape = "shard_map", shape
        with pytest.raises(ConfigError) as e:
            validation.check_mesh(config)
        assert str(e.value) == SHARDED.format(shape=shape)
        config.mesh_mode = "jit"  # XLA (GSPMD) partitions the step over any mesh
        validation.check_mesh(config)
    config.mesh_shape = (1, 1, 1)
    config.mesh_mode = "pmap"
    with pytest.raises(ConfigError, match="config.mesh_mode='pmap' is invalid: it must be one of 'jit', 'shard_map'"):
        validation.check_ranges(config)
