"""The distillation module (models/distillation/model.py): TinyBERT's layer mapping, students narrower than their teacher
(sizes against transformers and the config's docstring), and the internals it returns when its objective asks."""
from __future__ import annotations

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import models
from configs import distil
from models import attention, stack
from models.bert import BertModel
from models.distillation.model import INTERNALS, DistilConfig, DistillationModel, mapped_layers
from models.errors import ModelInputError

# A student half its teacher's width, with the teacher's heads (what the attention losses pair up).
NARROW = DistilConfig(vocab_size=50, hidden_size=16, num_heads=2, intermediate_size=24, num_layers=2,
                      max_position_embeddings=16, teacher_layers=4, teacher_hidden_size=32,
                      teacher_intermediate_size=48, initializer_range=0.2)  # O(1) activations: differences show


def _inputs(length=7):
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 50, (2, length)), jnp.int32)
    mask = jnp.asarray([[1] * length, [1] * (length - 3) + [0] * 3], jnp.int32)
    return ids, jnp.zeros_like(ids), mask, jnp.asarray([[1, 2], [0, 3]], jnp.int32)


def _count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("student, teacher, expected", [
    (4, 12, (3, 6, 9, 12)),      # TinyBERT-4 of BERT-Base: every third layer, ending at the last
    (6, 12, (2, 4, 6, 8, 10, 12)),
    (1, 2, (2,)),
    (5, 12, (2, 4, 7, 9, 12)),   # m * N / M rounded down where M does not divide N
])
def test_mapped_layers_are_tinybert_uniform_mapping(student, teacher, expected):
    assert mapped_layers(student, teacher) == expected
    if teacher % student == 0:  # the released general_distill.py: teacher_atts[i * k + k - 1], 0-based
        k = teacher // student
        assert [g - 1 for g in mapped_layers(student, teacher)] == [i * k + k - 1 for i in range(student)]


@pytest.mark.parametrize("size", ["tiny_narrow", "tinybert4", "minilm_l6_h384"])
def test_student_parameter_counts_match_transformers_and_the_config_docstring(size):
    """A narrower student keeps token types and the pooler (TinyBERT's, MiniLM's): the student subtree = Hugging
    Face's BertForPreTraining of its shape less the NSP head (2 x D + 2), its `bert` = Hugging Face's BertModel (with
    pooler); both exact counts are in configs/distil.py's docstring. (DistilBERT's shape: tests/models/test_distilbert.py.)"""
    config = distil.get_config(f"size={size}")
    assert not config.model.distilbert_student
    model = models.build_model(config.model)
    ids = jnp.ones((1, 8), jnp.int32)
    student = jax.eval_shape(model.init, jax.random.key(0), ids, ids * 0, ids, ids[:, :2])["params"]["student"]
    m = config.model
    hf_config = transformers.BertConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                                        num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                                        intermediate_size=m.intermediate_size,
                                        max_position_embeddings=m.max_position_embeddings)
    with torch.device("meta"):  # shapes only
        hf_pretraining, hf_bert = transformers.BertForPreTraining(hf_config), transformers.BertModel(hf_config)
    hf_student = sum(p.numel() for p in hf_pretraining.parameters()) - (2 * m.hidden_size + 2)
    assert _count(student) == hf_student
    assert _count(student["bert"]) == sum(p.numel() for p in hf_bert.parameters())
    docstring = re.sub(r"\s+", " ", distil.__doc__)
    assert f"{_count(student):,} parameters ({_count(student['bert']):,} in `student/bert`" in docstring


def test_tinybert4_and_minilm_sizes_are_the_papers():
    shapes = {size: distil.get_config(f"size={size}").model for size in ("tinybert4", "minilm_l6_h384")}
    for size, (layers, hidden, heads, ffn) in {"tinybert4": (4, 312, 12, 1200),
                                               "minilm_l6_h384": (6, 384, 12, 1536)}.items():
        m = shapes[size]
        assert (m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size) == (layers, hidden, heads, ffn)
        assert (m.teacher_layers, m.teacher_hidden_size, m.teacher_num_heads, m.teacher_intermediate_size) == (
            12, 768, 12, 3072)  # BERT-Base


