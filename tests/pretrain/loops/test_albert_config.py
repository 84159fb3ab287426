"""configs/albert.py through the pretraining set-up: the shared layer, the factorised embeddings and the SOP
head are built, and the pair head's metrics are named sop_*; the paper recipe's optimizer and masking."""
from __future__ import annotations

import functools

import jax
import numpy as np

from configs import common
from pretrain.loops import setup, steps
from tests.helpers.tiny_bert import tiny_config


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


def test_albert_paper_recipe_is_lamb_at_its_learning_rate_with_ngram_masking():
    """Lan et al. 2020, Section 4.1, and ALBERT's optimization.py: LAMB, lr 0.00176, b1 0.9, b2 0.999, eps 1e-6,
    weight decay 0.01, gradients clipped at norm 1; n-grams of up to 3 whole words. The short recipe (tiny) keeps
    AdamW, and masks n-grams too."""
    paper, short = common.load("configs/albert.py:size=base"), common.load("configs/albert.py:size=tiny")
    assert dict(paper.optimizer) == dict(name="lamb", learning_rate=0.00176, end_learning_rate=0.0,
                                         schedule="warmup_linear_decay", warmup_steps=3125, b1=0.9, b2=0.999,
                                         eps=1e-6, weight_decay=0.01, grad_clip_norm=1.0,
                                         ramp_accumulation=1, ramp_fraction=0.6)  # ramp_accumulation 1: no batch ramp
    assert short.optimizer.name == "adamw"
    for config in (paper, short):
        objective = config.objective
        assert (objective.masking, objective.ngram_max, objective.whole_word_masking) == ("ngrams", 3, True)
        assert objective.sentence_order and objective.mask_prob == 0.15


def test_albert_tiny_trains_a_few_steps_with_ngram_masking_and_sop(tmp_path, corpus_and_tokenizer):
    """configs/albert.py:size=tiny through the real loop (the tests' tiny sizes, E 16 below H 32): n-gram batches
    feed the shared layer and the SOP head, and the loss is MLM + SOP."""
    from pretrain.loops import pretraining
    config = tiny_config(*corpus_and_tokenizer, spec="configs/albert.py:size=tiny", num_train_steps=3,
                         checkpoint_every=3, **{"model.embedding_size": 16})
    assert config.objective.masking == "ngrams" and config.objective.sentence_order
    metrics = pretraining.train_and_evaluate(config, str(tmp_path / "albert"))
    assert np.isfinite(metrics["loss"]) and (tmp_path / "albert" / "checkpoints" / "3").is_dir()
    assert abs(metrics["loss"] - metrics["mlm_loss"] - metrics["sop_loss"]) < 1e-4
