"""Sweeps: the config helpers, cells and their commands, the sweep directory's checks, the report (table,
grouping over seeds, plot), the runner on small commands, and a real local sweep of the tiny BERT
(2 learning rates x 2 seeds) killed after its first cell and resumed without running that cell again."""
from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from configs import glue
from configs.sweep_axes import chain, product, sweep, zipit
from pretrain.jobs import sweep_cells, sweep_report, sweep_runner
from pretrain.jobs.sweep_dir import SweepDir
from pretrain.runtime.errors import UserError
from tests.helpers.commands import run_module, run_train
from tests.helpers.paths import REPO, SHARED_DATA
from tests.helpers.tiny_bert import tiny_overrides


def test_product_zipit_chain():
    lr, seed = sweep("optimizer.learning_rate", [1e-4, 3e-4]), sweep("seed", [0, 1, 2])
    cells = product(lr, seed)
    assert len(cells) == 6 and cells[1] == {"optimizer.learning_rate": 1e-4, "seed": 1}  # last axis fastest
    assert zipit(sweep("a", [1, 2]), sweep("b", [3, 4])) == [{"a": 1, "b": 3}, {"a": 2, "b": 4}]
    assert chain(sweep("a", [1]), sweep("b", [2])) == [{"a": 1}, {"b": 2}]
    with pytest.raises(ValueError, match="equal length"):
        zipit(lr, seed)
    with pytest.raises(ValueError, match="same keys twice"):
        product(lr, lr)
    with pytest.raises(ValueError, match="non-empty list"):
        sweep("seed", [])


def test_glue_sweeps():
    assert len(glue.get_sweep("lr_seed")) == 4 * 3
    assert glue.get_sweep("lr_seed:2e-5,5e-5/0,1")[-1] == {"optimizer.learning_rate": 5e-5, "seed": 1}
    table = glue.get_sweep("table:mrpc,cola")
    assert len(table) == 2 * 4 * 3 and {c["arg.task"] for c in table} == {"mrpc", "cola"}
    with pytest.raises(ValueError, match="lr_seed"):
        glue.get_sweep("nope")


def test_cells_names_configs_and_commands():
    values = {"arg.task": "cola", "optimizer.learning_rate": 2e-5, "seed": 1}
    assert sweep_cells.cell_name(values) == "task=cola_learning_rate=2e-05_seed=1"
    assert sweep_cells.cell_name({"model.dropout": 0.1, "data.dropout": 0.2}) == "model.dropout=0.1_data.dropout=0.2"
    assert (sweep_cells.cell_config("configs/glue.py:task=mrpc,peft=lora", values)
            == "configs/glue.py:task=cola,peft=lora")
    (cell,) = sweep_cells.build_cells("configs/glue.py:task=mrpc", [values], "finetune",
                                      ["--config.init=/m", "--config.seed=7"], "/runs/s")
    assert cell.config == "configs/glue.py:task=cola"
    assert cell.command[1:] == ("-m", "pretrain.finetune", "--config=configs/glue.py:task=cola",
                                f"--workdir=/runs/s/{cell.name}", "--config.init=/m", "--config.seed=7",
                                "--config.optimizer.learning_rate=2e-05", "--config.seed=1")  # the cell's seed wins
    launch = sweep_cells.launch_prefix("tpu:my-v4", "--zone=us-central2-b")
    (remote,) = sweep_cells.build_cells("configs/bert.py", [{"seed": 0}], "train", [], "/gcs/b/s/", launch)
    assert remote.command[:7] == (sys.executable, "-m", "pretrain.launch", "run", "--name=my-v4",
                                  "--zone=us-central2-b", "--")
    assert remote.command[7:10] == ("python3", "-m", "pretrain.train") and "--workdir=/gcs/b/s/seed=0" in remote.command
    with pytest.raises(UserError, match="tpu:NAME"):
        sweep_cells.launch_prefix("gpu:x", "")


