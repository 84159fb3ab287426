"""NSP has one switch: config.objective.next_sentence and config.model.next_sentence are one value in the BERT and
SpanBERT configs (a reference), so the NSP head and the NSP pairs and loss cannot disagree."""
from __future__ import annotations

import functools

import jax
import pytest

from configs import common
from pretrain.loops import setup, steps


@pytest.mark.parametrize("spec", ["configs/bert.py:size=tiny", "configs/spanbert.py:size=tiny"])
@pytest.mark.parametrize("key", ["model.next_sentence", "objective.next_sentence"])
def test_either_nsp_key_switches_the_head_and_the_objective_together(spec, key):
    config = common.load(spec)
    turned = not config.objective.next_sentence
    common.apply_setting(config, f"{key}={turned}")  # as --config.KEY=VALUE or --set sets it
    assert config.model.next_sentence is config.objective.next_sentence is turned
    trainer = setup.pretraining_trainer(config)
    assert ("nsp_head" in trainer.abstract_state.params) is turned
    metrics = jax.eval_shape(functools.partial(steps.eval_step, objective=trainer.objective), trainer.abstract_state,
                             trainer.example_rows)
    assert ("nsp_loss" in metrics) is turned
