"""What ahead-of-time compilation reads and judges (pretrain/loops/aot.py compiles the loop's programs):
the TPU chips (HBM, bf16 peak, bandwidth; libtpu's compile-only devices of a slice on any host), the
FLOPs of a step counted on its jaxpr, and the verdict on a compiled step (fits, MFU).

FLOPs. XLA's cost analysis counts the body of a while loop once, whatever its trip count (checked:
a scan of 8 matmuls reports one), and both the scanned layer stack and gradient accumulation are
loops. So FLOPs are counted on the step's jaxpr instead, matmuls only (dot_general, the MFU
convention), each scan body times its length: `hardware_flops` (remat's recomputation included) and
`model_flops` = 3 x the forward pass (forward + backward, PaLM's MFU, Chowdhery et al. 2022, App. B).
XLA's `optimal_seconds` is scaled by (the jaxpr's FLOPs / the same count with every scan body once).
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from pretrain.runtime.errors import ConfigError

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
    hbm_bytes: int
    peak_bf16_flops: float  # per chip (one JAX device: v4 and v5p run their 2 TensorCores as one, megacore)
    hbm_bandwidth: float    # bytes/s per chip
    topology_prefix: str    # libtpu's name, as in "v5e:4x4"
    chip_config: str        # libtpu's chip_config_name: megacore where JAX sees one device per chip
    mxus: int | None = None  # 128 x 128 matrix units per chip (one JAX device); None: not of that size

    @property
    def clock_hz(self) -> float | None:
        """The clock the bf16 peak implies: each 128 x 128 MXU does 16,384 multiply-adds a cycle (v5e: 4 MXUs,
        1.50 GHz; v4: 2 TensorCores of 4, 1.05 GHz). libtpu's per-kernel estimates are in these cycles."""
        return self.peak_bf16_flops / (self.mxus * 128 * 128 * 2) if self.mxus else None


# Per-chip HBM, bf16 peak and HBM bandwidth, from Google Cloud's system architecture pages
# (docs.cloud.google.com/tpu/docs/v4, v5e, v5p, v6e): v4 32 GiB, 275 TFLOP/s, 1,228 GB/s; v5e 16 GiB, 197,
# 819 GB/s; v5p 95 GiB, 459, 2,765 GB/s; v6e (Trillium) 32 GiB, 918, 1,640 GB/s. MXUs per chip from the same pages
# (v4 and v5p: 2 TensorCores of 4; v5e: 4).
CHIPS = {
    "v4": Chip(32 * GIB, 275e12, 1228e9, "v4", "megacore", mxus=8),
    "v5e": Chip(16 * GIB, 197e12, 819e9, "v5e", "default", mxus=4),
    "v5p": Chip(95 * GIB, 459e12, 2765e9, "v5", "megacore", mxus=8),
    "v6e": Chip(32 * GIB, 918e12, 1640e9, "v6e", "default"),  # 256 x 256 MXUs: no clock derived here
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


def matmul_flops(jaxpr, *, loops_once: bool = False, pallas_only: bool = False) -> float:
    """FLOPs of the dot_generals of a (closed) jaxpr, sub-jaxprs included; a scan's body counts `length`
    times (once with `loops_once`, as XLA's cost analysis counts loops), a Pallas kernel's body once per grid
    point, a shard_map's once per device, a cond its costliest branch. `pallas_only`: those inside Pallas kernels
    only (custom calls, whose time libtpu does not estimate)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general" and pallas_only:
            continue
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * np.prod(eqn.outvars[0].aval.shape) * np.prod([lhs[i] for i in contract])
            continue
        subs = [v for p in eqn.params.values() for v in (p if isinstance(p, (tuple, list)) else (p,))
                if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")]
        inside = pallas_only and eqn.primitive.name != "pallas_call"
        counts = [matmul_flops(s, loops_once=loops_once, pallas_only=inside) for s in subs]
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
    model_flops: float | None = None    # 3 x forward matmul FLOPs, attention over the pairs kept: the MFU numerator
    model_flops_every_pair: float | None = None  # the same with attention over every (query, key) pair
    hardware_flops: float | None = None  # matmul FLOPs the step executes, rematerialization included
    xla_flops_per_device: float | None = None  # XLA's count (loop bodies once), all ops
    xla_optimal_seconds: float | None = None  # XLA's estimate as it comes (loop bodies once; TPU only)
    moved_bytes: int | None = None      # HBM bytes the step's kernels read and write (hlo_report), loops counted
    kernel_seconds: float | None = None  # the sum of libtpu's per-kernel estimates (hlo_report.estimated_seconds)
    roofline_seconds: float | None = None  # max(FLOPs / peak, XLA's bytes accessed x the loop ratio / bandwidth)
    step_seconds: float | None = None   # kernel_seconds where libtpu gives them; else XLA's scaled; else roofline
    step_seconds_source: str | None = None  # "kernels" | "xla" | "roofline"
    peak_flops_per_device: float | None = None
    mfu: float | None = None            # model_flops / (step_seconds x devices x peak)
    init_compile_seconds: float | None = None
    step_compile_seconds: float | None = None
    error: str | None = None            # one line: the compiler's RESOURCE_EXHAUSTED, e.g.


def out_of_memory(error: Exception) -> tuple[str, int | None]:
    """XLA's RESOURCE_EXHAUSTED -> (its first line, the bytes it says the program needs, if it says)."""
    text = str(error)
    line = next((s.strip() for s in text.splitlines() if "RESOURCE_EXHAUSTED" in s), text.splitlines()[0])
    used = re.search(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm", text)
    scale = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
    return line[:500], int(float(used.group(1)) * scale[used.group(2)]) if used else None


def judge(result: AotResult) -> AotResult:
    """Sets `fits` (both programs within hbm_bytes, and no RESOURCE_EXHAUSTED) and `mfu`, from the rest."""
    needed = [b for b in (result.total_bytes, result.init_total_bytes) if b is not None]
    result.fits = result.error is None and bool(needed) and max(needed) <= result.hbm_bytes
    result.mfu = mfu(result.model_flops, result.step_seconds, result.devices, result.peak_flops_per_device)
    return result


def mfu(model_flops: float, step_seconds: float | None, devices: int, peak_flops_per_device: float | None
        ) -> float | None:
    """Model FLOPs of a step over what `devices` chips at their peak do in `step_seconds` (None without either)."""
    if not step_seconds or not peak_flops_per_device:
        return None
    return model_flops / (step_seconds * devices * peak_flops_per_device)
