"""The reproductions' harness: each arm's pretraining is a pretrain.train run of its config and settings, with --minutes
fitted to that budget (config.budget_minutes), and fine-tuning starts from its workdir; --ledger keeps the finished
runs for another machine."""
from __future__ import annotations

import argparse
import sys

from pretrain.jobs.sweep_cells import Cell
from scripts.bench import bench_ledger
from scripts.reproduce import reproduction as rp

FLAGS = ["--config.data.path=/c/corpus.txt", "--config.tokenizer.path=/c/spm.model", "--config.num_train_steps=300",
         "--config.data.source=text", "--config.objective.mode=prefix_lm"]


def harness(tmp_path, minutes: float) -> rp.Reproduction:
    args = argparse.Namespace(output=str(tmp_path / f"out{minutes:g}"), parallel=2, minutes=minutes)
    return rp.Reproduction(args, ["steps=300"])


def test_budget_arm_is_a_pretrain_train_run_fitted_to_the_minutes(tmp_path):
    run = harness(tmp_path, 0.5)
    cell = run.pretrain_cell("prefix_lm", "configs/t5.py:size=tiny", FLAGS)
    assert list(cell.command[1:5]) == ["-m", "pretrain.train", "--config=configs/t5.py:size=tiny",
                                       f"--workdir={run.workdir('pretrain_prefix_lm')}"]
    assert list(cell.command[5:]) == FLAGS + ["--config.budget_minutes=0.5"]  # the step count: the schedule's shape
    assert run.pretrained(cell) == run.workdir("pretrain_prefix_lm")
    assert run.pretraining_text(300) == "0.5 minutes of pretraining per arm"


def test_step_arm_is_a_pretrain_train_run_with_the_flags(tmp_path):
    run = harness(tmp_path, 0.0)
    cell = run.pretrain_cell("nsp", "configs/bert.py:size=tiny,nsp=True", FLAGS)
    assert list(cell.command[1:5]) == ["-m", "pretrain.train", "--config=configs/bert.py:size=tiny,nsp=True",
                                       f"--workdir={run.workdir('pretrain_nsp')}"]
    assert list(cell.command[5:]) == FLAGS
    assert run.pretrained(cell) == run.workdir("pretrain_nsp")
    assert run.pretraining_text(300) == "300 pretraining steps"


# A fine-tuning run in miniature: writes results.json (a dev score, the init it read) into its workdir.
FAKE_FINETUNE = ("import json, os, sys; os.makedirs(sys.argv[1], exist_ok=True); "
                 "json.dump({'metrics': {'dev': {'accuracy': 0.75}}, 'init': sys.argv[2]}, "
                 "open(os.path.join(sys.argv[1], 'results.json'), 'w'))")


def machine_with_ledger(root, ledger: str, init_name: str) -> tuple[rp.Reproduction, Cell]:
    """A harness in root/out (one machine's run directory) with one fine-tuning cell from root/model."""
    args = argparse.Namespace(output=str(root / "out"), parallel=1, minutes=0.0, ledger=ledger)
    run = rp.Reproduction(args, ["steps=300"], places={init_name: str(root / "model")})
    workdir = run.workdir("pretrained_sst2_seed0")
    cell = Cell("pretrained_sst2_seed0", {"seed": 0}, "configs/glue.py:task=sst2",
                (sys.executable, "-c", FAKE_FINETUNE, workdir, f"--config.init={root / 'model'}"))
    return run, cell


def test_ledger_keeps_a_finished_run_that_another_machine_then_reads_instead_of_running_it(tmp_path):
    ledger = str(tmp_path / "ledger.jsonl")
    first, cell = machine_with_ledger(tmp_path / "a", ledger, "<pretrained: 10 steps>")
    first.run([cell])
    [record] = bench_ledger.read(ledger)
    assert record["command"][-2:] == ["<output>/pretrained_sst2_seed0", "--config.init=<pretrained: 10 steps>"]
    assert record["init"] == "--config.init=<pretrained: 10 steps>" and record["wall_sec"] > 0  # no path of a

    second, cell = machine_with_ledger(tmp_path / "b", ledger, "<pretrained: 10 steps>")
    second.run([cell])
    assert not (tmp_path / "b" / "out" / "pretrained_sst2_seed0").exists()  # not run: the ledger's record stands in
    assert second.results(cell)["metrics"]["dev"]["accuracy"] == 0.75
    assert len(bench_ledger.read(ledger)) == 1


def test_ledger_runs_a_cell_again_from_another_checkpoint(tmp_path):
    ledger = str(tmp_path / "ledger.jsonl")
    first, cell = machine_with_ledger(tmp_path / "a", ledger, "<pretrained: 10 steps>")
    first.run([cell])
    second, cell = machine_with_ledger(tmp_path / "b", ledger, "<pretrained: 20 steps>")
    second.run([cell])
    assert (tmp_path / "b" / "out" / "pretrained_sst2_seed0" / "results.json").exists()
    assert len(bench_ledger.read(ledger)) == 2
