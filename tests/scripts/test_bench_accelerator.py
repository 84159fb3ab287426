"""scripts/bench/bench_gpu.sh (hence bench_accelerator.py) end to end on the CPU at the smallest shapes: both
sides of every model train, and the JSON's times, MFU and ratios hang together. Starts subprocesses (the script
runs one worker per side), hence slow. The --set settings are checked without a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scripts.bench.bench_accelerator_sides import build_config
from tests.helpers.paths import REPO


def test_bench_settings_with_a_model_prefix_reach_that_model_only():
    settings = ("bert:model.attention_dropout_rate=0.0", "t5:model.dropout_rate=0.2", "seed=7")
    bert = build_config("bert", "tiny", 2, 32, False, settings)
    t5 = build_config("t5", "tiny", 2, 32, False, settings)
    assert bert.model.attention_dropout_rate == 0.0 and bert.model.dropout_rate == 0.1
    assert t5.model.dropout_rate == 0.2
    assert bert.seed == t5.seed == 7  # unprefixed: every model
    assert build_config("t5", "tiny", 2, 32, False, ("model.attention=cudnn",)).model.attention == "cudnn"


@pytest.mark.parametrize("setting, named", [("nomodel:seed=1", "'nomodel' is no model"),
                                            ("seed", "expected KEY=VALUE")])
def test_bench_bad_setting_is_one_line(setting, named):
    with pytest.raises(SystemExit, match=named):
        build_config("bert", "tiny", 2, 32, False, (setting,))


@pytest.mark.slow
def test_bench_gpu_script_runs_on_cpu_at_tiny_sizes(tmp_path):
    cmd = ["bash", "scripts/bench/bench_gpu.sh", str(tmp_path), "--size=tiny", "--batch=2", "--seq=32", "--steps=3",
           "--warmup=1"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fused = json.loads((tmp_path / "fused.json").read_text())
    assert not fused["accelerator"] and fused["peak_flops"] > 0
    assert fused["settings"] == ["bert:model.attention_dropout_rate=0.0", "t5:model.dropout_rate=0.0"]
    assert set(fused["models"]) == {"bert", "gpt2", "t5"}
    for model, entry in fused["models"].items():
        assert set(entry["sides"]) == {"jax", "torch_eager"}, model  # no torch.compile side on a CPU
        for side, r in entry["sides"].items():
            assert len(r["times"]) == 3 and all(t > 0 for t in r["times"]), (model, side)
            assert r["median_step_s"] > 0 and r["tokens_per_s"] > 0
            assert 0 < r["mfu"] <= 1, (model, side, r["mfu"])
            assert r["peak_bytes"] is None  # CPU: not separable, printed as n/a
        ours, theirs = entry["sides"]["jax"], entry["sides"]["torch_eager"]
        assert ours["params"] == theirs["params"], model  # the same architecture on both sides
        ratio = entry["time_ratio_ours_over_torch_eager"]
        assert ratio == pytest.approx(ours["median_step_s"] / theirs["median_step_s"])
        assert f"| {model} | 2 x 32 | torch_eager |" in (tmp_path / "fused.md").read_text()
    default = json.loads((tmp_path / "default.json").read_text())
    assert set(default["models"]) == {"bert"} and default["settings"] == []
    assert all(set(e["sides"]) == {"jax"} for e in default["models"].values())
    assert "n/a" in (tmp_path / "fused.log").read_text() and "ours / theirs" in proc.stdout


def test_t5_base_row_builds_t5_base_and_takes_t5_settings():
    config = build_config("t5-base", "base", 2, 32, False, ("t5:model.dropout_rate=0.2",))
    assert (config.model.d_model, config.model.num_encoder_layers) == (768, 12)  # T5-Base, not T5-small
    assert config.model.dropout_rate == 0.2
