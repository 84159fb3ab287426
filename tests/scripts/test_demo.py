"""`make demo` runs a fixed number of steps, never a wall-clock budget: the same run and exit 0 on any machine, however
slow; its report states the intervals it measured; and the figures the documents state for its corpus are what its
commands build today (the part of the demo fast enough to rerun here: its first two commands)."""
import os
import re
import shlex
import subprocess

import numpy as np
import pytest

from configs import common
from pretrain.loops import budget
from scripts.bench import intervals
from scripts.reproduce import demo_finetune
from tests.helpers.commands import run_module
from tests.helpers.paths import REPO


def demo_commands(*variables: str) -> list[list[str]]:
    """The python commands `make demo` runs, as make prints them without running them (-n: nothing is built);
    `variables`: make's, such as DEMO=dir."""
    printed = subprocess.run(["make", "-n", "demo", "PYTHON=python3", *variables], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.replace("\\\n", " ")
    return [shlex.split(line) for line in re.findall(r"\S*python -m [^;&\n]*", printed)]


def stated(document: str, pattern: str) -> tuple[str, ...]:
    """The groups of `pattern`'s only match in docs/`document` (its lines joined: a figure may wrap)."""
    with open(os.path.join(REPO, "docs", document), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    (match,) = re.findall(pattern, text)
    return match if isinstance(match, tuple) else (match,)


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


@pytest.mark.slow  # make demo's corpus and tokenizer commands, about 40 s
def test_the_documents_state_the_corpus_make_demo_builds_today(tmp_path):
    """docs/benchmarks.md and docs/transfer.md give the training corpus's documents and tokens as `pretrain.train`
    counts them (its "Corpus:" line); here they are counted after make demo's own corpus and tokenizer commands."""
    from pretrain.data import documents, statistics, tokenizers
    commands = demo_commands(f"DEMO={tmp_path}")
    for module in ("pretrain.tools.build_corpus", "pretrain.tools.train_tokenizer"):
        (command,) = [c for c in commands if c[1:3] == ["-m", module]]
        run_module(module, command[3:])
    (train,) = [c for c in commands if "pretrain.train" in c]
    config = common.load(next(arg.split("=", 1)[1] for arg in train if arg.startswith("--config=")))
    overrides = dict(arg[len("--config."):].split("=", 1) for arg in train if arg.startswith("--config."))
    config.data.path, config.tokenizer.path = overrides["data.path"], overrides["tokenizer.path"]
    tokenizer = tokenizers.from_config(config.tokenizer)
    counted = statistics.of_corpus(documents.load_documents(config.data, tokenizer)[0], tokenizer)
    docs, thousands = stated("benchmarks.md", r"GLUE training sentences: ([\d,]+) documents, (\d+)k tokens")
    assert (int(docs.replace(",", "")), int(thousands)) == (counted.documents, round(counted.tokens / 1000))
    assert stated("transfer.md", r"GLUE training sentences, (\d+)k tokens") == (thousands,)
