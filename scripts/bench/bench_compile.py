"""Compile time of the pretraining programs on this host, looped layers (before) against scanned (after).

For each model the state initializer and the train step (pretrain/loops/steps.py's, with the loop's
shardings) are lowered and compiled ahead of time by pretrain/loops/aot.py, once with
--config.model.scan_layers=False and once with True; the table gives seconds and after / before. The batch is
small (only compile time matters) and nothing runs: no memory is allocated for the state.

  python -m scripts.bench.bench_compile                    # BERT-Large, T5-Base, T5 1.1-XL, GPT-2 medium
  python -m scripts.bench.bench_compile --models=bert_large --batch_size=8
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from configs import common
from pretrain.loops.aot import compile_pretraining

MODELS = {  # name: config file and argument
    "bert_large": "configs/bert.py:size=large",
    "t5_base": "configs/t5.py:size=base",
    "t5_1.1_xl": "configs/t5.py:size=xl,version=1.1",
    "gpt2_medium": "configs/gpt2.py:size=medium",
}


def load(spec: str, **overrides):
    config = common.load(spec)  # configs/t5.py:size=base -> configs.t5.get_config("size=base")
    with config.unlocked():
        config.update_from_flattened_dict(overrides)
    return config


def measure(spec: str, batch_size: int, scan: bool) -> tuple[float, float, int]:
    """-> (initializer seconds, step seconds, parameters): trace + lower + compile of each program."""
    config = load(spec, batch_size=batch_size, grad_accum_steps=1, mesh_shape=(-1, 1, 1),
                  **{"model.scan_layers": scan})
    result = compile_pretraining(config, hbm_bytes=2 ** 60)
    return result.init_compile_seconds, result.step_compile_seconds, result.params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--batch_size", type=int, default=8)
    args = parser.parse_args()
    header = (f"{'model':<13}{'params':>15}  {'init looped':>11} {'init scanned':>12} {'ratio':>6}  "
              f"{'step looped':>11} {'step scanned':>12} {'ratio':>6}")
    print(f"compile seconds (trace + lower + compile) on {os.cpu_count()} CPU cores, batch {args.batch_size}; "
          "ratio = scanned / looped", flush=True)
    print(header, flush=True)
    start = time.perf_counter()
    for name in args.models.split(","):
        init_before, step_before, params = measure(MODELS[name], args.batch_size, scan=False)
        init_after, step_after, _ = measure(MODELS[name], args.batch_size, scan=True)
        print(f"{name:<13}{params:>15,}  {init_before:>11.1f} {init_after:>12.1f} {init_after / init_before:>6.2f}  "
              f"{step_before:>11.1f} {step_after:>12.1f} {step_after / step_before:>6.2f}", flush=True)
    print(f"total {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
