"""Every objective implements the declared protocol (objectives/interface.py), with no stubs."""
import types

import numpy as np
import pytest

import objectives
from configs import bert, gpt2, spanbert, t5
from objectives import finetuning
from objectives.interface import Objective, ObjectiveError, PhasedObjective, StepObjective, eos_id_or_none

VOCAB = 300


def fake_tokenizer(**extra):
    return types.SimpleNamespace(vocab_size=VOCAB, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, eos_id=3,
                                 special_ids=(0, 2, 3, 4), word_start=np.ones(VOCAB, bool), num_extra_ids=100,
                                 sentinel_id=lambda k: VOCAB - 1 - k, **extra)


CONFIGS = {  # objective name -> a config file's objective section
    "bert_pretraining": bert.get_config("size=tiny").objective,
    "spanbert": spanbert.get_config("size=tiny").objective,
    "span_corruption": t5.get_config("size=tiny").objective,
    "causal_lm": gpt2.get_config("size=tiny").objective,
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_objectives_implement_the_protocol(name):
    objective = objectives.build_objective(CONFIGS[name], fake_tokenizer())
    assert isinstance(objective, Objective) and isinstance(objective, StepObjective)
    # BERT's masked-position budget is no longer forced on the others as a stub
    assert not hasattr(objective, "max_predictions") or name in ("bert_pretraining", "spanbert")


def test_prefix_lm_implements_the_protocol():
    config = gpt2.get_config("size=tiny").objective
    config.unlock()
    config.name = "prefix_lm"
    objective = objectives.build_objective(config, fake_tokenizer())
    assert isinstance(objective, Objective) and not isinstance(objective, PhasedObjective)


@pytest.mark.parametrize("name", ["bert_pretraining", "spanbert"])
def test_bert_long_phase_masks_more(name):
    config = CONFIGS[name]
    objective = objectives.build_objective(config, fake_tokenizer())
    assert isinstance(objective, PhasedObjective)
    long = objective.for_long_phase()
    assert type(long) is type(objective) and isinstance(long, Objective)
    assert (objective.max_predictions, long.max_predictions) == (config.max_predictions_per_seq,
                                                                 config.long_max_predictions_per_seq)
    rows = {"input_ids": np.full((4, 64), 7, np.int32), "segment_ids": np.zeros((4, 64), np.int32),
            "input_mask": np.ones((4, 64), np.int32), "next_sentence_labels": np.zeros(4, np.int32)}
    rows["input_ids"][:, [0, -1]] = [2, 3]
    short_batch = objective.make_batch(rows, np.random.default_rng(0))
    long_batch = long.make_batch(rows, np.random.default_rng(0))
    assert short_batch["masked_lm_positions"].shape == (4, config.max_predictions_per_seq)
    assert long_batch["masked_lm_positions"].shape == (4, config.long_max_predictions_per_seq)


@pytest.mark.parametrize("kind, labels", [("classification", 3), ("regression", 1), ("tagging", 5), ("span", 4),
                                          ("qa", 2)])
def test_fine_tuning_objectives_are_step_objectives(kind, labels):
    objective = finetuning.FineTuningObjective(kind, labels)
    assert isinstance(objective, StepObjective) and not isinstance(objective, Objective)


def test_unknown_names_raise_the_layer_error():
    with pytest.raises(ObjectiveError, match="config.objective.name='nope' is unknown"):
        objectives.build_objective(types.SimpleNamespace(name="nope"), fake_tokenizer())
    with pytest.raises(ObjectiveError, match="unknown fine-tuning task kind"):
        finetuning.FineTuningObjective("nope", 2)


def test_eos_id_or_none_reads_a_missing_token_as_none():
    class NoEos:
        @property
        def eos_id(self):
            raise LookupError("no </s>")

    assert eos_id_or_none(NoEos()) is None
    assert eos_id_or_none(types.SimpleNamespace()) is None
    assert eos_id_or_none(types.SimpleNamespace(eos_id=np.int64(5))) == 5
