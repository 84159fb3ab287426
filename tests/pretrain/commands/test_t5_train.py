"""T5 end to end through the real commands: span-corruption pretraining, then GLUE as text to text."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pretrain.tasks.glue import data as glue
from pretrain.tasks.glue import text_to_text
from tests.helpers.commands import run_module, run_train
from tests.helpers.paths import SHARED_DATA

GLUE_DIR = os.path.join(SHARED_DATA, "glue")


def t5_overrides(corpus: str, spm_model: str, **extra) -> list[str]:
    """A very small T5 1.0 on the test corpus (1,000 pieces + 100 sentinels)."""
    values = {
        "data.path": corpus, "tokenizer.path": spm_model, "model.vocab_size": 1152,
        "model.d_model": 64, "model.num_heads": 4, "model.head_dim": 16, "model.d_ff": 128,
        "model.num_encoder_layers": 2, "model.num_decoder_layers": 2, "data.max_seq_length": 64,
        "batch_size": 16, "num_train_steps": 60, "log_every": 5, "checkpoint_every": 60,
        "eval_every": 0, "data.eval_documents": 4, "eval_batches": 1,
    }
    values.update(extra)
    return [f"--config.{k}={v}" for k, v in values.items()]


@pytest.fixture(scope="module")
def t5_workdir(tmp_path_factory, corpus_and_tokenizer):
    workdir = tmp_path_factory.mktemp("t5") / "pretrain"
    run_train(workdir, t5_overrides(*corpus_and_tokenizer), config="configs/t5.py:size=tiny")
    return workdir


def _records(workdir) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_span_corruption_pretraining_loss_falls(t5_workdir):
    train = [r for r in _records(t5_workdir) if "loss" in r]
    assert {"cross_entropy", "z_loss", "accuracy", "tokens_per_sec"} <= set(train[0])
    first, last = train[0]["cross_entropy"], np.mean([r["cross_entropy"] for r in train[-2:]])
    # Uniform guessing over 1,152 ids costs ln(1152) = 7.05 nats; the model must do far better.
    assert first > 5.5 and last < first - 1.5, (first, last)
    evals = [r for r in _records(t5_workdir) if "eval_loss" in r]
    assert evals and np.isfinite(evals[-1]["eval_loss"])
    config = json.loads((t5_workdir / "config.json").read_text())
    assert config["model"]["name"] == "t5" and config["optimizer"]["name"] == "adafactor"


@pytest.mark.slow
def test_text_to_text_glue_from_the_pretrained_t5(t5_workdir, tmp_path):
    workdir = tmp_path / "sst2"
    run_module("pretrain.finetune", [
        "--config=configs/glue.py:task=sst2,model=t5", f"--workdir={workdir}", f"--config.init={t5_workdir}",
        f"--config.data.glue_dir={GLUE_DIR}", "--config.data.max_train_examples=800", "--config.num_epochs=2",
        "--config.batch_size=16", "--config.data.max_seq_length=64", "--config.write_test_predictions=false",
        # 0.001 (T5's rate) needs far more steps to move a 60-step span-corruption model off its sentinels.
        "--config.optimizer.learning_rate=0.01"])
    results = json.loads((workdir / "results.json").read_text())
    assert results["init"].startswith("orbax:") and results["main_metric"] == "accuracy"
    dev = results["metrics"]["dev"]
    assert 0.0 <= dev["accuracy"] <= 1.0

    # The model learned the output format: its dev outputs are label words, parsed to class ids.
    rows = [line.split("\t") for line in (workdir / "predictions" / "dev.tsv").read_text().splitlines()[1:]]
    assert len(rows) == 872
    task = glue.get_task("sst2")
    valid = np.mean([row[1] in task.labels for row in rows])
    assert valid > 0.95, valid
    assert np.mean([row[1] == row[2] for row in rows]) == pytest.approx(dev["accuracy"])
    # The targets it was trained on are the label words of text_to_text.
    assert {text_to_text.label_text(task, 0), text_to_text.label_text(task, 1)} == set(task.labels)

    # pretrain.evaluate scores the kept checkpoint again, without training, to the same numbers.
    run_module("pretrain.evaluate", [f"--workdir={workdir}", "--splits=dev"])
    again = json.loads((workdir / "eval_results.json").read_text())
    assert again["metrics"]["dev"] == pytest.approx(dev)


@pytest.fixture(scope="module")
def short_dev_glue(tmp_path_factory) -> str:
    """A GLUE folder whose SST-2 dev.tsv keeps its first 128 rows (train.tsv whole): the PEFT checks below hold
    on any dev set, and each greedy decoding of the full 872 rows costs seconds."""
    root = tmp_path_factory.mktemp("glue")
    (root / "SST-2").mkdir()
    for split, rows in (("train", None), ("dev", 1 + 128)):
        with open(os.path.join(GLUE_DIR, "SST-2", f"{split}.tsv"), "rb") as f:
            (root / "SST-2" / f"{split}.tsv").write_bytes(b"".join(f.readlines()[:rows]))
    return str(root)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "prompt"])
def test_text_to_text_glue_with_peft(t5_workdir, tmp_path, method, short_dev_glue):
    """T5 with LoRA (encoder, decoder and cross-attention) or prompt tuning (the encoder's; greedy decoding then
    reads the prompt states too): only the method's weights train, and pretrain.evaluate rebuilds base + PEFT
    to the same dev numbers."""
    from configs import glue as glue_config
    from pretrain.loops import evaluation, finetuning
    config = glue_config.get_config(f"task=sst2,model=t5,peft={method}")
    config.init, config.data.glue_dir = str(t5_workdir), short_dev_glue
    config.data.max_train_examples, config.num_epochs, config.batch_size = 64, 1, 16
    config.data.max_seq_length, config.write_test_predictions, config.peft.prompt.length = 64, False, 4
    workdir = tmp_path / method
    results = finetuning.finetune(config, str(workdir))
    expected = {"lora": (2 * 2 + 2 * 4) * 2 * 64 * 8, "prompt": 4 * 64}[method]  # q, v (+ cross in the decoder)
    assert results["peft"] == method and results["trainable_parameters"] == expected
    assert len((workdir / "predictions" / "dev.tsv").read_text().splitlines()) == 1 + 128  # the short dev copy
    again = evaluation.evaluate_workdir(str(workdir), ["dev"])
    assert again["metrics"]["dev"] == pytest.approx(results["metrics"]["dev"])
