"""DistilBERT's triple loss (objectives/distillation/objective.py) against a hand computation in numpy."""
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
    """objectives/task_heads/classification.py's distilled classification loss: alpha * T^2 KL + (1 - alpha) * CE over real rows."""
    from objectives.task_heads.objective import FineTuningObjective
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


# ----- TinyBERT's and MiniLM's losses (objectives/distillation/layer_losses.py) against numpy, on a padded batch -----
PADDING = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)  # [B, L]: the second row has two padded tokens


def _softmax(x):
    return np.exp(_log_softmax(x))


def _kl_by_hand(student, teacher):
    """[B, H, L, L] logits -> mean over heads and real queries of KL(softmax(teacher) || softmax(student)) over the
    real keys, one (row, head, query) at a time."""
    terms = []
    for b, row in enumerate(PADDING):
        n = row.sum()
        for h in range(student.shape[1]):
            for t in range(n):
                p, q = _softmax(teacher[b, h, t, :n]), _softmax(student[b, h, t, :n])
                terms.append((p * np.log(p / q)).sum())
    return np.mean(terms)


def _scores(seed, layers=None, heads=3, scale=2.0):
    rng = np.random.default_rng(seed)
    shape = (2, heads, 5, 5) if layers is None else (layers, 2, heads, 5, 5)
    scores = rng.normal(size=shape) * scale
    padded = np.broadcast_to(~PADDING.astype(bool)[:, None, None, :], (2, heads, 5, 5)).copy()  # padded keys
    padded |= ~PADDING.astype(bool)[:, None, :, None]                                          # padded queries
    scores[..., padded] = 1e4  # wild values where a padded token is the query or the key: they must not count
    return scores


def test_minilm_attention_kl_by_hand():
    from objectives.distillation.layer_losses import attention_kl
    student, teacher = _scores(0), _scores(1, scale=3.0)
    ours = attention_kl(jnp.asarray(student, jnp.float32), jnp.asarray(teacher, jnp.float32), jnp.asarray(PADDING))
    assert float(ours) == pytest.approx(_kl_by_hand(student, teacher), rel=1e-5)
    assert float(attention_kl(jnp.asarray(teacher), jnp.asarray(teacher), jnp.asarray(PADDING))) == pytest.approx(0,
                                                                                                                 abs=1e-6)


def test_minilm_value_relation_kl_by_hand_with_its_own_head_size_per_model():
    from objectives.distillation.layer_losses import value_relation_kl
    rng = np.random.default_rng(2)
    values, teacher_values = rng.normal(size=(2, 5, 3, 4)), rng.normal(size=(2, 5, 3, 8))  # [B, L, H, K]: K 4 and 8
    values[1, 3:], teacher_values[1, 3:] = 50.0, -50.0  # padded tokens: neither a query nor a key
    relation = np.einsum("blhk,bshk->bhls", values, values) / np.sqrt(4)
    teacher_relation = np.einsum("blhk,bshk->bhls", teacher_values, teacher_values) / np.sqrt(8)
    ours = value_relation_kl(jnp.asarray(values, jnp.float32), jnp.asarray(teacher_values, jnp.float32),
                             jnp.asarray(PADDING))
    assert float(ours) == pytest.approx(_kl_by_hand(relation, teacher_relation), rel=1e-5)


def test_tinybert_attention_mse_by_hand_and_as_the_released_code_without_padding():
    from objectives.distillation.layer_losses import attention_mse
    student, teacher = _scores(3, layers=2), _scores(4, layers=2)
    expected = 0.0
    for m in range(2):  # summed over the layer pairs; per pair, the mean over heads and real (query, key) pairs
        squares = [(student[m, b, h, :n, :n] - teacher[m, b, h, :n, :n]) ** 2
                   for b, n in enumerate(PADDING.sum(1)) for h in range(3)]
        expected += np.concatenate([s.ravel() for s in squares]).mean()
    ours = attention_mse(jnp.asarray(student, jnp.float32), jnp.asarray(teacher, jnp.float32), jnp.asarray(PADDING))
    assert float(ours) == pytest.approx(expected, rel=1e-5)
    # Without padding: general_distill.py's sum over layers of MSELoss() (every entry of [B, H, L, L]).
    full = np.ones_like(PADDING)
    released = sum(((student[m] - teacher[m]) ** 2).mean() for m in range(2))
    assert float(attention_mse(jnp.asarray(student), jnp.asarray(teacher), jnp.asarray(full))) == pytest.approx(
        released, rel=1e-5)


