"""config.mesh_mode="shard_map" (pretrain/loops/steps.py): the explicit per-device step equals the jit step
on 8 fake CPU devices, and the config rules around it."""
from __future__ import annotations

import json

import pytest

from configs import bert
from pretrain.core import validation
from pretrain.core.errors import ConfigError
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


def test_shard_map_needs_a_data_parallel_mesh():
    config = bert.get_config("size=tiny")
    config.mesh_mode = "shard_map"
    validation.check_mesh(config)  # one device: (1, 1, 1) is data-parallel
    config.mesh_shape = (1, 1, 1)
    config.mesh_mode = "pmap"
    with pytest.raises(ConfigError, match="config.mesh_mode='pmap' is invalid: it must be one of 'jit', 'shard_map'"):
        validation.check_ranges(config)
