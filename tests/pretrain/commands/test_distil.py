"""Distillation end to end: `pretrain.train --config=configs/distil.py:size=tiny` distils the session's tiny BERT
workdir into a 1-layer student (DistilBERT; size=tiny_narrow: a narrower one with TinyBERT's and MiniLM's losses),
and `pretrain.finetune` starts from the student's encoder."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.helpers.commands import run_module, run_train
from tests.helpers.paths import SHARED_DATA
from tests.helpers.tiny_bert import tiny_overrides

DISTIL = "configs/distil.py:size=tiny"
DISTIL_NARROW = "configs/distil.py:size=tiny_narrow"  # TinyBERT's losses; MiniLM's added below
NARROW = {"model.hidden_size": 16, "model.intermediate_size": 32, "model.teacher_hidden_size": 32,
          "model.teacher_intermediate_size": 64, "objective.alpha_attention_kl": 1.0,
          "objective.alpha_value_relation": 1.0}  # the teacher: the tiny BERT workdir (32 wide, FFN 64)


def _distil_flags(corpus: str, spm: str, teacher: str, **extra) -> list[str]:
    values = {"model.num_layers": 1, "model.teacher_layers": 2, "num_train_steps": 4, "checkpoint_every": 4,
              "data.eval_documents": 0, **extra}
    return tiny_overrides(corpus, spm, **values) + [f"--config.distillation.teacher={teacher}"]


def _leaves(tree) -> list[np.ndarray]:
    import jax
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.slow
def test_distil_a_tiny_bert_then_finetune_the_student(tmp_path, tiny_bert_workdir, corpus_and_tokenizer):
    from pretrain.workdir import checkpoints
    workdir = tmp_path / "distil"
    run_train(workdir, _distil_flags(*corpus_and_tokenizer, tiny_bert_workdir), config=DISTIL)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "loss" in r]
    assert trained[-1]["step"] == 4
    assert all(r["soft_target_loss"] > 0 and 0 < r["cosine_loss"] < 2 for r in trained)
    params, step = checkpoints.restore_params(workdir / "checkpoints")
    teacher, _ = checkpoints.restore_params(os.path.join(tiny_bert_workdir, "checkpoints"))
    assert step == 4 and set(params) == {"student", "teacher"}
    for a, b in zip(_leaves(params["teacher"]["bert"]), _leaves(teacher["bert"])):
        assert np.array_equal(a, b)  # frozen for 4 steps
    assert sorted(params["student"]["bert"]) == ["embeddings", "layer_0"]  # DistilBERT's: no pooler, no token types

    # The student exports as transformers' DistilBertForMaskedLM, its weights as trained.
    import transformers

    from pretrain.tools import export_hf_bert
    export_hf_bert.export(str(workdir), str(tmp_path / "hf"))
    exported = transformers.DistilBertForMaskedLM.from_pretrained(str(tmp_path / "hf")).state_dict()
    assert exported["distilbert.transformer.layer.0.ffn.lin1.bias"].numpy().tolist() == \
        params["student"]["bert"]["layer_0"]["mlp"]["intermediate"]["bias"].tolist()

    _distil_a_narrow_student_and_load_it(tmp_path / "distil_narrow", tiny_bert_workdir, corpus_and_tokenizer)

    # Task distillation: a WNLI run of the teacher teaches the student's fine-tuning with its logits.
    teacher_run, tuned = tmp_path / "wnli_teacher", tmp_path / "wnli"
    _finetune(teacher_run, tiny_bert_workdir)
    _finetune(tuned, workdir, "--config.freezing.strategy=head_only", f"--config.distillation.teacher={teacher_run}",
              "--config.distillation.alpha=0.7")
    results = json.loads((tuned / "results.json").read_text())
    assert results["init"].startswith("orbax:") and 0 <= results["metrics"]["dev"]["accuracy"] <= 1
    logged = [json.loads(line) for line in (tuned / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("soft_target_loss", 0) > 0 for r in logged), logged
    config = json.loads((tuned / "config.json").read_text())
    assert config["model"]["name"] == "bert" and config["model"]["num_layers"] == 1
    assert config["model"]["type_vocab_size"] == 0  # the student's shape, not its teacher's
    finetuned, _ = checkpoints.restore_params(tuned / "checkpoints")
    for a, b in zip(_leaves(finetuned["bert"]), _leaves(params["student"]["bert"])):
        assert np.array_equal(a, b)  # head_only: the student's encoder as distilled
    # the pooler, which the student never had, trains with the head rather than staying frozen at random
    trains = sum(x.size for x in _leaves(finetuned["head"])) + sum(x.size for x in _leaves(finetuned["bert"]["pooler"]))
    assert results["trainable_parameters"] == trains


def _distil_a_narrow_student_and_load_it(workdir, teacher: str, corpus_and_tokenizer):
    """TinyBERT's and MiniLM's losses on a student half the teacher's width, at random: it trains, and its
    `student/bert` loads as a BERT of its own width, with every weight a BERT of that width has."""
    import flax.linen as nn
    import jax

    from models.bert import BertConfig, BertModel
    from pretrain.training import pretrained
    from pretrain.workdir import checkpoints
    run_train(workdir, _distil_flags(*corpus_and_tokenizer, teacher, **NARROW), config=DISTIL_NARROW)
    trained = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in trained if "loss" in r]
    assert trained[-1]["step"] == 4 and "soft_target_loss" not in trained[-1]
    for key in ("attention_mse", "hidden_mse", "embedding_mse", "attention_kl", "value_relation_kl"):
        assert all(np.isfinite(r[key]) and r[key] > 0 for r in trained), key
    params, _ = checkpoints.restore_params(workdir / "checkpoints")
    assert set(params) == {"student", "teacher", "hidden_fit", "embedding_fit"}
    loaded = pretrained.load_pretrained(str(workdir))
    assert loaded.family == "bert" and (loaded.model["hidden_size"], loaded.model["intermediate_size"]) == (16, 32)
    ids = np.ones((1, 8), np.int32)
    fresh_bert = nn.unbox(BertModel(BertConfig(**loaded.model)).init(jax.random.key(0), ids, ids * 0, ids)["params"])
    merged, fresh = pretrained.merge_params(fresh_bert, loaded.params, loaded.source)
    assert fresh == [] and all(np.array_equal(a, b) for a, b in zip(_leaves(merged), _leaves(params["student"]["bert"])))


def _finetune(workdir, init, *extra: str):
    run_module("pretrain.finetune", [
        "--config=configs/glue.py:task=wnli", f"--workdir={workdir}", f"--config.init={init}",
        f"--config.data.glue_dir={os.path.join(SHARED_DATA, 'glue')}", "--config.data.max_train_examples=32",
        "--config.num_epochs=1", "--config.batch_size=16", "--config.data.max_seq_length=32",
        "--config.write_test_predictions=false", "--config.log_every=1", *extra])


@pytest.mark.slow
def test_a_teacher_of_another_vocabulary_stops_the_command_with_one_line(tmp_path, tiny_bert_workdir,
                                                                         corpus_and_tokenizer):
    flags = _distil_flags(*corpus_and_tokenizer, tiny_bert_workdir, **{"model.vocab_size": 2000})
    proc = run_train(tmp_path / "distil", flags, config=DISTIL, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "1000 ids" in lines[0] and "vocab_size=2000" in lines[0] and "--config.model.vocab_size=1000" in lines[0]