def test_load_cells_errors(tmp_path):
    assert len(sweep_cells.load_cells("configs/glue.py:task=mrpc", "lr_seed:1e-4/0,1")) == 2
    with pytest.raises(UserError, match="defines no get_sweep"):
        sweep_cells.load_cells("configs/bert.py:size=tiny", "x")
    with pytest.raises(UserError, match="no file"):
        sweep_cells.load_cells(str(tmp_path / "none.py"), "x")
    with pytest.raises(UserError, match="--sweep=bad"):
        sweep_cells.load_cells("configs/glue.py", "bad")
    repeated = tmp_path / "rep.py"
    repeated.write_text("def get_sweep(arg):\n    return [{'seed': 0}, {'seed': 0}]\n")
    with pytest.raises(UserError, match="repeats a cell"):
        sweep_cells.load_cells(str(repeated), "")


def test_sweep_dir_claims_its_settings_and_counts_only_clean_exits(tmp_path):
    sweep_dir = SweepDir(str(tmp_path))
    spec = {"config": "configs/glue.py", "entry_point": "finetune", "shared_flags": ["--config.init=/a"],
            "run_root": str(tmp_path), "launch": None, "cells": [{"seed": 0}]}
    sweep_dir.claim(spec)
    sweep_dir.claim({**spec, "cells": [{"seed": 0}, {"seed": 1}]})  # a sweep may grow
    before = (tmp_path / "sweep.json").read_text()
    with pytest.raises(UserError, match="other shared_flags"):
        sweep_dir.claim({**spec, "shared_flags": ["--config.init=/b"]})
    assert (tmp_path / "sweep.json").read_text() == before  # the refused command changed nothing
    (cell,) = sweep_cells.build_cells("configs/glue.py", [{"seed": 0}], "finetune", [], str(tmp_path))
    assert sweep_dir.outcome(cell) is None
    sweep_dir.record(cell, 1, 5.0)
    assert sweep_dir.outcome(cell) is None  # a failed run is not done
    sweep_dir.record(cell, 0, 5.0)
    assert sweep_dir.outcome(cell)["wall_sec"] == 5.0


@pytest.mark.parametrize("run_file", ["config.json", "results.json", "checkpoints"])
def test_a_runs_workdir_is_refused_as_a_sweep_directory_and_left_as_it_was(tmp_path, run_file):
    (tmp_path / run_file).mkdir() if run_file == "checkpoints" else (tmp_path / run_file).write_text("{}")
    before = sorted(os.listdir(tmp_path))
    spec = {"config": "configs/glue.py", "entry_point": "finetune", "shared_flags": [], "run_root": str(tmp_path),
            "launch": None, "cells": [{"seed": 0}]}
    with pytest.raises(UserError, match=f"is a run's workdir \\(it holds {run_file}\\), not a sweep's"):
        SweepDir(str(tmp_path)).claim(spec)
    assert sorted(os.listdir(tmp_path)) == before  # no logs/, no sweep.json


