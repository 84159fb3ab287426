"""scripts/bench/aot_table.py without compiling: every row's command names real config fields, the record file
resumes (newest line per row wins), and the Markdown table shows fits, misses and failures."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys

import pytest

from tests.helpers.paths import REPO


def _script():
    spec = importlib.util.spec_from_file_location("aot_table", os.path.join(REPO, "scripts", "bench", "aot_table.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_every_row_overrides_existing_config_fields():
    script = _script()
    assert len({row.name for row in script.ROWS}) == len(script.ROWS)  # the name is the record's key
    for row in script.ROWS:
        path, _, arg = row.config.partition(":")
        config = importlib.import_module(path[:-3].replace("/", ".")).get_config(arg)
        flags = [f for f in row.command() if f.startswith("--config.")]
        for flag in flags:
            keys, _, value = flag[len("--config."):].partition("=")
            node = config
            for key in keys.split("."):
                assert key in node, f"{row.name}: {flag} names no field of {row.config}"
                node = node[key]
        devices = 1
        for size in row.topology.split(":")[1].split("x"):
            devices *= int(size)
        mesh = [int(n) for n in row.mesh.split(",")]
        assert mesh[0] * mesh[1] * mesh[2] == devices, f"{row.name}: mesh {row.mesh} on {row.topology}"


def _result(fits: bool, error: str | None = None) -> dict:
    return {"grad_accum_steps": 2, "mesh": {"data": 1, "fsdp": 4, "tensor": 1}, "step_seconds": 0.5,
            "step_seconds_source": "roofline", "mfu": 0.25, "fits": fits, "error": error,
            "init_compile_seconds": 10.0, "step_compile_seconds": 100.0, "params": 60_500_000,
            "topology": "v5e:2x2", "devices": 4, "remat": "full", "total_bytes": 3 * 2 ** 30,
            "hbm_gib": 16.0, "model_flops": 13.6e12, "moved_bytes": 40 * 2 ** 30, "roofline_seconds": 0.85,
            "peak_flops_per_device": 197e12}


def test_records_resume_and_render(tmp_path):
    script = _script()
    path = tmp_path / "table.jsonl"
    lines = [{"name": "T5-Small (1.0) 128 x 512", "result": None, "failure": "Segmentation fault"},
             {"name": "T5-Small (1.0) 128 x 512", "result": _result(True), "failure": None},   # the redo wins
             {"name": "BERT-Base 256 x 128", "result": _result(False, "RESOURCE_EXHAUSTED: 20G"), "failure": None},
             {"name": "GPT-2 XL 480 x 1024", "result": None, "failure": "compile did not finish within 60 s"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = script.read_records(str(path))
    assert set(records) == {"T5-Small (1.0) 128 x 512", "BERT-Base 256 x 128", "GPT-2 XL 480 x 1024"}
    table = script.markdown(records).splitlines()
    assert len(table) == 2 + 3
    bert, t5, gpt = table[2:]  # ROWS' order: BERT, T5, GPT-2
    assert bert.startswith("| BERT-Base 256 x 128, accumulation 2 (60M) | v5e:2x2 (4), 1,4,1, full | 3.00 / 16 |")
    assert "**no**: RESOURCE_EXHAUSTED: 20G" in bert
    assert "| yes |" in t5 and "0.500 (roofline), 25.0%" in t5 and "| 10 / 100 |" in t5
    assert "| 13.6 | 0.500" in t5  # no count over every pair recorded: the model FLOPs alone
    assert "| 40.00 | 0.850, 2% |" in t5  # HBM GiB moved; the roofline beside the step estimate: 13.6 / (0.85 x 4 x 197)
    assert "failed" in gpt and "did not finish within 60 s" in gpt
    # a mask that drops attention: the model FLOPs over the pairs kept, and over every pair (with its MFU) beside
    windowed = {"ModernBERT-base 256 x 1024": {"result": {**_result(True), "model_flops_every_pair": 2 * 13.6e12}}}
    row = script.markdown(windowed).splitlines()[2]
    assert "| 13.6 (27.2) | 0.500 (roofline), 25.0% (50.0%) |" in row


def test_failure_names_the_crash_or_the_error():
    script = _script()
    crash = "WARNING: noise\nFatal Python error: Segmentation fault\n\nThread 0x1:\nExtension modules: yaml (total: 1)"
    assert script._failure(crash, -11) == "Fatal Python error: Segmentation fault (exit -11)"
    assert script._failure("I1 noise\nerror: --mesh='1,2': give three integers\n", 2).startswith("error: --mesh=")
    assert script._failure("", 1) == "no output (exit 1)"


@pytest.mark.parametrize("pattern, expected", [("modernbert-base", 6), ("T5 1.1", 2), ("", None)])
def test_rows_to_compile_filters_and_skips_recorded_rows(pattern, expected):
    script = _script()
    chosen = script.rows_to_compile(pattern, done={})
    assert len(chosen) == (len(script.ROWS) if expected is None else expected)
    assert all(pattern.lower() in row.name.lower() for row in chosen)
    done = {chosen[0].name: {}}
    assert [row.name for row in script.rows_to_compile(pattern, done)] == [row.name for row in chosen[1:]]
