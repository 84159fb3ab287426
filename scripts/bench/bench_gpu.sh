#!/usr/bin/env bash
# The GPU benchmark in one short window of GPU time: BERT-Base 256 x 128, GPT-2 small 32 x 1024, T5-small and
# T5-Base 128 x 512 (bench_accelerator.py's base sizes), ours against transformers eager and torch.compile.
#   1. fused: attention dropout off on both sides (ours runs cuDNN's flash attention, transformers SDPA);
#   2. default: BERT's paper recipe, whose attention dropout (0.1) only the reference einsum path has; ours only.
# GPT-2's and T5's configs pretrain without dropout, so their default is the fused run. Writes fused.{json,md,log} and
# default.{json,md,log} to OUTPUT_DIR. Runs from the repository with PYTHONPATH, never a pip install of the
# project: a GPU image's jax can lie outside setup.py's range. Extra options go to bench_accelerator.py
# (the test runs it on a CPU with --size=tiny).
#   scripts/bench/bench_gpu.sh OUTPUT_DIR [bench_accelerator.py options]
set -euo pipefail
out=${1:?usage: scripts/bench/bench_gpu.sh OUTPUT_DIR [bench_accelerator.py options]}
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

$py -m scripts.bench.bench_accelerator --steps=20 --set=bert:model.attention_dropout_rate=0.0 \
    --set=t5:model.dropout_rate=0.0 --output="$out/fused.json" --markdown="$out/fused.md" "$@" \
    2>&1 | tee "$out/fused.log"
$py -m scripts.bench.bench_accelerator --steps=20 --models=bert --sides=jax \
    --output="$out/default.json" --markdown="$out/default.md" "$@" 2>&1 | tee "$out/default.log"
