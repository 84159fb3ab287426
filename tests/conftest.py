"""Shared fixtures: a small offline corpus + SentencePiece model, and the real train command."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

TPU_REASON = "libtpu is not installed: `make test-tpu` runs them in a venv of its own"


def pytest_collection_modifyitems(config, items):
    """Tests marked `tpu` need libtpu (the `tpu` extra), which the main venv must not have (JAX would probe
    for a TPU at start-up): without it they are deselected, and said so at the end, never skipped."""
    if importlib.util.find_spec("libtpu") is not None:
        return
    deselected = [item for item in items if item.get_closest_marker("tpu")]
    if deselected:
        items[:] = [item for item in items if not item.get_closest_marker("tpu")]
        config.hook.pytest_deselected(items=deselected)
        config._tpu_deselected = len(deselected)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if getattr(config, "_tpu_deselected", 0):
        terminalreporter.write_line(f"{config._tpu_deselected} test(s) marked tpu deselected: {TPU_REASON}")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")


@pytest.fixture(scope="session")
def corpus_and_tokenizer(tmp_path_factory) -> tuple[str, str]:
    """(corpus.txt, spm.model) built like `make demo` does, but smaller."""
    from scripts import train_tokenizer
    from scripts.build_demo_corpus import build_corpus
    root = tmp_path_factory.mktemp("demo_assets")
    corpus = str(root / "corpus.txt")
    build_corpus(corpus, max_mb=0.5)
    model = train_tokenizer.train_sentencepiece(corpus, str(root / "spm"), vocab_size=1000)
    return corpus, model


def tiny_overrides(corpus: str, spm_model: str, **extra) -> list[str]:
    """Flags for a seconds-long run of a very small BERT through the real command."""
    values = {
        "data.path": corpus, "tokenizer.path": spm_model, "model.vocab_size": 1000,
        "model.hidden_size": 32, "model.num_heads": 2, "model.intermediate_size": 64,
        "model.num_layers": 2, "data.max_seq_length": 32, "objective.max_predictions_per_seq": 5,
        "batch_size": 8, "num_train_steps": 6, "log_every": 1, "checkpoint_every": 3,
        "eval_every": 0, "data.eval_documents": 4, "eval_batches": 1, "optimizer.warmup_steps": 2,
    }
    values.update(extra)
    return [f"--config.{k}={v}" for k, v in values.items()]


def run_train(workdir, overrides: list[str], *, env: dict | None = None, check: bool = True,
              config: str = "configs/bert.py:size=tiny") -> subprocess.CompletedProcess:
    return run_module("pretrain.train", [f"--config={config}", f"--workdir={workdir}", *overrides],
                      env=env, check=check)


def run_module(module: str, args: list[str], *, env: dict | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """`python -m module args...` from the repo root, as a user runs it."""
    cmd = [sys.executable, "-m", module, *args]
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc
