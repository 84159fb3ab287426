"""The reproductions' harness: each arm's pretraining is a pretrain.train run of its config and settings, with --minutes
fitted to that budget (config.budget_minutes), and fine-tuning starts from its workdir."""
from __future__ import annotations

import argparse

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