def test_tinybert_hidden_mse_by_hand_over_layers_and_for_the_embeddings():
    from objectives.distillation.layer_losses import hidden_mse
    rng = np.random.default_rng(5)
    states, teacher = rng.normal(size=(3, 2, 5, 6)), rng.normal(size=(3, 2, 5, 6))  # [M, B, L, D_teacher]
    states[:, 1, 3:] = 1e3  # padded tokens
    real = PADDING.astype(bool)
    expected = sum(((states[m][real] - teacher[m][real]) ** 2).mean() for m in range(3))
    ours = hidden_mse(jnp.asarray(states, jnp.float32), jnp.asarray(teacher, jnp.float32), jnp.asarray(PADDING))
    assert float(ours) == pytest.approx(expected, rel=1e-5)
    embeddings = hidden_mse(jnp.asarray(states[0], jnp.float32), jnp.asarray(teacher[0], jnp.float32),
                            jnp.asarray(PADDING))  # [B, L, D]: one pair
    assert float(embeddings) == pytest.approx(((states[0][real] - teacher[0][real]) ** 2).mean(), rel=1e-5)


def _internals(seed=6):
    """What the model returns for every internal (2 student layers, the teacher's mapped ones), padded."""
    rng = np.random.default_rng(seed)
    return {"attention_scores": _scores(seed, layers=2), "teacher_attention_scores": _scores(seed + 1, layers=2),
            "attention_values": rng.normal(size=(2, 2, 5, 3, 4)),
            "teacher_attention_values": rng.normal(size=(2, 2, 5, 3, 8)),
            "hidden_states": rng.normal(size=(2, 2, 5, 6)), "teacher_hidden_states": rng.normal(size=(2, 2, 5, 6)),
            "embeddings": rng.normal(size=(2, 5, 6)), "teacher_embeddings": rng.normal(size=(2, 5, 6))}


@pytest.mark.parametrize("loss, internals, metrics", [
    ("distilbert", (), ("soft_target_loss", "cosine_loss")),
    ("tinybert", ("attention", "embeddings", "hidden_states"), ("attention_mse", "hidden_mse", "embedding_mse")),
    ("minilm", ("attention",), ("attention_kl", "value_relation_kl")),
])
def test_each_loss_asks_the_model_for_its_internals_and_weighs_its_terms(loss, internals, metrics):
    from objectives.distillation import layer_losses as layer
    config = distil.get_config(f"size=tiny,loss={loss}").objective
    objective = build_objective(config, tokenizer=None)
    batch, outputs = _batch_and_outputs()
    batch["input_mask"] = PADDING
    outputs.update(_internals())
    assert objective.internals == internals
    assert objective.model_inputs({**batch, "input_ids": 0, "segment_ids": 0, "masked_lm_positions": 0}).get(
        "internals", ()) == internals
    loss_value, got = objective.loss({k: jnp.asarray(v, jnp.float32) for k, v in outputs.items()},
                                     {k: jnp.asarray(v) for k, v in batch.items()})
    assert set(metrics) <= set(got) and not set(got) & ({"soft_target_loss", "cosine_loss", "attention_mse",
                                                          "hidden_mse", "embedding_mse", "attention_kl",
                                                          "value_relation_kl"} - set(metrics))
    o, mask = {k: jnp.asarray(v, jnp.float32) for k, v in outputs.items()}, jnp.asarray(PADDING)
    by_name = {"attention_kl": layer.attention_kl(o["attention_scores"][-1], o["teacher_attention_scores"][-1], mask),
               "value_relation_kl": layer.value_relation_kl(o["attention_values"][-1],
                                                            o["teacher_attention_values"][-1], mask),
               "attention_mse": layer.attention_mse(o["attention_scores"], o["teacher_attention_scores"], mask),
               "hidden_mse": layer.hidden_mse(o["hidden_states"], o["teacher_hidden_states"], mask),
               "embedding_mse": layer.hidden_mse(o["embeddings"], o["teacher_embeddings"], mask)}
    alphas = {"soft_target_loss": 5.0, "cosine_loss": 1.0}  # distilbert's; tinybert's and minilm's are 1.0 each
    expected = (2.0 if loss == "distilbert" else 0.0) * float(got["mlm_loss"])
    for name in metrics:
        if name in by_name:
            assert float(got[name]) == pytest.approx(float(by_name[name]), rel=1e-6)
        expected += alphas.get(name, 1.0) * float(got[name])
    assert float(loss_value) == pytest.approx(expected, rel=1e-5)
