"""Weights & Biases as a metric writer (pretrain/workdir/wandb_run.py), in WANDB_MODE=offline: nothing leaves the
machine (the API address is a closed port), and tests/helpers/wandb_offline.py reads what the runs wrote."""
from __future__ import annotations

import json

import ml_collections
import pytest

from configs import common
from pretrain.runtime.errors import UserError
from pretrain.workdir.metric_writers import MetricWriter
from tests.helpers.commands import run_train
from tests.helpers.tiny_bert import tiny_overrides
from tests.helpers.wandb_offline import offline_runs

pytest.importorskip("wandb")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # were anything sent, it would fail


def run_config(project: str = "tests") -> ml_collections.ConfigDict:
    config = common.trainer_config()
    config.wandb.update(project=project, tags="cpu, tiny")
    return config


def test_resumed_writer_continues_the_same_run_without_resending_the_killed_runs_steps(tmp_path):
    first = MetricWriter(str(tmp_path), config=run_config())
    for step in range(1, 6):
        first.write(step, {"loss": 1.0 / step})
    first.close()  # killed after step 5, its last checkpoint at step 3
    resumed = MetricWriter(str(tmp_path), resume_step=3, config=run_config())
    for step in range(4, 8):
        resumed.write(step, {"loss": 1.0 / step})
    resumed.write(7, {"loss": 2.0}, prefix="eval")
    resumed.close()

    runs = offline_runs(str(tmp_path))
    assert len(runs) == 2 and runs[0].run_id == runs[1].run_id == json.loads(
        (tmp_path / "wandb_run.json").read_text())["id"]
    assert [h["_step"] for h in runs[0].history] == [1, 2, 3, 4, 5]
    assert [h["_step"] for h in runs[1].history] == [6, 7]  # 4 and 5 were sent before, and recomputed bitwise
    assert runs[1].history[-1]["train/loss"] == pytest.approx(1 / 7) and runs[1].history[-1]["eval/loss"] == 2.0
    assert runs[0].project == "tests" and runs[0].tags == ["cpu", "tiny"] and runs[0].name == tmp_path.name
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 7]  # metrics.jsonl: the killed run's 4 and 5 replaced


def test_writer_without_a_project_starts_no_wandb_run(tmp_path):
    writer = MetricWriter(str(tmp_path), config=run_config(project=""))
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert writer.wandb is None and not (tmp_path / "wandb").exists()


def test_wandb_without_the_library_is_a_one_line_error(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(UserError, match="pip install -e '.\\[wandb\\]'"):
        MetricWriter(str(tmp_path), config=run_config())


@pytest.mark.slow
def test_pretraining_logs_its_metrics_and_config_to_wandb(tmp_path, corpus_and_tokenizer):
    workdir = tmp_path / "run"
    run_train(workdir, tiny_overrides(*corpus_and_tokenizer, **{"wandb.project": "tiny", "wandb.name": "bert"}))
    [run] = offline_runs(str(workdir))
    assert run.project == "tiny" and run.name == "bert"
    assert run.config["model"]["hidden_size"] == 32 and run.config["num_train_steps"] == 6  # logged once
    logged = {h["_step"]: h["train/loss"] for h in run.history if "train/loss" in h}
    jsonl = {r["step"]: r["loss"] for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
             if "loss" in r}
    assert logged == pytest.approx(jsonl) and len(logged) == 6
