"""The reproductions' harness: with --minutes each arm's pretraining becomes a scripts/reproduce/cram.py run of the same
config and settings (the budget recipe), and fine-tuning starts from the workdir inside it."""
from __future__ import annotations

import argparse
import os

from scripts.reproduce import reproduction as rp

FLAGS = ["--config.data.path=/c/corpus.txt", "--config.tokenizer.path=/c/spm.model", "--config.num_train_steps=300",
         "--config.data.source=text", "--config.objective.mode=prefix_lm"]


def harness(tmp_path, minutes: float) -> rp.Reproduction:
    args = argparse.Namespace(output=str(tmp_path / f"out{minutes:g}"), parallel=2, minutes=minutes)
    return rp.Reproduction(args, ["steps=300"])


def test_budget_arm_is_a_cram_run_of_the_same_config_and_settings(tmp_path):
    run = harness(tmp_path, 0.5)
    cell = run.pretrain_cell("prefix_lm", "configs/t5.py:size=tiny", FLAGS)
    command = list(cell.command)
    assert command[1:3] == ["-m", "scripts.reproduce.cram"] and "--minutes=0.5" in command
    assert "--config=configs/t5.py:size=tiny" in command
    assert "--corpus=/c/corpus.txt" in command and "--tokenizer=/c/spm.model" in command
    assert "--set=data.source=text" in command and "--set=objective.mode=prefix_lm" in command
    assert not any("num_train_steps" in part for part in command)  # cram plans the steps
    assert run.pretrained(cell) == os.path.join(run.workdir("pretrain_prefix_lm"), "t5")
    assert run.pretraining_text(300) == "0.5 minutes of pretraining per arm"


def test_step_arm_is_a_pretrain_train_run_with_the_flags(tmp_path):
    run = harness(tmp_path, 0.0)
    cell = run.pretrain_cell("nsp", "configs/bert.py:size=tiny,nsp=True", FLAGS)
    assert list(cell.command[1:5]) == ["-m", "pretrain.train", "--config=configs/bert.py:size=tiny,nsp=True",
                                       f"--workdir={run.workdir('pretrain_nsp')}"]
    assert list(cell.command[5:]) == FLAGS
    assert run.pretrained(cell) == run.workdir("pretrain_nsp")
    assert run.pretraining_text(300) == "300 pretraining steps"
