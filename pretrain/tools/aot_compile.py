"""Ahead-of-time compilation of a pretraining config for a TPU slice (or this host): fits or not, per-chip
memory, FLOPs per step, XLA's step time estimate and the implied MFU, as ONE JSON line on stdout.

  python -m pretrain.tools.aot_compile --config=configs/t5.py:size=xl,version=1.1 --topology=v5e:4x4 --mesh=1,16,1 \
      --config.model.dtype=bfloat16 --config.model.scan_layers=True --config.model.remat=full
  python -m pretrain.tools.aot_compile --config=configs/bert.py:size=tiny            # this host's CPU devices

--topology: GENERATION:SHAPE of libtpu, GENERATION one of v4, v5e (alias v5litepod), v5p, v6e: v4:2x2x1
(v4-8, 4 chips), v5e:4x4 (v5litepod-16), v5p:2x2x1 (v5p-8), v6e:2x2; 'cpu' or none: this host's devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8 for 8). A TPU topology needs libtpu (pip install -e
'.[tpu]', in a venv of its own) but no TPU: JAX_PLATFORMS is set to cpu before JAX starts, so nothing is
probed. --mesh=DATA,FSDP,TENSOR sets config.mesh_shape. The step is pretrain.loops.steps.train_step with
the loop's shardings, donation and config.grad_accum_steps micro-batches; the batch comes from the
objective itself on synthetic tokens (no corpus, no tokenizer file).

Exit status: 0 fits; 3 does not fit (the JSON line says "fits": false and carries what XLA reported, e.g.
its RESOURCE_EXHAUSTED line as "error"); 2 a bad flag or config (one line on stderr).
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import dataclasses
import json
import os
import resource
import sys

from absl import flags
from ml_collections import config_flags

from pretrain.runtime import cli, compilation_cache, errors  # (none imports JAX)

EXIT_DOES_NOT_FIT = 3
_RESTARTED = "LMPRETRAIN_AOT_STACK_RAISED"  # set in the re-executed process: restart once only
_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/bert.py:size=large.",
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", "cpu", "TPU slice, e.g. v5e:4x4, v4:2x2x1, v5p:2x2x2; cpu = this host.")
_MESH = flags.DEFINE_string("mesh", "", "DATA,FSDP,TENSOR sizes (one may be -1), e.g. 1,16,1; "
                            "default: config.mesh_shape.")
_HBM_GIB = flags.DEFINE_float("hbm_gib", 0.0, "Per-device memory in GiB instead of the chip's (0 = the chip's; "
                              "on a CPU the host's memory over the devices).")
_PEAK = flags.DEFINE_float("peak_tflops", 0.0, "Per-device peak TFLOP/s instead of the chip's bf16 peak (0 = it).")
_HLO_REPORT = flags.DEFINE_string("hlo_report", "", "A directory: the compiled step's optimized HLO (step.hlo.txt) and "
                                  "what it moves (report.txt: the largest kernels, bytes per kind, bf16/f32 "
                                  "converts, copies and transposes; pretrain/runtime/hlo_report.py).")
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    # Compile seconds are part of the report: a persistent-cache hit would report a load, not a compile.
    os.environ.setdefault(compilation_cache.ENV, "off")
    if _TOPOLOGY.value.strip() not in ("", "cpu", "local"):
        _restart_with_unlimited_stack()
    cli.begin(argv)
    # Before JAX starts: a TPU topology is compiled for by libtpu's compile-only client, which needs no TPU
    # backend; with libtpu installed JAX would otherwise probe for an attached TPU (and wait for one).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no GCE metadata server to ask about the (absent) TPU VM
    with errors.one_line_errors():
        result, config = _compile()
    print(json.dumps(result, default=float), flush=True)
    if not result["fits"]:
        sys.exit(EXIT_DOES_NOT_FIT)


def _restart_with_unlimited_stack() -> None:
    """Re-executes this module with the soft stack limit at the hard one (usually unlimited). libtpu's compiler
    recursed past the usual 8 MiB and segfaulted on BERT-Base at batch 256 (batch 8 compiled); with
    `ulimit -s unlimited` it compiles. The limit has to be there when the process starts (the kernel lays out
    memory below the stack by it): raising it in the running process, or compiling on a Python thread with a
    1 GiB stack, still crashed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if soft == hard or os.environ.get(_RESTARTED):
        return
    resource.setrlimit(resource.RLIMIT_STACK, (hard, hard))
    os.environ[_RESTARTED] = "1"
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "pretrain.tools.aot_compile", *sys.argv[1:]])


def _compile() -> tuple[dict, object]:
    from pretrain.loops.aot import compile_pretraining
    from pretrain.runtime import chips
    from pretrain.runtime.errors import ConfigError
    config = _CONFIG.value
    if _MESH.value:
        try:
            shape = tuple(int(s) for s in _MESH.value.split(","))
        except ValueError:
            raise ConfigError(f"--mesh={_MESH.value!r}: give three integers DATA,FSDP,TENSOR, e.g. 1,16,1") from None
        with config.unlocked():
            config.mesh_shape = shape
    topology = _TOPOLOGY.value.strip()
    devices = None if topology in ("", "cpu", "local") else chips.tpu_devices(topology)
    hlo_path = None
    if _HLO_REPORT.value:
        os.makedirs(_HLO_REPORT.value, exist_ok=True)
        hlo_path = os.path.join(_HLO_REPORT.value, "step.hlo.txt")
    result = compile_pretraining(config, devices,
                                 hbm_bytes=int(_HBM_GIB.value * chips.GIB) or None,
                                 peak_flops=_PEAK.value * 1e12 or None, hlo_path=hlo_path)
    if hlo_path and os.path.exists(hlo_path):
        chip = chips.CHIPS.get(chips.DEVICE_KINDS.get(result.device_kind, ""))
        _write_report(hlo_path, os.path.join(_HLO_REPORT.value, "report.txt"), chip.clock_hz if chip else None)
    out = {"model": config.model.name, "topology": topology or "cpu", "batch_size": config.batch_size,
           "grad_accum_steps": config.grad_accum_steps, "seq_length": config.data.max_seq_length,
           "dtype": config.model.get("dtype"), "scan_layers": config.model.get("scan_layers"),
           "fused_qkv": config.model.get("fused_qkv"),
           "remat": config.model.get("remat"), **dataclasses.asdict(result)}
    out["total_gib"] = None if result.total_bytes is None else round(result.total_bytes / chips.GIB, 3)
    out["hbm_gib"] = round(result.hbm_bytes / chips.GIB, 3)
    return out, config


def _write_report(hlo_path: str, report_path: str, clock_hz: float | None) -> None:
    from pretrain.runtime import hlo_report
    with open(hlo_path) as f:
        report = hlo_report.summarize(hlo_report.parse(f.read()), clock_hz=clock_hz)
    with open(report_path, "w") as f:
        f.write(report + "\n")


if __name__ == "__main__":
    sys.exit(cli.run(main))
