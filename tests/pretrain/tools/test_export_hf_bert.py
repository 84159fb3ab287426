"""pretrain/tools/export_hf_bert.py: a run of another family is refused in one line, before any weight is read."""
from __future__ import annotations

import os

import pytest

from configs import glue, gpt2, t5
from pretrain.runtime.errors import UserError
from pretrain.tools import export_hf_bert


@pytest.mark.parametrize("family, config", [
    ("gpt", lambda: gpt2.get_config()),                      # pretraining runs: used to complain about a field
    ("t5", lambda: t5.get_config()),
    ("t5", lambda: glue.get_config("task=mrpc,model=t5")),   # fine-tuning runs
    ("gpt", lambda: glue.get_config("task=sst2,model=gpt")),
])
def test_a_gpt_or_t5_run_is_refused_naming_its_family(family, config, tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(config().to_json())
    with pytest.raises(UserError) as info:
        export_hf_bert.export(str(workdir), str(tmp_path / "out"))
    assert str(info.value) == (f"pretrain.tools.export_hf_bert exports BERT runs only, and {workdir} holds a "
                               f"{family} model")
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
