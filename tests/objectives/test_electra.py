"""ELECTRA's loss by hand on a tiny batch, its masking, and its one-line errors."""
from __future__ import annotations

import math
import types

import jax.numpy as jnp
import numpy as np
import pytest

from configs import electra as electra_configs
from objectives.electra import ElectraPretraining, replaced_token_loss
from objectives.interface import ObjectiveError


def sigmoid_xent(logit: float, label: int) -> float:
    p = 1 / (1 + math.exp(-logit))
    return -math.log(p) if label else -math.log(1 - p)


def test_replaced_token_loss_is_the_mean_sigmoid_cross_entropy_over_real_tokens_by_hand():
    logits = jnp.array([[2.0, -1.0, 0.5, 3.0], [-2.0, 1.0, 0.0, 0.0]])
    replaced = jnp.array([[0, 1, 1, 0], [0, 0, 1, 1]])
    mask = jnp.array([[1, 1, 1, 1], [1, 1, 0, 0]])  # row 1's last two are padding, replaced or not
    loss, metrics = replaced_token_loss(logits, replaced, mask)
    terms = [sigmoid_xent(2.0, 0), sigmoid_xent(-1.0, 1), sigmoid_xent(0.5, 1), sigmoid_xent(3.0, 0),
             sigmoid_xent(-2.0, 0), sigmoid_xent(1.0, 0)]
    assert float(loss) == pytest.approx(sum(terms) / 6, rel=1e-6)
    # predictions (logit > 0): 1 0 1 1 | 0 1 against labels 0 1 1 0 | 0 0: right on tokens 2 and 4, 2 of 6;
    # the replaced real tokens are 1 and 2, and only 2 is found
    assert float(metrics["disc_accuracy"]) == pytest.approx(2 / 6)
    assert float(metrics["disc_replaced_recall"]) == pytest.approx(1 / 2)
    assert float(metrics["replaced_rate"]) == pytest.approx(2 / 6)


def objective(**changes) -> ElectraPretraining:
    config = electra_configs.get_config("size=tiny").objective
    with config.unlocked():
        config.update(changes)
    tokenizer = types.SimpleNamespace(vocab_size=300, pad_id=0, cls_id=2, sep_id=3, mask_id=4,
                                      special_ids=(0, 2, 3, 4), word_start=np.ones(300, bool))
    return ElectraPretraining(config, tokenizer)


def test_the_total_is_generator_mlm_plus_fifty_times_the_discriminator_by_hand():
    mlm_logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]]))  # [1, 2, 3]: targets 0 and 1
    outputs = {"mlm_logits": mlm_logits, "disc_logits": jnp.array([[1.0, -1.0]]), "replaced": jnp.array([[1, 0]])}
    batch = {"masked_lm_ids": jnp.array([[0, 1]]), "masked_lm_weights": jnp.array([[1.0, 1.0]]),
             "input_mask": jnp.array([[1, 1]])}
    loss, metrics = objective().loss(outputs, batch)
    mlm = (-math.log(0.5) - math.log(0.8)) / 2
    disc = (sigmoid_xent(1.0, 1) + sigmoid_xent(-1.0, 0)) / 2
    assert float(metrics["mlm_loss"]) == pytest.approx(mlm, rel=1e-5)
    assert float(metrics["disc_loss"]) == pytest.approx(disc, rel=1e-5)
    assert float(loss) == pytest.approx(mlm + 50 * disc, rel=1e-5)


def test_masking_is_the_papers_85_percent_mask_and_no_random_token():
    batch = objective(max_predictions_per_seq=40).make_batch(
        {"input_ids": np.tile(np.arange(5, 205)[None], (16, 1)), "segment_ids": np.zeros((16, 200), np.int64),
         "input_mask": np.ones((16, 200), np.int64)}, np.random.default_rng(0))
    rows = np.arange(16)[:, None]
    at = batch["input_ids"][rows, batch["masked_lm_positions"]][batch["masked_lm_weights"] > 0]
    originals = batch["masked_lm_ids"][batch["masked_lm_weights"] > 0]
    assert 0.80 < np.mean(at == 4) < 0.90  # [MASK]
    assert np.all((at == 4) | (at == originals))  # the rest kept, none random


@pytest.mark.parametrize("changes, match", [({"next_sentence": True}, "next_sentence=False"),
                                            ({"disc_weight": 0.0}, "disc_weight=0.0 must be > 0")])
def test_bad_settings_are_one_line(changes, match):
    with pytest.raises(ObjectiveError, match=match) as e:
        objective(**changes)
    assert "\n" not in str(e.value)
