"""ELECTRA end to end through the real commands: replaced-token detection, the export both halves of it
transformers loads, and GLUE fine-tuning from the discriminator as a BERT."""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest

from tests.helpers.commands import run_module, run_train
from tests.helpers.paths import SHARED_DATA


def electra_overrides(corpus: str, spm_model: str) -> list[str]:
    values = {"data.path": corpus, "tokenizer.path": spm_model, "model.vocab_size": 1000, "model.num_layers": 2,
              "data.max_seq_length": 32, "objective.max_predictions_per_seq": 5, "batch_size": 8,
              "num_train_steps": 8, "log_every": 1, "checkpoint_every": 8, "data.eval_documents": 4, "eval_batches": 1}
    return [f"--config.{k}={v}" for k, v in values.items()]


@pytest.mark.slow
def test_electra_trains_exports_both_models_and_its_discriminator_fine_tunes_as_bert(tmp_path, corpus_and_tokenizer):
    import torch
    import transformers
    workdir = tmp_path / "electra"
    run_train(workdir, electra_overrides(*corpus_and_tokenizer), config="configs/electra.py:size=tiny")
    with open(workdir / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f if '"loss"' in line]
    first, last = records[0], records[-1]
    assert last["loss"] == pytest.approx(last["mlm_loss"] + 50 * last["disc_loss"], rel=1e-4)
    assert 0 < last["replaced_rate"] < 0.2  # about 15% masked, most samples from an untrained generator differ
    assert last["disc_loss"] < first["disc_loss"]  # the discriminator learns the replaced rate at least

    run_module("pretrain.tools.export_hf_bert", ["--workdir", str(workdir), "--output", str(tmp_path / "hf")])
    discriminator = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path / "hf" / "discriminator"))
    generator = transformers.ElectraForMaskedLM.from_pretrained(str(tmp_path / "hf" / "generator"))
    assert torch.equal(generator.electra.embeddings.word_embeddings.weight,
                       discriminator.electra.embeddings.word_embeddings.weight)

    finetune = tmp_path / "mrpc"
    proc = run_module("pretrain.finetune", [
        "--config=configs/glue.py:task=mrpc", f"--workdir={finetune}", f"--config.init={workdir}",
        "--config.data.max_train_examples=32", "--config.num_epochs=1", "--config.data.max_seq_length=32",
        f"--config.data.glue_dir={os.path.join(SHARED_DATA, 'glue')}", "--config.write_test_predictions=false"])
    assert "freshly initialised: bert/pooler/bias, bert/pooler/kernel" in proc.stdout + proc.stderr
    results = json.loads((finetune / "results.json").read_text())
    assert np.isfinite(results["best_score"])
