"""nanoGPT's shakespeare_char CPU recipe through the real command: a short run learns more than
character frequencies (its held-out loss falls below the corpus's unigram entropy) and resumes."""
from __future__ import annotations

import collections
import json
import os

import numpy as np
import pytest

from tests.helpers.commands import run_train
from tests.helpers.paths import SHARED_DATA

pytestmark = pytest.mark.slow  # every test here runs the real command in a subprocess

CONFIG = "configs/gpt2.py:size=nano_shakespeare_char_cpu"
SHAKESPEARE = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")


def unigram_entropy(text: str) -> float:
    """Nats per character of the best model that ignores context: the entropy of character frequencies."""
    counts = np.array(list(collections.Counter(text).values()), np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def read_metrics(workdir) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def shakespeare_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("shakespeare")
    proc = run_train(workdir, ["--config.num_train_steps=200", "--config.log_every=20",
                               f"--config.data.path={SHAKESPEARE}", f"--config.tokenizer.path={SHAKESPEARE}"],
                     config=CONFIG, xla_optimized=True)  # 200 steps: execution, not compilation, dominates
    return workdir, proc


def test_short_run_beats_the_unigram_entropy_of_the_corpus(shakespeare_run):
    workdir, proc = shakespeare_run
    with open(SHAKESPEARE, encoding="utf-8") as f:
        text = f.read()
    entropy = unigram_entropy(text[:int(len(text) * 0.9)])  # of the train split, ~3.31 nats
    records = read_metrics(workdir)
    train = [r for r in records if "loss" in r]
    held_out = [r for r in records if "eval_loss" in r]
    assert "809,856 parameters" in proc.stdout
    assert [r["step"] for r in held_out] == [200]
    assert train[0]["loss"] > entropy          # it starts near log(65) = 4.17 ...
    assert held_out[-1]["eval_loss"] < entropy - 0.3, (held_out[-1], entropy)  # ... and learns context
    assert train[-1]["loss"] < entropy - 0.3


def test_the_same_command_resumes_and_trains_on(shakespeare_run):
    workdir, _ = shakespeare_run
    proc = run_train(workdir, ["--config.num_train_steps=220", "--config.log_every=20",
                               f"--config.data.path={SHAKESPEARE}", f"--config.tokenizer.path={SHAKESPEARE}"],
                     config=CONFIG)
    assert "Resumed from" in proc.stdout and "checkpoints/200" in proc.stdout
    assert read_metrics(workdir)[-1]["step"] == 220
