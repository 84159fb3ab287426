"""ModernBERT through the commands a user runs: a transformers ModernBERT directory (random weights, saved with
save_pretrained, with a ModernBERT-shaped tokenizer.json) fine-tunes on a GLUE task and evaluates to the same
scores; our own tiny run trains, exports and loads whole in transformers; it tags through configs/tagging.py."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch
import transformers

from pretrain.workdir import checkpoints
from tests.helpers.commands import run_module, run_train
from tests.helpers.modernbert import write_modernbert_tokenizer
from tests.helpers.paths import SHARED_DATA

pytestmark = pytest.mark.slow  # every test here runs the real commands in subprocesses


@pytest.fixture(scope="module")
def hf_modernbert(tmp_path_factory) -> str:
    """A 3-layer ModernBERT as transformers saves one: config.json, model.safetensors, tokenizer.json."""
    directory = str(tmp_path_factory.mktemp("hf_modernbert"))
    write_modernbert_tokenizer(directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    config = transformers.ModernBertConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
        max_position_embeddings=128, local_attention=16, pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id)
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(config).save_pretrained(directory)
    return directory


def test_a_transformers_modernbert_directory_fine_tunes_on_glue_and_evaluates_the_same(tmp_path, hf_modernbert):
    workdir = tmp_path / "sst2"
    proc = run_module("pretrain.finetune", [
        "--config=configs/glue.py:task=sst2,model=modernbert", f"--workdir={workdir}", f"--config.init={hf_modernbert}",
        f"--config.data.glue_dir={SHARED_DATA}/glue", "--config.data.max_train_examples=256", "--config.num_epochs=1",
        "--config.data.max_seq_length=64", "--config.optimizer.learning_rate=1e-3"])
    # every weight of the encoder and the prediction head loaded; only the classifier is new
    assert f"Weights from huggingface:{hf_modernbert}\n" in proc.stdout, proc.stdout
    results = json.loads((workdir / "results.json").read_text())
    config = json.loads((workdir / "config.json").read_text())
    assert config["model"]["name"] == "modernbert" and config["model"]["local_attention"] == 16
    assert config["tokenizer"]["kind"] == "hf_json"
    assert 0.0 < results["metrics"]["dev"]["accuracy"] <= 1.0
    run_module("pretrain.evaluate", [f"--workdir={workdir}", "--splits=dev"])
    evaluated = json.loads((workdir / "eval_results.json").read_text())
    assert evaluated["metrics"]["dev"] == pytest.approx(results["metrics"]["dev"], abs=1e-6)


@pytest.fixture(scope="module")
def tiny_run(corpus_and_tokenizer, tmp_path_factory) -> str:
    workdir = tmp_path_factory.mktemp("modernbert") / "run"
    corpus, spm = corpus_and_tokenizer
    run_train(workdir, [f"--config.data.path={corpus}", f"--config.tokenizer.path={spm}", "--config.model.vocab_size=1000",
                        "--config.model.local_attention=16", "--config.data.max_seq_length=32",
                        "--config.objective.max_predictions_per_seq=10", "--config.batch_size=8",
                        "--config.num_train_steps=4", "--config.checkpoint_every=4", "--config.eval_every=0",
                        "--config.data.eval_documents=0"],
              config="configs/modernbert.py:size=tiny,packing=True")
    return str(workdir)


def test_our_tiny_run_exports_and_loads_whole_in_transformers(tiny_run, tmp_path):
    output = tmp_path / "hf"
    run_module("pretrain.tools.export_hf_bert", ["--workdir", tiny_run, "--output", str(output)])
    model, info = transformers.ModernBertForMaskedLM.from_pretrained(str(output), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    params, _ = checkpoints.restore_params(f"{tiny_run}/checkpoints")
    assert sum(p.numel() for p in model.parameters()) == sum(np.size(x) for x in jax.tree.leaves(params))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(output))
    ids = tokenizer(["The quick brown fox."], return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape[-1] == 1000 and np.isfinite(logits.numpy()).all()


def test_our_tiny_run_tags_through_the_tagging_command(tiny_run, tmp_path):
    data = tmp_path / "conll"
    run_module("pretrain.tools.make_task_files", ["--kind=ner", f"--output={data}", "--train=64", "--dev=32",
                                                  "--test=32"])
    workdir = tmp_path / "ner"
    run_module("pretrain.finetune", ["--config=configs/tagging.py:model=modernbert", f"--workdir={workdir}",
                                     f"--config.init={tiny_run}", f"--config.data.dir={data}", "--config.num_epochs=1",
                                     "--config.data.max_seq_length=32"])
    results = json.loads((workdir / "results.json").read_text())
    assert set(results["metrics"]["dev"]) >= {"f1", "precision", "recall"}
    assert (workdir / "predictions" / "dev.txt").exists()
