"""configs/albert.py through the pretraining set-up: the shared layer, the factorised embeddings and the SOP
head are built, and the pair head's metrics are named sop_*."""
from __future__ import annotations

import functools

import jax

from configs import common
from pretrain.loops import setup, steps


def test_albert_tiny_builds_one_shared_layer_factorised_embeddings_and_reports_sop_metrics():
    config = common.load("configs/albert.py:size=tiny")
    assert config.model.next_sentence and config.objective.sentence_order and config.model.dropout_rate == 0.0
    trainer = setup.pretraining_trainer(config)
    params = trainer.abstract_state.params
    assert {"shared_layer", "embeddings_project"} <= set(params["bert"]) and "layer_0" not in params["bert"]
    assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape[-1] == config.model.embedding_size
    assert "nsp_head" in params
    metrics = jax.eval_shape(functools.partial(steps.eval_step, objective=trainer.objective), trainer.abstract_state,
                             trainer.example_rows)
    assert {"sop_loss", "sop_accuracy"} <= set(metrics) and "nsp_loss" not in metrics