def test_report_reads_runs_groups_seeds_and_plots(tmp_path):
    cells = sweep_cells.build_cells("configs/glue.py", product(sweep("optimizer.learning_rate", [1e-5, 1e-4]),
                                                               sweep("seed", [0, 1])), "finetune", [], str(tmp_path))
    sweep_dir = SweepDir(str(tmp_path))
    os.makedirs(tmp_path / "logs")
    scores = [0.5, 0.7, 0.8, 0.9]
    for cell, score in zip(cells[:3], scores):  # the last cell has not run
        os.makedirs(tmp_path / cell.name)
        (tmp_path / cell.name / "results.json").write_text(json.dumps(
            {"best_score": score, "metrics": {"dev": {"f1": score, "accuracy": score - 0.1}}, "task": "mrpc"}))
        sweep_dir.record(cell, 0, 10.0)
    rows, key = sweep_report.collect(sweep_dir, cells, str(tmp_path), "finetune", "f1")
    assert key == "metrics.dev.f1" and [r[key] for r in rows][:3] == scores[:3] and math.isnan(rows[3][key])
    assert [r["status"] for r in rows] == ["done"] * 3 + ["not done"]
    with pytest.raises(UserError, match="no finished cell"):
        sweep_report.metric_key([{"best_score": 1.0}], "loss")
    text = sweep_report.markdown(rows, sweep_report.swept_keys(cells), key)
    assert "| 1e-05 | 0.6 ± 0.14 | 2 |" in text and "| 0.0001 | 0.8 ± 0 | 1 |" in text
    paths = sweep_report.write_report(sweep_dir, rows, sweep_report.swept_keys(cells), key, "t")
    assert pathlib.Path(paths["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(pathlib.Path(paths["csv"]).read_text().splitlines()) == 5
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n{"step": 2, "eval_loss": 2.5}\n'
                                                  '{"step": 3, "loss": 2.0}\n')
    assert sweep_report.run_metrics(str(tmp_path / "p"), "train") == {"loss": 2.0, "eval_loss": 2.5}


@pytest.mark.slow
def test_runner_parallel_failures_and_resume(tmp_path):
    """Small python commands as cells: two at a time, a failing cell is reported and left to run again,
    and a second pass runs only that one."""
    sweep_dir = SweepDir(str(tmp_path))
    os.makedirs(tmp_path / "logs")
    marker = tmp_path / "ran.txt"
    code = ("import sys, time; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); time.sleep(0.3); "
            "sys.exit(int(sys.argv[3]))")
    cells = [sweep_cells.Cell(f"c{i}", {"i": i}, "",
                              (sys.executable, "-c", code, str(marker), f"c{i}", str(int(i == 2)))) for i in range(4)]
    lines = []
    statuses = sweep_runner.run_cells(sweep_dir, cells, parallel=2, say=lines.append)
    assert statuses == {"c0": 0, "c1": 0, "c2": 1, "c3": 0}
    assert any("c2: FAILED (exit 1)" in line for line in lines)
    fixed = [c if c.name != "c2" else sweep_cells.Cell("c2", {"i": 2}, "", c.command[:-1] + ("0",)) for c in cells]
    statuses = sweep_runner.run_cells(sweep_dir, fixed, parallel=2, say=lines.append)
    assert statuses == {"c2": 0}
    assert sorted(marker.read_text().split()) == ["c0", "c1", "c2", "c2", "c3"]


def _children(pid: int) -> list[int]:
    path = f"/proc/{pid}/task/{pid}/children"
    return [int(p) for p in pathlib.Path(path).read_text().split()] if os.path.exists(path) else []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_local_sweep_of_tiny_bert_resumes_after_a_kill(tmp_path, corpus_and_tokenizer):
    corpus, spm = corpus_and_tokenizer
    pre = tmp_path / "pretrain"
    run_train(pre, tiny_overrides(corpus, spm))
    workdir = tmp_path / "sweep"
    args = ["--config=configs/glue.py:task=wnli", "--sweep=lr_seed:1e-4,1e-3/0,1", f"--workdir={workdir}",
            f"--config.init={pre}", f"--config.data.glue_dir={os.path.join(SHARED_DATA, 'glue')}",
            "--config.data.max_train_examples=32", "--config.num_epochs=1", "--config.batch_size=16",
            "--config.data.max_seq_length=32", "--config.write_test_predictions=False", "--parallel=2",
            "--metric=accuracy"]
    sweep_proc = subprocess.Popen([sys.executable, "-m", "pretrain.sweep", *args], cwd=REPO,
                                  env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    outcomes, deadline = workdir / "logs", time.time() + 400
    while time.time() < deadline and not (outcomes.exists() and any(p.suffix == ".json" for p in outcomes.iterdir())):
        time.sleep(0.5)
    children = _children(sweep_proc.pid)
    sweep_proc.send_signal(signal.SIGKILL)  # no chance to stop its cells: they get SIGTERM from the kernel
    sweep_proc.wait()
    finished = {p.stem: p.stat().st_mtime_ns for p in outcomes.iterdir() if p.suffix == ".json"}
    assert 1 <= len(finished) < 4, finished
    deadline = time.time() + 120
    while time.time() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.5)
    assert not any(_alive(pid) for pid in children)  # no orphan keeps writing into a cell's workdir

    out = run_module("pretrain.sweep", args).stdout
    for name in finished:
        assert f"{name}: done before, skipped" in out
        assert (outcomes / f"{name}.json").stat().st_mtime_ns == finished[name]  # not run again
    assert out.count(": done in ") == 4 - len(finished)
    rows = (workdir / "results.csv").read_text().splitlines()
    assert len(rows) == 5 and all(",done" in row for row in rows[1:])
    assert "mean ± std of metrics.dev.accuracy over seeds" in (workdir / "results.md").read_text()
    assert (workdir / "metrics_dev_accuracy.png").read_bytes()[:4] == b"\x89PNG"
