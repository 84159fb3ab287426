"""`make demo` runs a fixed number of steps, never a wall-clock budget: the same run and exit 0 on any machine, however
slow; and its report states the intervals it measured."""
import re
import shlex
import subprocess

import numpy as np
import pytest

from configs import common
from pretrain.loops import budget
from scripts.bench import intervals
from scripts.reproduce import demo_finetune
from tests.helpers.paths import REPO


def demo_commands() -> list[list[str]]:
    """The python commands `make demo` runs, as make prints them without running them (-n: nothing is built)."""
    printed = subprocess.run(["make", "-n", "demo", "PYTHON=python3"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.replace("\\\n", " ")
    return [shlex.split(line) for line in re.findall(r"\S*python -m [^;&\n]*", printed)]


@pytest.mark.slow  # make -n: a subprocess, though it runs nothing
def test_make_demo_pretrains_a_fixed_number_of_steps_without_a_clock(tmp_path):
    (train,) = [c for c in demo_commands() if "pretrain.train" in c]
    assert not any(arg.startswith("--time_budget_minutes") for arg in train)
    spec = next(arg.split("=", 1)[1] for arg in train if arg.startswith("--config="))
    config = common.load(spec)
    assert config.budget_minutes == 0 and config.budget_steps > 0
    fitted, deadline = budget.fit(config, str(tmp_path), train=None)  # never times a step: nothing to train
    assert deadline is None and fitted.num_train_steps == config.budget_steps
    assert not (tmp_path / budget.PLAN_FILE).exists()


@pytest.mark.slow
def test_make_demo_adapts_for_a_fixed_number_of_steps():
    (adapt,) = [c for c in demo_commands() if "pretrain.adapt" in c]
    assert any(re.fullmatch(r"--steps=\d+", arg) for arg in adapt)


def test_the_demo_report_gives_intervals_and_says_when_a_difference_is_noise():
    scores = {("random", "sst2-1k"): [67.0, 68.0, 69.0], ("pretrained", "sst2-1k"): [67.5, 68.5, 66.5],
              ("adapted", "sst2-1k"): [75.0, 76.0, 77.0]}
    text = demo_finetune.report(scores, ["random", "pretrained", "adapted"], ["sst2-1k"], [0, 1, 2])
    half = intervals.mean_interval([67.0, 68.0, 69.0])[1]
    assert half == pytest.approx(4.303 * 1.0 / np.sqrt(3), abs=1e-3)  # t(0.975, 2) x the standard error
    assert f"68.0 ± {half:.1f}" in text
    assert "pretrained is not distinguishable from random" in text
    assert "adapted is better than random" in text
    assert "± 0.0" not in intervals.format_interval([70.0])
