"""Ahead-of-time compilation of the pretraining step: will this config fit, and how fast could it run?

`compile_pretraining(config, devices)` builds the trainer a run builds (pretrain/loops/setup.py: the model,
the objective over a stand-in tokenizer, the optimizer, the sharded initializer and the jitted step with its
shardings and donation) and lowers and compiles its two programs from abstract values only: no corpus, no
tokenizer file, no weights. `devices`: this host's, or a TPU slice's compile-only devices from libtpu
(`chips.tpu_devices("v5e:4x4")`, any host). XLA's per-device memory and cost analyses are read into an
`chips.AotResult` (pretrain/runtime/chips.py: the chips, the FLOP count, the verdict).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np

from pretrain.loops import setup
from pretrain.runtime import chips, hlo_report
from pretrain.runtime.errors import ConfigError
from pretrain.training import train_state, validation


def abstract_batch(rows: dict[str, np.ndarray], batch_size: int, accum: int) -> dict[str, jax.ShapeDtypeStruct]:
    """-> the global batch of one step, [accum, batch_size / accum, ...] per key, as pretraining.py feeds it."""
    return {k: jax.ShapeDtypeStruct((accum, batch_size // accum, *v.shape[1:]), jax.dtypes.canonicalize_dtype(v.dtype))
            for k, v in rows.items()}


def compile_pretraining(config: ml_collections.ConfigDict, devices: Sequence | None = None, *,
                        hbm_bytes: int | None = None, peak_flops: float | None = None,
                        hlo_path: str | None = None) -> chips.AotResult:
    """Compiles the initializer and the train step of `config` for a Mesh of `devices` (default: this host's)
    shaped config.mesh_shape. `hbm_bytes` / `peak_flops` replace the chip table's per-device figures (defaults
    for a CPU: the host's memory over the devices, no peak). `hlo_path`: the compiled step's optimized HLO text is
    written there (pretrain/runtime/hlo_report.py reads it)."""
    validation.check_ranges(config)
    validation.check_relations(config)
    devices = list(jax.devices() if devices is None else devices)
    trainer = setup.pretraining_trainer(config, devices=devices)
    mesh, accum, batch_size = trainer.mesh, config.grad_accum_steps, config.batch_size
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % accum or (batch_size // accum) % shards:
        raise ConfigError(f"config.batch_size={batch_size} / config.grad_accum_steps={accum} micro-batches must "
                          f"split over the {shards} batch shards (data x fsdp) of the mesh {dict(mesh.shape)}")
    chip = chips.chip_of(devices[0])
    result = chips.AotResult(devices=len(devices), device_kind=devices[0].device_kind, mesh=dict(mesh.shape),
                           params=train_state.count_params(trainer.abstract_state.params),
                           hbm_bytes=hbm_bytes or (chip.hbm_bytes if chip else _host_memory_per_device(devices)),
                           peak_flops_per_device=peak_flops or (chip.peak_bf16_flops if chip else None))
    batch = abstract_batch(trainer.example_rows, batch_size, accum)  # [accum, B / accum, ...]
    rng = jax.eval_shape(lambda: trainer.dropout_rng)  # its PRNG implementation (config.prng_impl) with it
    result.model_flops, result.model_flops_every_pair = model_flops(trainer, batch_size, accum)
    with mesh:
        init, init_error, init_needed, result.init_compile_seconds = _compile(trainer.initialize.lower)
        start = time.perf_counter()
        traced = trainer.train_step.trace(trainer.abstract_state, batch, rng)
        step, step_error, step_needed, _ = _compile(traced.lower)
        result.step_compile_seconds = time.perf_counter() - start  # trace + lower + compile
    result.init_total_bytes = _total(init.memory_analysis()) if init is not None else init_needed
    result.error = step_error or init_error
    result.hardware_flops = chips.matmul_flops(traced.jaxpr)
    if step is not None:
        hlo = step.as_text()  # the optimized HLO: its kernels' bytes and estimates (and the report's file)
        _read_compiled(result, step, hlo, traced.jaxpr, chip, len(devices))
        if hlo_path:
            with open(hlo_path, "w") as f:
                f.write(hlo)
    else:
        result.total_bytes = step_needed
    return chips.judge(result)


def model_flops(trainer: setup.Trainer, batch_size: int, accum: int = 1) -> tuple[float, float]:
    """Model FLOPs of one training step of `batch_size` rows in `accum` micro-batches: 3 x the matmul FLOPs of
    the forward pass and loss (the backward pass does two matmuls for each of the forward's), counted from the
    step's own jaxpr, so every family's shapes (GeGLU's three matrices, sparse MLM prediction) count as they run.
    -> (attention counted over the (query, key) pairs its masks keep: a local layer's window, half of a causal
    score matrix, as MaxText counts since 2025; the same with attention over every pair)."""
    batch = abstract_batch(trainer.example_rows, batch_size, accum)
    rng = jax.eval_shape(lambda: trainer.dropout_rng)
    kept, every_pair = _forward_flops(trainer, batch, rng)
    return 3 * accum * kept, 3 * accum * every_pair


def _forward_flops(trainer: setup.Trainer, batch: dict[str, jax.ShapeDtypeStruct], rng) -> tuple[float, float]:
    """Matmul FLOPs of one micro-batch's forward pass and loss (the step's loss_fn, without its gradient), traced
    with looped layers and the reference attention, whatever the config says: each layer's mask is then static
    (a scanned ModernBERT layer's kind is traced) and each attention call's matmuls are its whole [L, S] product,
    from which `attention.counting_pairs` takes off what the mask drops. -> (kept, every pair)."""
    from models import attention
    model = trainer.model
    model = model.clone(config=dataclasses.replace(model.config, scan_layers=False, remat="none", attention="einsum"))
    objective = trainer.objective
    example = {k: v[:1] if hasattr(v, "shape") else v for k, v in objective.model_inputs(trainer.example_rows).items()}
    params = train_state.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), **example,
                                                                 deterministic=True)["params"]))

    def forward(params, micro_batch, dropout_rng):
        outputs = model.apply({"params": params}, **objective.model_inputs(micro_batch), deterministic=False,
                              rngs={"dropout": dropout_rng})
        return objective.loss(outputs, micro_batch)[0]
    micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), batch)
    with attention.counting_pairs() as calls:
        every_pair = chips.matmul_flops(jax.make_jaxpr(forward)(params, micro, rng))
    return every_pair - sum(full - kept for full, kept in calls), every_pair


def _compile(lower: Callable[[], Any]) -> tuple[Any, str | None, int | None, float]:
    """-> (the compiled program or None, XLA's RESOURCE_EXHAUSTED line, the bytes it says the program needs,
    seconds); any other compiler error is raised."""
    start = time.perf_counter()
    try:
        return lower().compile(), None, None, time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 -- XLA's JaxRuntimeError; only RESOURCE_EXHAUSTED is reported
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return (None, *chips.out_of_memory(e), time.perf_counter() - start)


def _read_compiled(result: chips.AotResult, compiled, hlo: str, jaxpr, chip: chips.Chip | None,
                   num_devices: int) -> None:
    """Memory, XLA's cost estimate, the HBM bytes the kernels move and the step time of a compiled step."""
    memory = compiled.memory_analysis()
    result.argument_bytes, result.output_bytes = memory.argument_size_in_bytes, memory.output_size_in_bytes
    result.alias_bytes, result.temp_bytes = memory.alias_size_in_bytes, memory.temp_size_in_bytes
    result.code_bytes, result.total_bytes = memory.generated_code_size_in_bytes, _total(memory)
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    result.xla_flops_per_device = cost.get("flops")
    result.xla_optimal_seconds = cost.get("optimal_seconds")
    kernels = hlo_report.parse(hlo)
    result.moved_bytes = sum(op.moved for op in kernels)
    if chip and chip.clock_hz:
        pallas = chips.matmul_flops(jaxpr, pallas_only=True) / num_devices / chip.peak_bf16_flops
        result.kernel_seconds = hlo_report.estimated_seconds(kernels, chip.clock_hz, chip.hbm_bandwidth, pallas)
    loops = result.hardware_flops / max(chips.matmul_flops(jaxpr, loops_once=True), 1.0)  # XLA's shortfall
    if chip and result.peak_flops_per_device and cost.get("bytes accessed"):
        # XLA counts a loop's body once: its bytes are scaled by the FLOPs' shortfall, and so is everything
        # outside the loops (the optimizer's update): optimistic about peak and overlap, pessimistic about that.
        compute = result.hardware_flops / num_devices / result.peak_flops_per_device
        result.roofline_seconds = max(compute, cost["bytes accessed"] * loops / chip.hbm_bandwidth)
    if result.kernel_seconds:
        result.step_seconds, result.step_seconds_source = result.kernel_seconds, "kernels"
    elif result.xla_optimal_seconds and result.xla_optimal_seconds > 0:
        result.step_seconds, result.step_seconds_source = result.xla_optimal_seconds * loops, "xla"
    elif result.roofline_seconds:  # XLA's whole-step estimate comes out negative for BERT on v5e
        result.step_seconds, result.step_seconds_source = result.roofline_seconds, "roofline"


def _host_memory_per_device(devices: Sequence) -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // len(devices)


def _total(memory: Any) -> int:
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes)
