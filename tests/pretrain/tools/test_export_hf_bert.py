"""pretrain/tools/export_hf_bert.py: a run of a family without an exporter is refused in one line, before any weight is
read; ALBERT and ModernBERT runs export as their transformers classes."""
from __future__ import annotations

import os

import pytest

from configs import glue, t5
from pretrain.runtime.errors import UserError
from pretrain.tools import export_hf_bert


@pytest.mark.parametrize("config", [lambda: t5.get_config(), lambda: glue.get_config("task=mrpc,model=t5")])
def test_a_t5_run_is_refused_naming_its_family(config, tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(config().to_json())
    with pytest.raises(UserError) as info:
        export_hf_bert.export(str(workdir), str(tmp_path / "out"))
    assert str(info.value) == (f"pretrain.tools.export_hf_bert exports bert, distil, electra, modernbert, gpt runs, "
                               f"and {workdir} holds a t5 model")
    assert not os.path.exists(tmp_path / "out")


def test_a_gpt_fine_tuning_run_is_refused_naming_what_exports(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(glue.get_config("task=sst2,model=gpt").to_json())
    with pytest.raises(UserError, match=r"is a GPT fine-tuning run; only GPT pretraining runs export \(as "
                                        r"GPT2LMHeadModel\)"):
        export_hf_bert.export(str(workdir), str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


def test_a_shared_layers_pretraining_run_exports_as_albert_for_pretraining(tmp_path, monkeypatch):
    import jax
    import jax.numpy as jnp
    import transformers

    from configs import albert
    from models import build_model
    from pretrain.training.train_state import unbox
    from pretrain.workdir import checkpoints

    config = albert.get_config("size=tiny")
    spiece = tmp_path / "spm.model"
    spiece.write_bytes(b"a SentencePiece model")
    config.tokenizer.path = str(spiece)
    config.model.vocab_size = 100
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json())
    ids = jnp.zeros((1, 8), jnp.int32)
    params = unbox(build_model(config.model).init(jax.random.key(0), ids, ids, ids + 1, ids[:, :2]))["params"]
    monkeypatch.setattr(checkpoints, "restore_params", lambda directory, step: (params, 7))  # no Orbax run needed
    message = export_hf_bert.export(str(workdir), str(tmp_path / "out"))
    assert message.endswith("as ALBERT") and "step 7" in message
    assert (tmp_path / "out" / "spiece.model").read_bytes() == spiece.read_bytes()
    model, info = transformers.AlbertForPreTraining.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.config.embedding_size == 64 and model.config.hidden_act == "gelu_new"


def test_a_fine_tuned_albert_is_refused_in_one_line(tmp_path):
    config = glue.get_config("task=mrpc")
    with config.unlocked():
        config.model.shared_layers = True
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json())
    with pytest.raises(UserError, match="fine-tuned an ALBERT"):
        export_hf_bert.export(str(workdir), str(tmp_path / "out"))


# ---- ModernBERT --------------------------------------------------------------------------------------------------


def _modernbert_run(tmp_path, config, params, monkeypatch) -> str:
    """A workdir with `config`, its checkpoint `params` at step 7 (restore_params patched: no Orbax run needed)."""
    from pretrain.workdir import checkpoints

    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json())
    monkeypatch.setattr(checkpoints, "restore_params", lambda directory, step: (params, 7))
    return str(workdir)


def _tiny_modernbert(tokenizer: dict, vocab_size: int):
    from configs import modernbert

    config = modernbert.get_config("size=tiny")
    config.tokenizer.update(tokenizer)
    config.model.update({"vocab_size": vocab_size, "scan_layers": True})  # scanned: exported as looped layers
    return config


def _ids(tokenizer, texts):
    import numpy as np

    from pretrain.data import finetune_data

    rows = [ids for ids, _ in finetune_data.encode_texts(tokenizer, texts, None, 32)]
    ids = np.full((len(rows), max(map(len, rows))), tokenizer.pad_id)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    return ids, (ids != tokenizer.pad_id).astype(np.int32)


TEXTS = ["The quick brown fox.", "Shall I compare thee to a summer's day?", "It is a truth universally acknowledged"]


@pytest.mark.parametrize("kind", ["hf_json", "sentencepiece"])
def test_a_modernbert_pretraining_run_exports_as_masked_lm_with_a_tokenizer_json(kind, tmp_path, monkeypatch):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    from models import build_model
    from pretrain.data import tokenizers
    from pretrain.tools.train_tokenizer import train_sentencepiece
    from pretrain.training.train_state import unbox
    from tests.helpers.modernbert import training_texts, write_modernbert_tokenizer

    if kind == "hf_json":
        spec = {"kind": "hf_json", "path": write_modernbert_tokenizer(str(tmp_path / "tok"), 300), "lowercase": False}
    else:
        corpus = tmp_path / "corpus.txt"
        corpus.write_text("\n".join(training_texts()))
        spec = {"kind": "sentencepiece", "path": train_sentencepiece(str(corpus), str(tmp_path / "spm"), 300),
                "lowercase": True}
    tokenizer = tokenizers.from_config(spec)
    config = _tiny_modernbert(spec, vocab_size=320)
    ids, mask = _ids(tokenizer, TEXTS)
    model = build_model(config.model)
    params = unbox(model.init(jax.random.key(0), jnp.asarray(ids), None, jnp.asarray(mask)))["params"]
    workdir = _modernbert_run(tmp_path, config, params, monkeypatch)

    message = export_hf_bert.export(workdir, str(tmp_path / "out"))
    assert message.startswith(f"exported {workdir} step 7 (modernbert, prediction_head, decoder_bias)")
    assert "as ModernBertForMaskedLM" in message and ("converted to tokenizer.json" in message) == (kind != "hf_json")
    hf, info = transformers.ModernBertForMaskedLM.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not any(info.values()), info
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(mask))["mlm_logits"])
    real = mask.astype(bool)
    assert np.abs(ours[real] - theirs[real]).max() < 1e-5
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert [hf_tokenizer(t)["input_ids"] for t in TEXTS] == [list(row[m > 0]) for row, m in zip(ids, mask)]
    assert (hf_tokenizer.mask_token_id, hf_tokenizer.pad_token_id) == (tokenizer.mask_id, tokenizer.pad_id)
    assert (hf.config.pad_token_id, hf.config.cls_token_id) == (tokenizer.pad_id, tokenizer.cls_id)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]  # no scratch file left behind


