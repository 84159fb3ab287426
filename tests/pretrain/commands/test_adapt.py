"""pretrain.adapt as a user runs it: a tiny ModernBERT run adapted on SST-2's training text writes its report, the
same command resumes (here: finds the run finished), pretrain.finetune takes the adapted workdir as --config.init;
a transformers ModernBERT directory adapts with its family's recipe; a GLUE dev file as --text, an unknown config key
and --print_config answer as the other commands do."""
from __future__ import annotations

import json
import pathlib

import pytest

from tests.helpers.commands import run_module, run_train
from tests.helpers.modernbert import write_modernbert_tokenizer
from tests.helpers.paths import SHARED_DATA

pytestmark = pytest.mark.slow  # every test here runs the real commands in subprocesses

GLUE = f"{SHARED_DATA}/glue"


@pytest.fixture(scope="module")
def tiny_run(corpus_and_tokenizer, tmp_path_factory) -> str:
    workdir = tmp_path_factory.mktemp("modernbert") / "run"
    corpus, spm = corpus_and_tokenizer
    run_train(workdir, [f"--config.data.path={corpus}", f"--config.tokenizer.path={spm}",
                        "--config.model.vocab_size=1000",
                        "--config.model.local_attention=16", "--config.data.max_seq_length=32",
                        "--config.objective.max_predictions_per_seq=10", "--config.batch_size=8",
                        "--config.num_train_steps=4", "--config.checkpoint_every=4", "--config.eval_every=0",
                        "--config.data.eval_documents=4", "--config.eval_batches=1"],
              config="configs/modernbert.py:size=tiny")
    return str(workdir)


def adapt_args(init: str, workdir) -> list[str]:
    return [f"--init={init}", f"--workdir={workdir}", "--task=sst2", f"--glue_dir={GLUE}", "--labelled_only=128",
            "--steps=2"]


@pytest.fixture(scope="module")
def adapted(tiny_run, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("adapted") / "sst2"
    return str(workdir), run_module("pretrain.adapt", adapt_args(tiny_run, workdir))


def test_the_command_reports_before_and_after_and_the_same_command_resumes(tiny_run, adapted):
    workdir, first = adapted
    report = json.loads(pathlib.Path(workdir, "adaptation.json").read_text())
    assert report["init"] == tiny_run and report["task"] == "sst2" and report["examples"] == 128
    for text in ("task_text", "general_text"):
        assert set(report[text]) == {"before", "after"} and report[text]["before"]["loss"] > 0
    assert f"held-out loss on the task's text {report['task_text']['before']['loss']:.4f} -> " in first.stdout
    again = run_module("pretrain.adapt", adapt_args(tiny_run, workdir))
    assert "Nothing to do: the checkpoint at step 2 already reaches" in again.stdout
    assert json.loads(pathlib.Path(workdir, "adaptation.json").read_text()) == report


def test_the_adapted_workdir_fine_tunes(adapted, tmp_path):
    workdir, _ = adapted
    proc = run_module("pretrain.finetune", [
        "--config=configs/glue.py:task=sst2,model=modernbert", f"--workdir={tmp_path / 'sst2'}",
        f"--config.init={workdir}", f"--config.data.glue_dir={GLUE}", "--config.data.max_train_examples=64",
        "--config.num_epochs=1", "--config.data.max_seq_length=32"])
    assert f"Weights from orbax:{workdir}/checkpoints/2" in proc.stdout
    assert 0.0 < json.loads((tmp_path / "sst2" / "results.json").read_text())["metrics"]["dev"]["accuracy"] <= 1.0


def test_evaluation_text_an_unknown_key_and_print_config_answer_in_one_line(tiny_run, tmp_path):
    workdir = tmp_path / "never"
    dev = run_module("pretrain.adapt", [f"--init={tiny_run}", f"--workdir={workdir}", f"--text={GLUE}/SST-2/dev.tsv"],
                     check=False)
    assert dev.returncode == 2 and len(dev.stderr.strip().splitlines()) == 1, dev.stderr
    assert dev.stderr.startswith(f"error: --text={GLUE}/SST-2/dev.tsv is GLUE evaluation data") and not workdir.exists()
    unknown = run_module("pretrain.adapt", [*adapt_args(tiny_run, workdir), "--config.no_such_key=1"], check=False)
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == [
        "error: unknown config key --config.no_such_key (no key 'no_such_key' in the adaptation's config; "
        "--print_config lists them)"]
    shown = run_module("pretrain.adapt", [f"--init={tiny_run}", "--config.optimizer.learning_rate=3e-4",
                                          "--config.eval_batches", "2", "--print_config"])
    config = json.loads(shown.stdout)
    assert config["init"] == tiny_run and config["optimizer"]["learning_rate"] == 3e-4 and config["eval_batches"] == 2
    assert config["model"]["num_layers"] == 3 and config["tokenizer"]["path"].endswith("spm.model")


def test_a_transformers_modernbert_directory_adapts_whole_with_the_family_recipe(tmp_path):
    import torch
    import transformers
    init = str(tmp_path / "hf")
    write_modernbert_tokenizer(init)
    tokenizer = transformers.AutoTokenizer.from_pretrained(init)
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=48,
        max_position_embeddings=64, local_attention=16, pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id)).save_pretrained(init)
    workdir = tmp_path / "adapted"
    proc = run_module("pretrain.adapt", [*adapt_args(init, workdir), "--config.batch_size=8",
                                         "--config.eval_batches=1"])
    assert f"Weights from huggingface:{init}\n" in proc.stdout  # the MLM head too: nothing fresh
    report = json.loads((workdir / "adaptation.json").read_text())
    assert report["general_text"] == {"skipped": "a Hugging Face init names no corpus of its own"}
    assert report["task_text"]["after"]["loss"] > 0
    config = json.loads((workdir / "config.json").read_text())
    assert config["model"]["hidden_size"] == 32 and config["tokenizer"]["path"] == f"{init}/tokenizer.json"
    assert config["data"]["max_seq_length"] == 64  # the recipe's 1,024-token rows within the checkpoint's positions
    assert config["optimizer"]["learning_rate"] == 4e-4  # half of ModernBERT-base's 8e-4
