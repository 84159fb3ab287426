"""DistilBERT's triple loss (objectives/distillation.py) against a hand computation in numpy."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from configs import distil
from objectives import build_objective
from objectives.interface import ObjectiveError


def _objective(**overrides):
    config = distil.get_config("size=tiny").objective
    with config.unlocked():
        config.update(overrides)
    return build_objective(config, tokenizer=None)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _batch_and_outputs(seed=0):
    rng = np.random.default_rng(seed)
    B, L, P, V, D = 2, 5, 3, 7, 4
    outputs = {"mlm_logits": rng.normal(size=(B, P, V)), "teacher_mlm_logits": rng.normal(size=(B, P, V)) * 3,
               "hidden": rng.normal(size=(B, L, D)), "teacher_hidden": rng.normal(size=(B, L, D))}
    batch = {"masked_lm_ids": rng.integers(0, V, (B, P)),
             "masked_lm_weights": np.array([[1, 1, 0], [1, 0, 0]], np.float32),
             "input_mask": np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], np.int32)}
    # Padding positions carry wild values: they must not reach the loss.
    outputs["hidden"][0, 4] = outputs["teacher_hidden"][0, 4] * -5
    return batch, outputs


def _hand_loss(batch, outputs, T, alpha_ce, alpha_mlm, alpha_cos):
    w = batch["masked_lm_weights"].astype(bool)
    s, t = outputs["mlm_logits"][w], outputs["teacher_mlm_logits"][w]  # [n masked, V]
    ce = -_log_softmax(s)[np.arange(len(s)), batch["masked_lm_ids"][w]].mean()
    log_ps, log_pt = _log_softmax(s / T), _log_softmax(t / T)
    kl = T * T * (np.exp(log_pt) * (log_pt - log_ps)).sum(-1).mean()
    real = batch["input_mask"].astype(bool)
    a, b = outputs["hidden"][real], outputs["teacher_hidden"][real]  # [n real, D]
    cos = 1 - ((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))).mean()
    return alpha_ce * kl + alpha_mlm * ce + alpha_cos * cos, kl, ce, cos


@pytest.mark.parametrize("T", [1.0, 2.0, 4.0])
def test_loss_is_the_weighted_sum_of_kl_mlm_and_cosine_by_hand(T):
    batch, outputs = _batch_and_outputs()
    objective = _objective(temperature=T)
    loss, metrics = objective.loss({k: jnp.asarray(v, jnp.float32) for k, v in outputs.items()},
                                   {k: jnp.asarray(v) for k, v in batch.items()})
    total, kl, ce, cos = _hand_loss(batch, outputs, T, 5.0, 2.0, 1.0)
    assert float(metrics["soft_target_loss"]) == pytest.approx(kl, rel=1e-5)
    assert float(metrics["mlm_loss"]) == pytest.approx(ce, rel=1e-5)
    assert float(metrics["cosine_loss"]) == pytest.approx(cos, rel=1e-5)
    assert float(loss) == pytest.approx(total, rel=1e-5) and float(metrics["loss"]) == float(loss)
    assert float(metrics["tokens"]) == 6


def test_identical_student_and_teacher_cost_only_the_mlm_term():
    batch, outputs = _batch_and_outputs(1)
    outputs["teacher_mlm_logits"], outputs["teacher_hidden"] = outputs["mlm_logits"], outputs["hidden"] * 3.0
    loss, metrics = _objective().loss({k: jnp.asarray(v, jnp.float32) for k, v in outputs.items()}, batch)
    assert abs(float(metrics["soft_target_loss"])) < 1e-6 and abs(float(metrics["cosine_loss"])) < 1e-6
    assert float(loss) == pytest.approx(2.0 * float(metrics["mlm_loss"]), rel=1e-6)


def test_a_zero_alpha_skips_its_term():
    batch, outputs = _batch_and_outputs()
    loss, metrics = _objective(alpha_ce=0.0).loss({k: jnp.asarray(v, jnp.float32) for k, v in outputs.items()}, batch)
    assert "soft_target_loss" not in metrics
    assert float(loss) == pytest.approx(_hand_loss(batch, outputs, 2.0, 0.0, 2.0, 1.0)[0], rel=1e-5)


@pytest.mark.parametrize("overrides, words", [
    ({"next_sentence": True}, "next_sentence=True"),
    ({"temperature": 0.0}, "temperature=0.0"),
    ({"alpha_ce": 0.0, "alpha_mlm": 0.0, "alpha_cos": 0.0}, "alphas"),
])
def test_bad_settings_are_one_line_errors(overrides, words):
    with pytest.raises(ObjectiveError) as error:
        _objective(**overrides)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_task_distillation_mixes_soft_targets_and_labels_by_hand():
    """objectives/finetuning.py's distilled classification loss: alpha * T^2 KL + (1 - alpha) * CE over real rows."""
    from objectives.finetuning import FineTuningObjective
    rng = np.random.default_rng(3)
    logits, teacher = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)) * 2
    batch = {"label": np.array([0, 2, 1, 0]), "weight": np.array([1, 1, 1, 0], np.float32), "teacher_logits": teacher}
    objective = FineTuningObjective("classification", 3).distilled(0.3, 2.0)
    loss, metrics = objective.loss({"logits": jnp.asarray(logits)}, batch)
    real = slice(0, 3)
    ce = -_log_softmax(logits[real])[np.arange(3), batch["label"][real]].mean()
    log_ps, log_pt = _log_softmax(logits[real] / 2.0), _log_softmax(teacher[real] / 2.0)
    kl = 4.0 * (np.exp(log_pt) * (log_pt - log_ps)).sum(-1).mean()
    assert float(metrics["label_loss"]) == pytest.approx(ce, rel=1e-5)
    assert float(metrics["soft_target_loss"]) == pytest.approx(kl, rel=1e-5)
    assert float(loss) == pytest.approx(0.3 * kl + 0.7 * ce, rel=1e-5)
    # Without the field (dev batches) it is the plain cross-entropy.
    plain, _ = objective.loss({"logits": jnp.asarray(logits)}, {k: batch[k] for k in ("label", "weight")})
    assert float(plain) == pytest.approx(ce, rel=1e-5)
    with pytest.raises(ObjectiveError, match="classification"):
        FineTuningObjective("regression", 1).distilled(0.5, 2.0)