def test_a_modernbert_run_whose_tokenizer_has_no_tokenizer_json_form_exports_without_it(tmp_path, monkeypatch):
    """A WordPiece vocabulary converts; but a conversion that fails its check leaves the tokenizer out, noted."""
    import jax
    import jax.numpy as jnp

    from models import build_model
    from pretrain.data import tokenizers
    from pretrain.training.train_state import unbox

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nfox\n##es\n")
    config = _tiny_modernbert({"kind": "wordpiece", "path": str(vocab), "lowercase": True}, vocab_size=16)
    ids = jnp.ones((1, 4), jnp.int32)
    params = unbox(build_model(config.model).init(jax.random.key(0), ids, None, ids))["params"]
    workdir = _modernbert_run(tmp_path, config, params, monkeypatch)
    assert "its wordpiece tokenizer converted" in export_hf_bert.export(workdir, str(tmp_path / "a"))
    assert os.path.isfile(tmp_path / "a" / "tokenizer.json")

    def refuse(tokenizer):
        raise tokenizers.TokenizerError("it encodes 'x' as [1], not as ours: [2]")
    monkeypatch.setattr(tokenizers, "tokenizer_json", refuse)
    message = export_hf_bert.export(workdir, str(tmp_path / "b"))
    assert message.endswith("; its tokenizer is left out: it encodes 'x' as [1], not as ours: [2]")
    assert sorted(os.listdir(tmp_path / "b")) == ["config.json", "model.safetensors"]


class _Task:
    """A task as the exporter reads it (task_for_config): CoNLL's and SQuAD's need their data folders."""
    def __init__(self, kind, labels=()):
        self.kind, self.labels = kind, labels


@pytest.mark.parametrize("kind, cls", [("classification", "ModernBertForSequenceClassification"),
                                       ("tagging", "ModernBertForTokenClassification"),
                                       ("qa", "ModernBertForQuestionAnswering")])
def test_a_modernbert_fine_tuning_run_exports_as_the_class_of_its_head(kind, cls, tmp_path, monkeypatch):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    from configs import modernbert
    from models.modernbert_tasks import ModernBertForFineTuning
    from objectives.task_heads import head_kind
    from pretrain.tasks import registry as task_registry
    from pretrain.training.train_state import unbox
    from tests.helpers.modernbert import write_modernbert_tokenizer

    config = glue.get_config("task=mrpc")
    with config.unlocked():
        config.model = modernbert.get_config("size=tiny").model
        config.model.vocab_size = 320
        config.tokenizer = {"kind": "hf_json", "path": write_modernbert_tokenizer(str(tmp_path / "tok"), 300),
                            "lowercase": False}
    labels = {"classification": ("not_equivalent", "equivalent"), "tagging": ("O", "B-PER", "I-PER"), "qa": ()}[kind]
    if kind != "classification":  # MRPC's own task: the real one
        monkeypatch.setattr(task_registry, "task_for_config", lambda c: _Task(kind, labels))
    model_config = export_hf_bert.models.model_config(config.model)
    model = ModernBertForFineTuning(model_config, head_kind(kind), len(labels) or 2)
    ids = np.random.default_rng(0).integers(0, 300, (2, 12))
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    params = unbox(model.init(jax.random.key(1), jnp.asarray(ids), None, jnp.asarray(mask)))["params"]
    params = jax.tree.map(lambda x: 2 * x, params)  # logits of some size
    workdir = _modernbert_run(tmp_path, config, params, monkeypatch)

    assert export_hf_bert.export(workdir, str(tmp_path / "out")).endswith(f"as {cls}")
    hf, info = getattr(transformers, cls).from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not any(info.values()), info
    if labels:
        assert hf.config.id2label == dict(enumerate(labels))
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    ours = model.apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(mask))
    for key in ("start_logits", "end_logits") if kind == "qa" else ("logits",):
        expected = getattr(theirs, key).numpy()
        rows = slice(None) if kind == "classification" else mask.astype(bool)
        assert np.abs(expected[rows]).max() > 0.1
        np.testing.assert_allclose(np.asarray(ours[key])[rows], expected[rows], atol=1e-5, rtol=0)


def test_a_parameter_efficient_modernbert_run_is_refused_in_one_line(tmp_path):
    from configs import modernbert

    config = modernbert.get_config("size=tiny")
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json())
    with pytest.raises(UserError) as info:
        export_hf_bert.export(str(workdir), str(tmp_path / "out"), peft=True)
    assert str(info.value) == (f"--peft exports a parameter-efficient BERT fine-tuning run, and {workdir} holds a "
                               "modernbert model: export it without --peft")