def test_internals_pair_each_student_layer_with_its_mapped_teacher_layer():
    """What the objective reads: the student's scores, values and (through W_h, W_e) states beside the teacher's at
    g(m) = 2m, each equal to the teacher's BertModel internals at that layer."""
    config = NARROW
    model, inputs = DistillationModel(config), _inputs()
    params = nn.unbox(model.init(jax.random.key(0), *inputs, internals=INTERNALS)["params"])
    out = model.apply({"params": params}, *inputs, internals=INTERNALS)
    _, _, teacher = BertModel(config.teacher()).apply({"params": params["teacher"]["bert"]}, *inputs[:3],
                                                      return_internals=True)
    _, _, student = BertModel(config.student()).apply({"params": params["student"]["bert"]}, *inputs[:3],
                                                      return_internals=True)
    assert out["attention_scores"].shape == (2, 2, 2, 7, 7)  # [M, B, H, L, L]
    for key in ("scores", "values"):
        np.testing.assert_array_equal(out[f"attention_{key}"], student[key])
        np.testing.assert_array_equal(out[f"teacher_attention_{key}"], teacher[key][jnp.asarray([1, 3])])
    np.testing.assert_array_equal(out["teacher_hidden_states"], teacher["hidden"][jnp.asarray([1, 3])])
    np.testing.assert_array_equal(out["teacher_embeddings"], teacher["embeddings"])
    for name, key in (("hidden_fit", "hidden"), ("embedding_fit", "embeddings")):
        fit = params[name]
        assert fit["kernel"].shape == (16, 32)  # student width -> teacher width
        expected = np.asarray(student[key]) @ np.asarray(fit["kernel"]) + np.asarray(fit["bias"])
        np.testing.assert_allclose(out[f"{key}_states" if key == "hidden" else key], expected, atol=1e-5)


def test_without_internals_no_fit_parameters_and_no_attention_weights(monkeypatch):
    """DistilBERT's run asks for nothing: W_h and W_e do not exist, and the attention never runs the reference
    for its weights (the configured kernel computes it)."""
    model, inputs = DistillationModel(NARROW), _inputs()
    params = model.init(jax.random.key(0), *inputs)["params"]
    assert set(params) == {"student", "teacher"}

    def refused(*args, **kwargs):
        raise AssertionError("attention weights computed on the normal path")
    monkeypatch.setattr(attention, "attention_with_weights", refused)
    out = model.apply({"params": params}, *inputs)
    assert set(out) == {"mlm_logits", "hidden", "teacher_mlm_logits", "teacher_hidden"}
    with pytest.raises(AssertionError, match="normal path"):
        model.apply({"params": params}, *inputs, internals=("attention",))


def test_attention_internals_of_students_with_other_heads_are_a_one_line_error():
    config = dataclasses.replace(NARROW, num_heads=4, teacher_num_heads=2)
    model, inputs = DistillationModel(config), _inputs()
    model.init(jax.random.key(0), *inputs, internals=("hidden_states",))  # no attention: any heads
    with pytest.raises(ModelInputError, match="num_heads=2") as error:
        model.init(jax.random.key(0), *inputs, internals=("attention",))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("fields, words", [
    ({"num_layers": 5}, "num_layers=5 is more than the teacher's 4 layers"),  # narrow: any depth up to the teacher's
    ({"teacher_num_heads": 5}, "teacher_num_heads=5 does not divide the teacher's width 32"),
])
def test_bad_narrow_students_are_one_line_errors(fields, words):
    with pytest.raises(ModelInputError, match=words) as error:
        dataclasses.replace(NARROW, **fields)
    assert "\n" not in str(error.value)


def test_a_narrow_student_starts_fresh_and_a_wide_one_copies():
    assert not NARROW.copies_teacher
    assert dataclasses.replace(NARROW, teacher_hidden_size=0, teacher_intermediate_size=0).copies_teacher
    assert NARROW.teacher().hidden_size == 32 and NARROW.student().hidden_size == 16


def test_scanned_internals_equal_looped_ones():
    """config.model.scan_layers: the scanned module, on the looped weights restacked, returns the same internals."""
    model, inputs = DistillationModel(NARROW), _inputs()
    params = model.init(jax.random.key(0), *inputs, internals=INTERNALS)["params"]
    looped = model.apply({"params": params}, *inputs, internals=INTERNALS)
    scanned = DistillationModel(dataclasses.replace(NARROW, scan_layers=True)).apply(
        {"params": stack.to_layout(params, scan=True)}, *inputs, internals=INTERNALS)
    for key, value in looped.items():
        np.testing.assert_allclose(scanned[key], value, atol=1e-5, err_msg=key)
