"""Continued pretraining from an init (pretrain/loops/pretraining.py with config.init) and domain adaptation
(pretrain/loops/adaptation.py), in process, on tiny runs: a fresh run starts from the init's whole model (its
step-0 held-out loss on the init's own held-out text is the init's, to the bit), reads the task's training text,
refuses an init that lacks weights, resumes from its own checkpoint, and works the same for ModernBERT, GPT and T5."""
from __future__ import annotations

import json

import numpy as np
import pytest

from configs import common
from pretrain.loops import adaptation, pretraining
from pretrain.runtime.errors import UserError
from pretrain.tasks import task_text
from pretrain.workdir import preemption
from tests.helpers.asserts import assert_one_line_error
from tests.helpers.paths import SHARED_DATA
from tests.helpers.states import assert_same_states

GLUE = f"{SHARED_DATA}/glue"
LABELLED = 256  # SST-2 training examples whose text the adaptations read (~100 documents of a 32-token row)
RUN = {"batch_size": 8, "log_every": 1, "eval_every": 0, "eval_batches": 1, "data.eval_documents": 4}
FAMILIES = {  # config file -> what makes it tiny (its own data, tokenizer and a 32- or 64-token row)
    "modernbert": ("configs/modernbert.py:size=tiny,packing=True", {
        "model.vocab_size": 1000, "model.local_attention": 16, "data.max_seq_length": 32,
        "objective.max_predictions_per_seq": 10}),
    "gpt": ("configs/gpt2.py:size=tiny", {
        "model.vocab_size": 1000, "model.num_layers": 1, "model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64,
        "model.n_positions": 32, "data.max_seq_length": 32}),
    "t5": ("configs/t5.py:size=tiny", {  # 1,000 pieces + 100 sentinels
        "model.vocab_size": 1152, "model.d_model": 32, "model.num_heads": 2, "model.head_dim": 16, "model.d_ff": 64,
        "model.num_encoder_layers": 1, "model.num_decoder_layers": 1, "data.max_seq_length": 64}),
}


def config_of(family: str, corpus: str, spm: str, **values):
    spec, tiny = FAMILIES[family]
    config = common.load(spec)
    for key, value in {"data.path": corpus, "tokenizer.path": spm, **RUN, **tiny, **values}.items():
        common.apply_setting(config, f"{key}={value}")
    return config


def pretrained_run(family: str, corpus_and_tokenizer, directory) -> str:
    """A 4-step run of the family: the init the adaptations start from."""
    config = config_of(family, *corpus_and_tokenizer, num_train_steps=4, checkpoint_every=4)
    pretraining.train_and_evaluate(config, str(directory))
    return str(directory)


def adapt(init: str, workdir, steps: int = 2, labelled: int = LABELLED, **values) -> dict:
    """The adaptation of `init` on `labelled` SST-2 examples, with `values` as --config.KEY=VALUE flags."""
    config = adaptation.base_config(init, steps, family_config=None)  # our workdirs: no family config needed
    for key, value in values.items():
        common.apply_setting(config, f"{key}={value}")
    text = adaptation.Text(task="sst2", glue_dir=GLUE, labelled_only=labelled)
    return adaptation.adapt(config, str(workdir), text, overridden=set(values))


