"""Ahead-of-time compilation (pretrain/loops/aot.py, pretrain/runtime/chips.py, pretrain/tools/aot_compile.py): the real
pretraining step of the tiny BERT compiled for this host's CPU, for 8 fake CPU devices, and (where libtpu is installed) for a TPU slice."""
from __future__ import annotations

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import pytest

from configs import bert, modernbert
from pretrain.loops.aot import compile_pretraining
from pretrain.runtime import chips
from tests.helpers.commands import run_module

# The tiny BERT, its vocabulary cut to 1,000 ids: small enough to compile in seconds.
OVERRIDES = {"batch_size": 8, "model.vocab_size": 1000, "mesh_shape": (-1, 1, 1)}
PREDICTIONS = 20  # configs/bert.py: max_predictions_per_seq


def tiny_config(**extra):
    config = bert.get_config("size=tiny")
    with config.unlocked():
        config.update_from_flattened_dict({**OVERRIDES, **extra})
    return config


def analytic_flops(config) -> float:
    """3 x the forward matmuls of BertForPreTraining: every token through the layers, attention scores and
    values (2 L^2 d per layer), the MLM head at the masked positions only, pooler and NSP at [CLS]."""
    m, b, length = config.model, config.batch_size, config.data.max_seq_length
    d, layers = m.hidden_size, m.num_layers
    tokens = b * length
    forward = (2 * tokens * layers * (4 * d * d + 2 * d * m.intermediate_size)
               + 2 * b * layers * 2 * length * length * d
               + 2 * b * PREDICTIONS * (d * d + d * m.vocab_size)
               + 2 * b * (d * d + 2 * d))
    return 3.0 * forward


@pytest.fixture(scope="module")
def tiny_result():
    return compile_pretraining(tiny_config(), hbm_bytes=2 ** 50)


def test_tiny_bert_compiles_for_the_cpu(tiny_result):
    r = tiny_result
    assert r.devices == len(jax.devices()) and r.mesh["data"] == r.devices
    for field in ("argument_bytes", "output_bytes", "temp_bytes", "total_bytes", "init_total_bytes"):
        assert getattr(r, field) > 0, field
    assert r.argument_bytes >= 4 * r.params  # the float32 state is an argument (optimizer moments on top)
    assert r.alias_bytes > 0                 # the donated state is written in place
    assert r.fits is True and r.error is None
    assert r.init_compile_seconds > 0 and r.step_compile_seconds > 0
    # No TPU: XLA's CPU cost analysis has no time estimate, so no step time and no MFU.
    assert r.step_seconds is None and r.mfu is None


def test_flops_match_the_analytic_count(tiny_result):
    r, config = tiny_result, tiny_config()
    assert r.model_flops == pytest.approx(analytic_flops(config), rel=0.02)
    assert r.hardware_flops == pytest.approx(r.model_flops, rel=1e-6)  # no remat: nothing recomputed
    # XLA's own count adds the elementwise work (softmax, GELU, layer norms, AdamW) to the same matmuls.
    assert r.model_flops <= r.xla_flops_per_device * r.devices <= 1.3 * r.model_flops
    # The rule of thumb 6 N T overcounts here: 1000 x 128 + 512 x 128 of the 0.6M parameters are embedding
    # tables (lookups, no FLOPs) and the MLM head sees 20 of 128 positions; attention adds 2 L^2 d per layer.
    six_n_t = 6 * r.params * config.batch_size * config.data.max_seq_length
    assert 0.5 * six_n_t < r.model_flops < six_n_t


def modernbert_config(**extra):
    config = modernbert.get_config("size=tiny")
    with config.unlocked():
        config.update_from_flattened_dict({**OVERRIDES, "model.scan_layers": True, **extra})
    return config


def modernbert_analytic_flops(config, every_pair: bool = False) -> float:
    """3 x the forward matmuls of ModernBertForMaskedLM, the convention of the jaxpr count (one implementation for
    every family): per token and layer the four attention projections (4 D^2) and the GeGLU's three D x F matmuls
    (its input projection is 2F wide); attention scores and values (2 D per (query, key) pair) over the whole row in
    the global layers and over the window |i - j| <= local_attention / 2 in the local ones (what a block-sparse
    kernel need compute; `every_pair`: the whole row there too); the head (D x D, then the tied D x V decoder) at the
    masked positions only. No pooler, no NSP."""
    m, b, length = config.model, config.batch_size, config.data.max_seq_length
    d, layers, predictions = m.hidden_size, m.num_layers, config.objective.max_predictions_per_seq
    window = m.local_attention // 2
    local_pairs = sum(min(i + window, length - 1) - max(i - window, 0) + 1 for i in range(length))
    pairs = sum(length * length if every_pair or i % m.global_attn_every_n_layers == 0 else local_pairs
                for i in range(layers))
    forward = (2 * b * length * layers * (4 * d * d + 3 * d * m.intermediate_size)
               + 2 * b * 2 * pairs * d
               + 2 * b * predictions * (d * d + d * m.vocab_size))
    return 3.0 * forward


