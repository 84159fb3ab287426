"""Ahead-of-time compilation of the pretraining step: will this config fit, and how fast could it run?

`compile_pretraining(config, devices, step_fn=pretrain.loops.steps.train_step)` builds what
pretrain/loops/pretraining.py builds (the model, the objective, the optimizer, the sharded state of
`train_state.init_sharded` and the jitted step with its shardings and donation) from abstract values
only: no corpus, no tokenizer file, no weights. It lowers and compiles the state initializer and the
step for a Mesh of `devices`: this host's, or a TPU slice's compile-only devices from libtpu
(`tpu_devices("v5e:4x4")`, any host), and reads XLA's per-device memory and cost analyses.

The step comes in as an argument because core sits below loops (README, Layout); callers pass the
loop's own `train_step`, so what is compiled here is what a run compiles.

FLOPs. XLA's cost analysis counts the body of a while loop once, whatever its trip count (checked:
a scan of 8 matmuls reports one), and both the scanned layer stack and gradient accumulation are
loops. So FLOPs are counted here on the step's jaxpr instead, matmuls only (dot_general, the MFU
convention), each scan body times its length: `hardware_flops` (remat's recomputation included) and
`model_flops` = 3 x the forward pass (forward + backward, PaLM's MFU, Chowdhery et al. 2022, App. B).
XLA's `optimal_seconds` is scaled by (the jaxpr's FLOPs / the same count with every scan body once).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np

import models
import objectives
from pretrain.core import optimizers, partitioning, train_state, validation
from pretrain.core.errors import ConfigError

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
    hbm_bytes: int
    peak_bf16_flops: float  # per chip (one JAX device: v4 and v5p run their 2 TensorCores as one, megacore)
    hbm_bandwidth: float    # bytes/s per chip
    topology_prefix: str    # libtpu's name, as in "v5e:4x4"
    chip_config: str        # libtpu's chip_config_name: megacore where JAX sees one device per chip


# Per-chip HBM, bf16 peak and HBM bandwidth, from Google Cloud's system architecture pages
# (docs.cloud.google.com/tpu/docs/v4, v5e, v5p, v6e): v4 32 GiB, 275 TFLOP/s, 1,228 GB/s; v5e 16 GiB, 197,
# 819 GB/s; v5p 95 GiB, 459, 2,765 GB/s; v6e (Trillium) 32 GiB, 918, 1,640 GB/s.
CHIPS = {
    "v4": Chip(32 * GIB, 275e12, 1228e9, "v4", "megacore"),
    "v5e": Chip(16 * GIB, 197e12, 819e9, "v5e", "default"),
    "v5p": Chip(95 * GIB, 459e12, 2765e9, "v5", "megacore"),
    "v6e": Chip(32 * GIB, 918e12, 1640e9, "v6e", "default"),
}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v5": "v5p", "v6": "v6e", "trillium": "v6e"}
DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p", "TPU v6 lite": "v6e",
                "TPU v6e": "v6e"}


def tpu_devices(topology: str) -> list:
    """'v5e:4x4' | 'v4:2x2x1' | 'v5p:2x2x2' | 'v6e:2x2' -> that slice's compile-only devices (needs libtpu)."""
    generation, _, shape = topology.partition(":")
    generation = ALIASES.get(generation.lower(), generation.lower())
    if generation not in CHIPS or not re.fullmatch(r"\d+(x\d+){1,2}", shape):
        raise ConfigError(f"--topology={topology!r}: use GENERATION:SHAPE with GENERATION one of "
                          f"{', '.join(CHIPS)} (v4 and v5p: 3 dimensions, e.g. v4:2x2x1; v5e, v6e: 2, e.g. v5e:4x4)")
    dims = [int(d) for d in shape.split("x")] + [1] * (3 - shape.count("x") - 1)
    chip = CHIPS[generation]
    # A host holds 2x2x1 chips (MaxText's accelerator_to_spec_map); a slice smaller than a host is one host.
    host = tuple(min(d, h) for d, h in zip(dims, (2, 2, 1)))
    from jax.experimental import topologies
    try:
        return topologies.get_topology_desc(f"{chip.topology_prefix}:{shape}", "tpu", chip_config_name=chip.chip_config,
                                            chips_per_host_bounds=host).devices
    except (RuntimeError, ValueError) as e:  # no libtpu, a shape libtpu rejects, its lock held by another process
        message, hint = str(e).splitlines()[0], ""
        if "not installed" in message:
            hint = " (install the tpu extra: pip install -e '.[tpu]', in a venv of its own)"
        elif "lockfile" in message:
            hint = " (libtpu serves one process at a time: run the compiles one after the other)"
        raise ConfigError(f"--topology={topology!r}: {message}{hint}") from None


