"""pretrained.resolve_config: what a fine-tuning config takes from its --config.init, and what the command line
keeps."""
from __future__ import annotations

from configs import glue as glue_configs
from pretrain.training import pretrained

INIT = pretrained.Pretrained("modernbert", {"hidden_size": 32, "num_layers": 2, "classifier_pooling": "mean"}, {},
                             {"kind": "sentencepiece", "path": "spm.model", "lowercase": False}, "orbax:init/1")


def resolved(monkeypatch, **model_flags):
    monkeypatch.setattr(pretrained, "load_pretrained", lambda path: INIT)
    config = glue_configs.get_config("task=sst2,model=modernbert")
    with config.unlocked():
        config.init = "init"
    return pretrained.resolve_config(config, model_flags)[0]


def test_the_init_brings_its_architecture_head_pooling_and_tokenizer(monkeypatch):
    config = resolved(monkeypatch)
    assert (config.model.hidden_size, config.model.num_layers, config.model.classifier_pooling) == (32, 2, "mean")
    assert config.tokenizer.path == "spm.model"


def test_a_model_flag_given_on_the_command_line_wins_over_the_init(monkeypatch):
    config = resolved(monkeypatch, classifier_pooling="cls", dropout_rate=0.1)
    assert (config.model.hidden_size, config.model.classifier_pooling, config.model.dropout_rate) == (32, "cls", 0.1)
