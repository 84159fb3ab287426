"""Relations between config keys that waste a run: warned once (pretrain/training/config_warnings.py and the owners'
check hooks: an objective's masking budget, a freezing strategy's depth), or refused where they make it
meaningless; the shipped configs warn only where their recipe chooses so."""
from __future__ import annotations

import pytest

from configs import albert, bert, glue, gpt2, t5
from pretrain.runtime.errors import ConfigError
from pretrain.training import config_warnings, validation
from tests.helpers.configs import changed


@pytest.mark.parametrize("config, flat, needles", [
    (bert.get_config("size=tiny"), {"num_train_steps": 50, "optimizer.warmup_steps": 100},
     ["config.optimizer.warmup_steps=100 >= config.num_train_steps=50", "lower warmup_steps below 50"]),
    (t5.get_config("size=small"), {"num_train_steps": 100},
     ["config.optimizer.warmup_steps=10000 >= config.num_train_steps=100", "rsqrt schedule"]),
    (glue.get_config("task=mrpc"), {"warmup_fraction": 1.0},
     ["config.warmup_fraction=1 warms up over every step"]),
    (gpt2.get_config("size=small"), {"optimizer.learning_rate": 5e-5},
     ["config.optimizer.end_learning_rate=6e-05 is above config.optimizer.learning_rate=5e-05",
      "warmup_cosine_decay schedule climbs"]),
    (bert.get_config("size=base"), {"num_train_steps": 1000, "optimizer.warmup_steps": 100},
     ["config.data.long_seq_start_step=900000 >= config.num_train_steps=1000",
      "config.data.long_seq_length=512 phase never starts", "--config.data.long_seq_length=0"]),
    (gpt2.get_config("size=tiny"), {"num_train_steps": 10, "optimizer.warmup_steps": 2, "profile_steps": "20,22"},
     ["config.profile_steps='20,22' starts after the run's last step (10", "no trace"]),
    (glue.get_config("task=mrpc"), {"distillation.teacher": "runs/teacher", "distillation.alpha": 0.0},
     ["config.distillation.alpha=0 gives config.distillation.teacher='runs/teacher' no weight"]),
    (bert.get_config("size=tiny"), {"objective.mask_prob": 0.4},
     ["config.objective.mask_prob=0.4 asks 50 masked tokens of a config.data.max_seq_length=128 row",
      "config.objective.max_predictions_per_seq=20 masks at most 20", "raise max_predictions_per_seq to 50"]),
    (bert.get_config("size=base"), {"objective.long_max_predictions_per_seq": 40},
     ["config.data.long_seq_length=512 row", "config.objective.long_max_predictions_per_seq=40 masks at most 40"]),
    (bert.get_config("size=tiny"), {"objective.eval_mask_prob": 0.3},
     ["config.objective.eval_mask_prob=0.3 asks 38 masked tokens"]),
    (glue.get_config("task=mrpc,freeze=gradual"), {},
     ["config.freezing.strategy='gradual'", "config.freezing.unfreeze_every_epochs=1",
      "config.num_epochs=3 only the top 3 of 12 layers train", "raise num_epochs to 13"]),
    (glue.get_config("task=mrpc,model=gpt,freeze=gradual"), {"freezing.unfreeze_every_epochs": 2, "num_epochs": 8},
     ["config.num_epochs=8 only the top 4 of 12 layers train", "raise num_epochs to 25"]),
])
def test_a_wasteful_relation_is_a_warning_naming_both_keys(config, flat, needles):
    warnings = validation.check_relations(changed(config, **flat))
    assert any(all(needle in warning for needle in needles) for warning in warnings), warnings
    assert all("\n" not in warning for warning in warnings)


@pytest.mark.parametrize("config, flat", [
    (bert.get_config("size=tiny"), {"num_train_steps": 101, "optimizer.warmup_steps": 100}),
    (glue.get_config("task=mrpc"), {"optimizer.schedule": "slanted_triangular", "warmup_fraction": 1.0}),
    (bert.get_config("size=base"), {}),  # the paper's long phase starts at 900,000 of 1,000,000 steps
    (gpt2.get_config("size=small"), {"optimizer.learning_rate": 5e-5, "optimizer.schedule": "constant"}),
    (bert.get_config("size=tiny"), {"objective.mask_prob": 0.4, "objective.max_predictions_per_seq": 50}),
    (glue.get_config("task=mrpc"), {"distillation.teacher": "runs/teacher", "distillation.alpha": 0.1}),
    (glue.get_config("task=mrpc,freeze=gradual"), {"num_epochs": 13}),  # 12 layers, then the embeddings
    (gpt2.get_config("size=tiny"), {"num_train_steps": 10, "optimizer.warmup_steps": 2, "profile_steps": "20,22",
                                     "budget_minutes": 5.0}),  # the budget decides the steps
])
def test_the_same_keys_in_agreement_warn_nothing(config, flat):
    assert validation.check_relations(changed(config, **flat)) == []


