"""scripts/bench_accelerator.py end to end on the CPU at the smallest shapes: both sides of every model
train, and the JSON's times, MFU and ratios hang together. Starts subprocesses (the script runs one worker
per side), hence slow."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import conftest


@pytest.mark.slow
def test_bench_accelerator_cpu_smoke(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "scripts/bench_accelerator.py", "--size=tiny", "--batch=2", "--seq=32", "--steps=3",
           "--warmup=1", "--no_compile", f"--output={out}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=conftest.REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert not results["accelerator"] and results["peak_flops"] > 0
    assert set(results["models"]) == {"bert", "gpt2", "t5"}
    for model, entry in results["models"].items():
        assert set(entry["sides"]) == {"jax", "torch_eager"}, model  # no torch.compile side here
        for side, r in entry["sides"].items():
            assert len(r["times"]) == 3 and all(t > 0 for t in r["times"]), (model, side)
            assert r["median_step_s"] > 0 and r["tokens_per_s"] > 0
            assert 0 < r["mfu"] <= 1, (model, side, r["mfu"])
            assert r["peak_bytes"] is None  # CPU: not separable, printed as n/a
        ours, theirs = entry["sides"]["jax"], entry["sides"]["torch_eager"]
        assert ours["params"] == theirs["params"], model  # the same architecture on both sides
        ratio = entry["time_ratio_ours_over_torch_eager"]
        assert ratio == pytest.approx(ours["median_step_s"] / theirs["median_step_s"])
    assert "n/a" in proc.stdout and "ours / theirs" in proc.stdout
