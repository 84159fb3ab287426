"""scripts/bench/profile_small_step.py's trace summary: XLA ops summed by kind, per step, from a real JAX trace and
from a synthetic one whose sums are known."""
from __future__ import annotations

import gzip
import importlib.util
import json
import os

from tests.helpers.paths import REPO


def _script():
    spec = importlib.util.spec_from_file_location(
        "profile_small_step", os.path.join(REPO, "scripts", "bench", "profile_small_step.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_op_kinds_sums_by_kind_per_step(tmp_path):
    events = [{"ph": "X", "name": "ynn_fusion.3", "dur": 1000}, {"ph": "X", "name": "ynn_fusion", "dur": 3000},
              {"ph": "X", "name": "copy_bitcast_fusion.12", "dur": 500},
              {"ph": "X", "name": "$profile_small_step.py:100 run_step", "dur": 90000},  # a Python frame
              {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 80000},          # the runtime's own spans
              {"ph": "X", "name": "Wait for usage holds", "dur": 7}, {"ph": "X", "name": "end: ynn_fusion", "dur": 1},
              {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}}]
    folder = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00"
    folder.mkdir(parents=True)
    with gzip.open(folder / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    kinds = _script().op_kinds(str(tmp_path), steps=2)
    assert list(kinds) == ["ynn_fusion", "copy_bitcast_fusion"]  # largest first, runtime spans left out
    assert kinds["ynn_fusion"] == (2.0, 1.0) and kinds["copy_bitcast_fusion"] == (0.25, 0.5)


def test_op_kinds_reads_a_real_jax_trace(tmp_path):
    import jax
    import jax.numpy as jnp

    step = jax.jit(lambda a, b: jnp.tanh(a @ b).sum())
    a = jnp.ones((256, 256))
    step(a, a).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        for _ in range(5):
            step(a, a).block_until_ready()
    script = _script()
    kinds = script.op_kinds(str(tmp_path), steps=5)
    assert any("dot" in kind or "fusion" in kind for kind in kinds), kinds  # the matmul, however XLA names it
    assert all(script.HLO_NAME.fullmatch(kind) for kind in kinds)
    assert all(ms >= 0 and count > 0 for ms, count in kinds.values())
    assert sum(count for _, count in kinds.values()) >= 1  # the matmul at least, once per call