def test_modernbert_flops_match_the_analytic_count():
    """The scanned stack (global and local layers, one traced kind flag) counted on the jaxpr of the looped layers:
    the local layers' attention over their window only, and over every pair in `model_flops_every_pair`."""
    config = modernbert_config()
    r = compile_pretraining(config, hbm_bytes=2 ** 50)
    assert r.fits is True
    assert r.model_flops == pytest.approx(modernbert_analytic_flops(config), rel=1e-6)
    assert r.model_flops_every_pair == pytest.approx(modernbert_analytic_flops(config, every_pair=True), rel=1e-6)
    assert r.model_flops < 0.99 * r.model_flops_every_pair  # the window is shorter than the row here


def test_fits_against_the_capacity(tiny_result):
    r = tiny_result
    assert chips.judge(dataclasses.replace(r, hbm_bytes=r.total_bytes - 1)).fits is False
    assert chips.judge(dataclasses.replace(r, hbm_bytes=r.total_bytes)).fits is True
    assert chips.judge(dataclasses.replace(r, error="RESOURCE_EXHAUSTED: ...")).fits is False


def test_matmul_flops_counts_every_scan_iteration_and_remat():
    n = 64

    def stacked(ws, x):  # [8, n, n], [n, n]
        return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0]
    jaxpr = jax.make_jaxpr(stacked)(jnp.zeros((8, n, n)), jnp.zeros((n, n)))
    assert chips.matmul_flops(jaxpr) == 8 * 2 * n ** 3
    assert chips.matmul_flops(jaxpr, loops_once=True) == 2 * n ** 3  # as XLA's cost analysis counts a loop

    zeros = (jnp.zeros((n, n)), jnp.zeros((n, n)))
    plain = chips.matmul_flops(jax.make_jaxpr(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w))))(*zeros))
    remat = chips.matmul_flops(jax.make_jaxpr(jax.grad(lambda w, x: jnp.sum(jax.checkpoint(  # saves nothing
        lambda w: jnp.tanh(x @ w))(w))))(*zeros))
    assert plain == 2 * 2 * n ** 3 and remat == 3 * 2 * n ** 3  # forward + dW; remat recomputes the forward


def test_matmul_flops_counts_a_pallas_grid_and_every_shard_map_device():
    """A Pallas kernel's body sees one block and a shard_map's one device: both count as many times as they run."""
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P

    from models import attention
    from tests.helpers.pallas_interpret import tpu_interpret
    batch, length, heads, head_dim = 2, 256, 2, 32
    q = jnp.ones((batch, length, heads, head_dim))
    with tpu_interpret():
        jaxpr = jax.make_jaxpr(lambda q: attention.dot_product_attention(q, q, q, None, None, scale=1.0,
                                                                         implementation="pallas"))(q)
    assert chips.matmul_flops(jaxpr) == 2 * 2 * batch * heads * length * length * head_dim  # q.k and p.v

    mesh = AbstractMesh((4,), ("x",))  # traced only: no devices needed
    n, rows = 32, 64
    sharded = jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
    jaxpr = jax.make_jaxpr(sharded)(jnp.zeros((rows, n)), jnp.zeros((n, n)))
    assert chips.matmul_flops(jaxpr) == 2 * rows * n * n  # every device's rows


def test_resource_exhausted_becomes_one_line():
    message = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
               "Used 20.50G of 15.75G hbm. Exceeded hbm capacity by 4.75G.\n\nTotal hbm usage >= 21.1G:\n ...")
    line, used = chips.out_of_memory(RuntimeError(message))
    assert line.startswith("RESOURCE_EXHAUSTED") and "\n" not in line
    assert used == int(20.5 * 2 ** 30)


def test_topology_names_are_checked():
    with pytest.raises(chips.ConfigError, match="GENERATION:SHAPE"):
        chips.tpu_devices("v9:2x2")
    with pytest.raises(chips.ConfigError, match="GENERATION:SHAPE"):
        chips.tpu_devices("v5e-16")


def _aot(*flags, devices: int = 1):
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    args = ["--config=configs/bert.py:size=tiny", *(f"--config.{k}={v}" for k, v in OVERRIDES.items()
                                                     if k != "mesh_shape"), *flags]
    proc = run_module("pretrain.tools.aot_compile", args, env=env, check=False)
    lines = proc.stdout.strip().splitlines()
    return proc, (json.loads(lines[-1]) if lines else None)