def test_the_shipped_configs_warn_only_where_their_recipe_chooses_to():
    """ALBERT's published recipe masks 20 of a 512-token row; ULMFiT's unfreezing in GLUE's 3 epochs stops at the
    top layers. Every other shipped config is quiet."""
    assert len(validation.check_relations(albert.get_config("size=base"))) == 1
    for config in (bert.get_config("size=base"), bert.get_config("size=tiny"), t5.get_config("size=small"),
                   gpt2.get_config("size=small"), glue.get_config("task=mrpc"), glue.get_config("task=mrpc,model=t5")):
        assert validation.check_relations(config) == []


def test_freezing_more_layers_than_the_model_has_is_refused_before_anything_loads():
    config = changed(glue.get_config("task=mrpc,freeze=lowest"), **{"freezing.num_frozen_layers": 13})
    with pytest.raises(ConfigError, match=r"config\.freezing\.num_frozen_layers=13 must be in \[0, 12\]"):
        validation.check_relations(config)


def test_a_warning_is_printed_once_on_stderr_after_the_errors(capsys):
    config = changed(bert.get_config("size=tiny"), num_train_steps=7, **{"optimizer.warmup_steps": 99})
    with pytest.raises(ConfigError):  # a refused config prints its error alone
        validation.validate(changed(config, **{"model.num_heads": 3}))
    assert capsys.readouterr().err == ""
    validation.validate(config)
    validation.validate(config)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: config.optimizer.warmup_steps=99 >= "), err


def test_warn_once_prints_each_message_once(capsys):
    config_warnings.warn_once("a message of this test only")
    config_warnings.warn_once("a message of this test only")
    assert capsys.readouterr().err == "warning: a message of this test only\n"


def test_rates_per_layer_with_a_frozen_body_are_refused():
    config = changed(glue.get_config("task=mrpc,freeze=head_only"), discriminative_factor=2.6)
    with pytest.raises(ConfigError, match=r"config\.discriminative_factor=2\.6 sets rates for the layers that "
                                          r"config\.freezing\.strategy='head_only' freezes"):
        validation.check_relations(config)
    validation.check_relations(changed(config, **{"freezing.strategy": "gradual", "num_epochs": 13}))


@pytest.mark.parametrize("batch, accum, shards, fits", [(32, 1, 8, True), (32, 2, 8, True), (32, 8, 8, False),
                                                        (12, 1, 8, False), (24, 1, 3, True)])
def test_a_micro_batch_must_split_over_the_batch_shards(batch, accum, shards, fits):
    config = changed(bert.get_config("size=tiny"), batch_size=batch, grad_accum_steps=accum)
    if fits:
        validation.check_batch_split(config, shards)
    else:
        with pytest.raises(ConfigError, match=rf"config\.batch_size={batch} / config\.grad_accum_steps={accum} = "
                                              rf"{batch // accum} rows per micro-batch do not split over the {shards}"
                                              rf" batch shards .*a multiple of {shards * accum}"):
            validation.check_batch_split(config, shards)


def test_a_decoder_too_short_for_span_corruption_is_refused_before_the_corpus_is_read():
    config = changed(t5.get_config("size=small"), **{"objective.targets_length": 100})
    with pytest.raises(ConfigError, match=r"config\.objective\.targets_length=100 is shorter than the 114 tokens span "
                                          r"corruption of config\.data\.max_seq_length=512 inputs produces"):
        validation.check_relations(config)
    assert validation.check_relations(changed(config, **{"objective.targets_length": 114})) == []


@pytest.mark.parametrize("method, flat, needle", [
    ("lora", {"peft.lora.rank": 1000}, "config.peft.lora_rank=1000 exceeds the query projection's rank 768"),
    ("adapters", {"peft.adapters.size": 1000}, "config.peft.adapter_size=1000 is wider than the model (768)"),
])
def test_a_peft_method_larger_than_the_model_is_refused_before_anything_loads(method, flat, needle):
    config = changed(glue.get_config(f"task=mrpc,peft={method}"), init="runs/pretrained", **flat)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        validation.check_relations(config)
    validation.check_relations(changed(glue.get_config(f"task=mrpc,peft={method}"), init="runs/pretrained"))
