"""scripts/bench/bench_finetune_step.py end to end at the smallest settings: both sides train on the same padded
batches of MRPC and the table's figures hang together. Starts subprocesses (one per side), hence slow."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO


@pytest.mark.slow
def test_bench_finetune_step_times_both_sides_on_the_same_batches(tmp_path):
    output = tmp_path / "step.json"
    cmd = [sys.executable, "-m", "scripts.bench.bench_finetune_step", "--tasks", "mrpc", "--steps", "2",
           "--max_seq_length", "32", "--batch_size", "4", "--output", str(output)]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(output.read_text())["rows"]
    assert [(r["task"], r["policy"]) for r in rows] == [("mrpc", "buckets"), ("mrpc", "longest")]
    for row in rows:
        ours, hf = row["ours"], row["hf"]
        assert ours["ms_per_step"] > 0 and hf["ms_per_step"] > 0
        for key in ("padded_tokens_per_step", "real_tokens_per_step", "longest_row_tokens_per_step"):
            assert ours[key] == hf[key]  # the same token arrays on both sides
        assert ours["padded_tokens_per_step"] >= ours["longest_row_tokens_per_step"] >= ours["real_tokens_per_step"]
    buckets, longest = rows
    assert buckets["ours"]["padded_tokens_per_step"] >= longest["ours"]["padded_tokens_per_step"]
    assert "| mrpc | buckets |" in proc.stdout and "| mrpc | longest |" in proc.stdout