@pytest.mark.slow
def test_script_on_eight_fake_devices_fits_and_does_not_fit():
    proc, out = _aot("--mesh=2,4,1", "--hbm_gib=1000000", devices=8)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out["fits"] is True and out["devices"] == 8 and out["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
    assert out["total_bytes"] > 0 and out["model_flops"] > 0
    assert out["model_flops"] == pytest.approx(analytic_flops(tiny_config()), rel=0.02)
    proc, small = _aot("--mesh=2,4,1", "--hbm_gib=0.000001", devices=8)
    assert proc.returncode == 3 and small["fits"] is False  # EXIT_DOES_NOT_FIT, and the numbers are there
    assert small["total_bytes"] == out["total_bytes"]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_script_bad_mesh_is_one_line():
    proc, out = _aot("--mesh=3,1,1")
    assert proc.returncode == 2 and out is None
    assert "Traceback" not in proc.stderr and "mesh_shape=(3, 1, 1)" in proc.stderr


@pytest.mark.tpu
def test_tiny_bert_compiles_for_a_tpu_slice():
    """Needs libtpu (the `tpu` extra): `make test-tpu` builds a venv of its own with it and runs the tests
    marked tpu; every other target deselects them (pytest.ini)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    devices = chips.tpu_devices("v5e:2x2")
    assert len(devices) == 4 and devices[0].device_kind == "TPU v5 lite"
    config = tiny_config(**{"model.dtype": "bfloat16"})
    r = compile_pretraining(config, devices)
    assert r.fits is True and r.hbm_bytes == 16 * 2 ** 30 and 0 < r.total_bytes < 2 ** 30
    assert r.model_flops == pytest.approx(analytic_flops(config), rel=0.02)
    # libtpu's per-kernel estimates, summed: a TPU program's step time, beside the roofline it replaced
    assert r.step_seconds_source == "kernels" and r.step_seconds == r.kernel_seconds > 0 and 0 < r.mfu < 1
    assert r.roofline_seconds > 0 and r.moved_bytes > 0
    # ~120 GiB of activations on one 16 GiB chip
    huge = compile_pretraining(tiny_config(**{"batch_size": 4096 * 8, "model.dtype": "bfloat16"}), devices[:1])
    assert huge.fits is False and huge.error and "RESOURCE_EXHAUSTED" in huge.error


@pytest.mark.tpu
@pytest.mark.parametrize("prng_impl, generators", [("auto", 0), ("rbg", 1)])
def test_a_tpu_steps_dropout_bits_are_drawn_per_chip_only_by_the_hash(tmp_path, prng_impl, generators):
    """auto is the counter hash on a TPU: its bits are computed inside the kernels that use them, for each chip's
    rows; rbg's RngBitGenerator, which XLA does not partition, draws the global batch's bits on every chip."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    devices = chips.tpu_devices("v5e:2x2")
    config = tiny_config(**{"model.dtype": "bfloat16", "mesh_shape": (4, 1, 1), "prng_impl": prng_impl})
    compile_pretraining(config, devices, hlo_path=str(tmp_path / "step.hlo.txt"))
    hlo = (tmp_path / "step.hlo.txt").read_text()
    drawn = re.findall(r"u32\[(\d+),[\d,]*\]\S* rng-bit-generator", hlo)
    assert (len(drawn) > 0) == bool(generators)
    assert all(int(rows) == config.batch_size for rows in drawn)  # the whole batch, not a chip's quarter


@pytest.mark.tpu
def test_pallas_attention_compiles_for_a_tpu_slice_sharded_over_the_batch():
    """The Pallas kernel lowers for TPU only (on a CPU target XLA has no Mosaic backend), per device under
    the data-parallel mesh (models/attention.py wraps it in shard_map)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    devices = chips.tpu_devices("v5e:2x2")
    config = tiny_config(**{"model.dtype": "bfloat16", "model.attention": "pallas",
                            "model.attention_dropout_rate": 0.0, "mesh_shape": (4, 1, 1)})
    r = compile_pretraining(config, devices)
    assert r.fits is True and 0 < r.total_bytes < 2 ** 30
    assert r.model_flops == pytest.approx(analytic_flops(config), rel=0.02)


@pytest.mark.tpu
@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("kernel", ["auto", "pallas"])
def test_modernbert_compiles_for_a_tpu_slice_with_each_kernel(tmp_path, kernel, scan):
    """'auto' takes the block-sparse splash kernel on a TPU (looped: each layer's own; scanned: both, the layer's
    traced kind picks one); Pallas' flash kernel takes the local layers' window as its additive input beside the
    segment ids."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    devices = chips.tpu_devices("v5e:2x2")
    config = modernbert_config(**{"model.dtype": "bfloat16", "model.scan_layers": scan, "model.attention": kernel})
    r = compile_pretraining(config, devices, hlo_path=str(tmp_path / "step.hlo.txt"))
    assert r.fits is True and 0 < r.total_bytes < 2 ** 30
    assert r.model_flops == pytest.approx(modernbert_analytic_flops(config), rel=0.02)
    assert ("splash" in (tmp_path / "step.hlo.txt").read_text()) == (kernel == "auto")