def eval_loss(workdir: str) -> float:
    """The init run's held-out loss at its last step."""
    with open(f"{workdir}/metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    return [r["eval_loss"] for r in records if "eval_loss" in r][-1]


@pytest.fixture(scope="module")
def modernbert_init(corpus_and_tokenizer, tmp_path_factory) -> str:
    return pretrained_run("modernbert", corpus_and_tokenizer, tmp_path_factory.mktemp("modernbert") / "init")


def test_an_adaptation_starts_from_the_whole_init_and_reads_the_tasks_training_text(modernbert_init, tmp_path,
                                                                                   capsys):
    report = adapt(modernbert_init, tmp_path / "adapted")
    assert f"Weights from orbax:{modernbert_init}/checkpoints/4\n" in capsys.readouterr().out  # nothing fresh
    # step 0 is the init's own weights, MLM head included: on its own held-out text, its own final loss, bit for bit
    assert report["general_text"]["before"]["loss"] == eval_loss(modernbert_init)
    before, after = report["task_text"]["before"]["loss"], report["task_text"]["after"]["loss"]
    assert np.isfinite([before, after]).all() and before != after
    written = (tmp_path / "adapted" / adaptation.TEXT_FILE).read_text().split("\n")
    expected = task_text.training_examples("sst2", GLUE, LABELLED)
    assert sorted(filter(None, written)) == sorted(line for example in expected for line in example)
    assert report["examples"] == LABELLED and report["documents"]["held_out"] == 8  # eval_batches x batch_size
    saved = json.loads((tmp_path / "adapted" / "config.json").read_text())
    assert saved["init"] == modernbert_init and saved["num_train_steps"] == 2
    assert saved["optimizer"]["schedule"] == "warmup_linear_decay" and saved["optimizer"]["warmup_steps"] == 1
    assert saved["optimizer"]["learning_rate"] == 1e-3  # half the tiny recipe's peak of 2e-3
    with pytest.raises(UserError) as info:  # the same workdir on other text: not a resume
        adapt(modernbert_init, tmp_path / "adapted", labelled=LABELLED // 2)
    assert_one_line_error(info, "holds an adaptation on other text")


def test_an_init_that_lacks_weights_of_the_model_is_one_line(modernbert_init, corpus_and_tokenizer, tmp_path):
    config = config_of("modernbert", *corpus_and_tokenizer, init=modernbert_init, **{"model.num_layers": 4})
    with pytest.raises(UserError) as info:
        pretraining.train_and_evaluate(config, str(tmp_path / "deeper"))
    assert_one_line_error(info, "lacks weights of the modernbert pretraining model: modernbert/layer_3;")


def test_a_resumed_adaptation_restores_its_own_checkpoint_not_the_init(modernbert_init, tmp_path, monkeypatch, capsys):
    stopped = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        patch.setattr(preemption.Watcher, "should_stop", lambda self, step: step == 2)
        with pytest.raises(preemption.Preempted):
            adapt(modernbert_init, stopped, steps=4, checkpoint_every=2)
    capsys.readouterr()
    report = adapt(modernbert_init, stopped, steps=4, checkpoint_every=2)
    out = capsys.readouterr().out
    assert f"Resumed from {stopped}/checkpoints/2" in out and "Weights from" not in out
    assert report["task_text"]["before"] is not None and report["task_text"]["after"] is not None  # step 0: run 1
    adapt(modernbert_init, tmp_path / "uninterrupted", steps=4, checkpoint_every=2)
    assert_same_states(tmp_path / "uninterrupted" / "checkpoints" / "4", stopped / "checkpoints" / "4")


@pytest.mark.parametrize("family", ["gpt", "t5"])
def test_gpt_and_t5_adapt_from_their_whole_model(family, corpus_and_tokenizer, tmp_path):
    init = pretrained_run(family, corpus_and_tokenizer, tmp_path / "init")
    report = adapt(init, tmp_path / "adapted")
    assert report["general_text"]["before"]["loss"] == eval_loss(init)
    assert np.isfinite([report["task_text"][k]["loss"] for k in ("before", "after")]).all()
    saved = json.loads((tmp_path / "adapted" / "config.json").read_text())
    assert saved["model"] == json.loads((tmp_path / "init" / "config.json").read_text())["model"]
    assert saved["optimizer"]["schedule"] == "warmup_linear_decay"


def hf_bert(directory) -> str:
    """A transformers BertForMaskedLM (random weights; like most BERTs on the Hub: no pooler, no NSP head) with a
    WordPiece vocabulary of SST-2's commonest words."""
    import collections

    import torch
    import transformers
    words = collections.Counter(word for example in task_text.training_examples("sst2", GLUE, 2000)
                                for line in example for word in line.lower().split())
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [w for w, _ in words.most_common(400)]
    directory.mkdir()
    (directory / "vocab.txt").write_text("".join(f"{token}\n" for token in vocab))
    torch.manual_seed(0)
    transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64)).save_pretrained(str(directory))
    return str(directory)


def test_a_hugging_face_bert_adapts_with_its_family_recipe_and_a_fresh_pooler(tmp_path, capsys):
    init = hf_bert(tmp_path / "hf")
    config = adaptation.base_config(init, 2, lambda family: common.load(adaptation.FAMILY_CONFIGS.get(family)))
    for setting in ("batch_size=8", "eval_batches=1"):
        common.apply_setting(config, setting)
    text = adaptation.Text(task="sst2", glue_dir=GLUE, labelled_only=LABELLED)
    report = adaptation.adapt(config, str(tmp_path / "adapted"), text, {"batch_size", "eval_batches"})
    # BertForMaskedLM has no pooler: the one weight the BERT family may lack (models/families.py optional_params)
    assert f"Weights from huggingface:{init}; freshly initialised: bert/pooler\n" in capsys.readouterr().out
    assert report["general_text"] == {"skipped": "a Hugging Face init names no corpus of its own"}
    assert np.isfinite([report["task_text"][k]["loss"] for k in ("before", "after")]).all()
    saved = json.loads((tmp_path / "adapted" / "config.json").read_text())
    assert saved["model"]["hidden_size"] == 32 and saved["tokenizer"]["kind"] == "wordpiece"
    assert saved["objective"]["next_sentence"] is False and saved["data"]["long_seq_length"] == 0
    assert saved["data"]["max_seq_length"] == 64  # BERT's 128-token recipe, within the checkpoint's 64 positions
    assert saved["optimizer"]["learning_rate"] == pytest.approx(5e-5)  # half of BERT's 1e-4