def chip_of(device) -> Chip | None:
    return CHIPS.get(DEVICE_KINDS.get(device.device_kind, ""))


class StandInTokenizer:
    """What the objectives read of a tokenizer (ids of the specials, sentinels, the masking tables), for a
    vocabulary of `vocab_size` ids with `extra_ids` sentinels at the end: enough to build real batches."""

    pad_id, unk_id, cls_id, sep_id, mask_id, eos_id = 0, 1, 2, 3, 4, 3

    def __init__(self, vocab_size: int, extra_ids: int = 0):
        self.vocab_size, self.num_extra_ids = vocab_size, extra_ids
        self.special_ids = tuple(range(5)) + tuple(range(vocab_size - extra_ids, vocab_size))
        self.word_start = np.ones(vocab_size, bool)

    def sentinel_id(self, i: int) -> int:
        return self.vocab_size - 1 - i


def example_rows(config: ml_collections.ConfigDict, objective) -> dict[str, np.ndarray]:
    """A few rows of the batch the objective makes at config.data.max_seq_length, [n, ...] each, from
    random-token documents (16 sentences of L/4 tokens: NSP pairs, T5's 568-token chunks, GPT windows)."""
    rng = np.random.default_rng(0)
    length = config.data.max_seq_length
    high = max(6, min(1000, config.model.vocab_size - config.tokenizer.get("extra_ids", 0)))
    documents = [[rng.integers(5, high, max(8, length // 4)).astype(np.int32) for _ in range(16)] for _ in range(4)]
    rows = objective.make_batch(objective.create_instances(documents, rng, length), rng)
    if not len(next(iter(rows.values()))):
        raise ConfigError(f"the objective made no rows of length {length} from the synthetic documents")
    return rows


def abstract_batch(rows: dict[str, np.ndarray], batch_size: int, accum: int) -> dict[str, jax.ShapeDtypeStruct]:
    """-> the global batch of one step, [accum, batch_size / accum, ...] per key, as pretraining.py feeds it."""
    return {k: jax.ShapeDtypeStruct((accum, batch_size // accum, *v.shape[1:]), jax.dtypes.canonicalize_dtype(v.dtype))
            for k, v in rows.items()}


def matmul_flops(jaxpr, *, loops_once: bool = False) -> float:
    """FLOPs of the dot_generals of a (closed) jaxpr, sub-jaxprs included; a scan's body counts `length`
    times (once with `loops_once`, as XLA's cost analysis counts loops), a Pallas kernel's body once per grid
    point, a shard_map's once per device, a cond its costliest branch."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * np.prod(eqn.outvars[0].aval.shape) * np.prod([lhs[i] for i in contract])
            continue
        subs = [v for p in eqn.params.values() for v in (p if isinstance(p, (tuple, list)) else (p,))
                if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")]
        counts = [matmul_flops(s, loops_once=loops_once) for s in subs]
        if eqn.primitive.name == "cond":
            total += max(counts, default=0.0)
        else:
            total += sum(counts) * _repeats(eqn, loops_once)
    return total


def _repeats(eqn, loops_once: bool) -> int:
    """How many times an equation runs its sub-jaxpr: a scan its length; a Pallas kernel once per point of
    its grid (the body sees one block); a shard_map once per device (the body sees one device's shard)."""
    name = eqn.primitive.name
    if name == "scan":
        return 1 if loops_once else eqn.params["length"]
    if name == "pallas_call":
        return int(np.prod(eqn.params["grid_mapping"].grid))
    if name == "shard_map":
        return eqn.params["mesh"].size
    return 1


@dataclasses.dataclass
class AotResult:
    """Per-device bytes (XLA's memory analysis of the step), FLOPs per step (all devices), seconds."""

    devices: int
    device_kind: str
    mesh: dict[str, int]
    params: int
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None      # outputs written over donated arguments (the state)
    temp_bytes: int | None = None
    code_bytes: int | None = None
    total_bytes: int | None = None      # arguments + outputs - aliased + temporaries + code
    init_total_bytes: int | None = None  # the state initializer's total, the other program a run holds
    hbm_bytes: int | None = None
    fits: bool | None = None
    model_flops: float | None = None    # 3 x forward matmul FLOPs: the MFU numerator
    hardware_flops: float | None = None  # matmul FLOPs the step executes, rematerialization included
    xla_flops_per_device: float | None = None  # XLA's count (loop bodies once), all ops
    xla_optimal_seconds: float | None = None  # XLA's estimate as it comes (loop bodies once; TPU only)
    step_seconds: float | None = None   # that, scaled for loops; else the roofline of peak and HBM bandwidth
    step_seconds_source: str | None = None  # "xla" | "roofline"
    peak_flops_per_device: float | None = None
    mfu: float | None = None            # model_flops / (step_seconds x devices x peak)
    init_compile_seconds: float | None = None
    step_compile_seconds: float | None = None
    error: str | None = None            # one line: the compiler's RESOURCE_EXHAUSTED, e.g.


def _host_memory_per_device(devices: Sequence) -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // len(devices)


def _out_of_memory(error: Exception) -> tuple[str, int | None]:
    """XLA's RESOURCE_EXHAUSTED -> (its first line, the bytes it says the program needs, if it says)."""
    text = str(error)
    line = next((s.strip() for s in text.splitlines() if "RESOURCE_EXHAUSTED" in s), text.splitlines()[0])
    used = re.search(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm", text)
    scale = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
    return line[:500], int(float(used.group(1)) * scale[used.group(2)]) if used else None


def compile_pretraining(config: ml_collections.ConfigDict, devices: Sequence | None = None, *,
                        step_fn: Callable, hbm_bytes: int | None = None,
                        peak_flops: float | None = None) -> AotResult:
    """Compiles the initializer and `step_fn` (pretrain.loops.steps.train_step) of `config` for a Mesh of
    `devices` (default: this host's) shaped config.mesh_shape. `hbm_bytes` / `peak_flops` replace the
    chip table's per-device figures (defaults for a CPU: the host's memory over the devices, no peak)."""
    validation.check_ranges(config)
    validation.check_relations(config)
    devices = list(jax.devices() if devices is None else devices)
    mesh = partitioning.create_mesh(config.mesh_shape, devices)
    accum, batch_size = config.grad_accum_steps, config.batch_size
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % accum or (batch_size // accum) % shards:
        raise ConfigError(f"config.batch_size={batch_size} / config.grad_accum_steps={accum} micro-batches must "
                          f"split over the {shards} batch shards (data x fsdp) of the mesh {dict(mesh.shape)}")
    chip = chip_of(devices[0])
    result = AotResult(devices=len(devices), device_kind=devices[0].device_kind, mesh=dict(mesh.shape), params=0,
                       hbm_bytes=hbm_bytes or (chip.hbm_bytes if chip else _host_memory_per_device(devices)),
                       peak_flops_per_device=peak_flops or (chip.peak_bf16_flops if chip else None))

    # ----- What pretraining.py builds, from abstract inputs -----
    tokenizer = StandInTokenizer(config.model.vocab_size, config.tokenizer.get("extra_ids", 0))
    objective = objectives.build_objective(config.objective, tokenizer)
    rows = example_rows(config, objective)
    batch = abstract_batch(rows, batch_size, accum)                     # [accum, B / accum, ...]
    example = {k: jax.numpy.asarray(v[:1]) for k, v in objective.model_inputs(rows).items()}  # [1, ...]
    model = models.build_model(config.model)
    init_rng, _ = jax.random.split(jax.random.key(config.seed))
    tx = optimizers.make_optimizer(config.optimizer, config.num_train_steps)
    init, shardings, abstract_state = train_state.sharded_initializer(model, example, init_rng, tx, mesh)
    result.params = train_state.count_params(abstract_state.params)
    rng = jax.eval_shape(lambda: jax.random.key(0))
    schedule = optimizers.learning_rate_schedule(config.optimizer, config.num_train_steps)

    # ----- FLOPs, on the jaxprs (global shapes) -----
    def forward(params, micro_batch, dropout_rng):  # the step's loss_fn, without its gradient
        outputs = abstract_state.apply_fn({"params": params}, **objective.model_inputs(micro_batch),
                                          deterministic=False, rngs={"dropout": dropout_rng})
        return objective.loss(outputs, micro_batch)[0]
    micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), batch)
    result.model_flops = 3 * accum * matmul_flops(jax.make_jaxpr(forward)(abstract_state.params, micro, rng))

    # ----- The two programs a run compiles -----
    with mesh:
        step = train_state.jit_train_step(functools.partial(step_fn, objective=objective, schedule=schedule,
                                                            skip_nonfinite=config.skip_nonfinite_updates),
                                          shardings, mesh)
        start = time.perf_counter()
        try:
            init_memory = init.lower().compile().memory_analysis()
            result.init_total_bytes = _total(init_memory)
        except Exception as e:  # noqa: BLE001 -- XLA's JaxRuntimeError; only RESOURCE_EXHAUSTED is reported
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            result.error, result.init_total_bytes = _out_of_memory(e)
        result.init_compile_seconds = time.perf_counter() - start
        start = time.perf_counter()
        traced = step.trace(abstract_state, batch, rng)
        try:
            compiled = traced.lower().compile()
        except Exception as e:  # noqa: BLE001
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            result.error, result.total_bytes = _out_of_memory(e)
            compiled = None
        result.step_compile_seconds = time.perf_counter() - start  # trace + lower + compile
    jaxpr = traced.jaxpr
    result.hardware_flops = matmul_flops(jaxpr)

    if compiled is not None:
        _read_compiled(result, compiled, jaxpr, chip, len(devices))
    return judge(result)


def _read_compiled(result: AotResult, compiled, jaxpr, chip, num_devices: int) -> None:
    """Memory, XLA's cost estimate and the step time of a compiled step, into `result`."""
    memory = compiled.memory_analysis()
    result.argument_bytes, result.output_bytes = memory.argument_size_in_bytes, memory.output_size_in_bytes
    result.alias_bytes, result.temp_bytes = memory.alias_size_in_bytes, memory.temp_size_in_bytes
    result.code_bytes, result.total_bytes = memory.generated_code_size_in_bytes, _total(memory)
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    result.xla_flops_per_device = cost.get("flops")
    result.xla_optimal_seconds = cost.get("optimal_seconds")
    loops = result.hardware_flops / max(matmul_flops(jaxpr, loops_once=True), 1.0)  # XLA's shortfall
    if result.xla_optimal_seconds and result.xla_optimal_seconds > 0:
        result.step_seconds, result.step_seconds_source = result.xla_optimal_seconds * loops, "xla"
    elif chip and result.peak_flops_per_device and cost.get("bytes accessed"):
        # XLA's estimate can come out negative for a whole step (seen for BERT on v5e, not for any of its
        # ops alone): then the roofline of the chip's peak and HBM bandwidth, collectives left out.
        compute = result.hardware_flops / num_devices / result.peak_flops_per_device
        memory = cost["bytes accessed"] * loops / chip.hbm_bandwidth
        result.step_seconds, result.step_seconds_source = max(compute, memory), "roofline"


def judge(result: AotResult) -> AotResult:
    """Sets `fits` (both programs within hbm_bytes, and no RESOURCE_EXHAUSTED) and `mfu`, from the rest."""
    needed = [b for b in (result.total_bytes, result.init_total_bytes) if b is not None]
    result.fits = result.error is None and bool(needed) and max(needed) <= result.hbm_bytes
    result.mfu = None
    if result.step_seconds and result.peak_flops_per_device:
        result.mfu = result.model_flops / (result.step_seconds * result.devices * result.peak_flops_per_device)
    return result


def _total(memory: Any) -> int:
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes)
