"""Every objective implements the declared protocol (objectives/interface.py), with no stubs: isinstance on a
runtime Protocol checks method names only, so each method is also checked against the protocol's signature and
called on a small case (instances -> batch -> the model's inputs -> the real model, abstractly -> the loss)."""
import inspect
import types
import typing

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
import objectives
from configs import bert, electra, gpt2, spanbert, t5
from objectives.task_heads.objective import FineTuningObjective
from objectives.interface import Objective, ObjectiveError, PhasedObjective, StepObjective, eos_id_or_none
from tests.helpers.data import random_documents

VOCAB = 300


def fake_tokenizer(**extra):
    return types.SimpleNamespace(vocab_size=VOCAB, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, eos_id=3,
                                 special_ids=(0, 2, 3, 4), word_start=np.ones(VOCAB, bool), num_extra_ids=100,
                                 sentinel_id=lambda k: VOCAB - 1 - k, **extra)


CONFIG_FILES = {  # objective name -> a config file's tiny config
    "bert_pretraining": bert.get_config("size=tiny"),
    "spanbert": spanbert.get_config("size=tiny"),
    "electra": electra.get_config("size=tiny"),
    "span_corruption": t5.get_config("size=tiny"),
    "causal_lm": gpt2.get_config("size=tiny"),
}
CONFIGS = {name: config.objective for name, config in CONFIG_FILES.items()}  # their objective sections
MAX_SEQ_LENGTH, BATCH = 32, 4


def protocol_methods(protocol: type) -> list[str]:
    """The methods a Protocol declares, its bases' included (typing.get_protocol_members from Python 3.13)."""
    return sorted({name for cls in protocol.__mro__ if cls not in (typing.Protocol, typing.Generic, object)
                   and getattr(cls, "_is_protocol", False)
                   for name, value in vars(cls).items() if callable(value) and not name.startswith("_")})


def assert_implements(objective, protocol: type) -> None:
    """isinstance, and every method of the protocol callable as the protocol declares it: the same parameters
    (names and kinds, `self` aside), anything more optional."""
    assert isinstance(objective, protocol)
    for name in protocol_methods(protocol):
        declared = list(inspect.signature(getattr(protocol, name)).parameters.values())[1:]
        actual = list(inspect.signature(getattr(objective, name)).parameters.values())
        assert [(p.name, p.kind) for p in actual[:len(declared)]] == [(p.name, p.kind) for p in declared], name
        assert all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                   for p in actual[len(declared):]), name


def assert_same_arrays(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def assert_runs_as_declared(objective, model_config) -> None:
    """create_instances -> make_batch (each a pure function of its rng) -> model_inputs -> the real model of the
    config (abstractly: jax.eval_shape, nothing compiles) -> loss: a scalar and metrics holding it."""
    documents = random_documents(30)
    instances = objective.create_instances(documents, np.random.default_rng(0), MAX_SEQ_LENGTH)
    assert_same_arrays(instances, objective.create_instances(documents, np.random.default_rng(0), MAX_SEQ_LENGTH))
    assert len({len(v) for v in instances.values()}) == 1 and len(next(iter(instances.values()))) >= BATCH
    rows = {k: v[:BATCH] for k, v in instances.items()}
    batch = objective.make_batch(rows, np.random.default_rng(1))
    assert_same_arrays(batch, objective.make_batch(rows, np.random.default_rng(1)))
    assert all(isinstance(v, np.ndarray) and v.shape[0] == BATCH for v in batch.values())
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    inputs = objective.model_inputs(batch)
    assert inputs and all(v.shape[0] == BATCH for v in inputs.values())
    model = models.build_model({**model_config.to_dict(), "vocab_size": VOCAB})

    def loss():
        params = nn.unbox(model.init(jax.random.key(0), **inputs, deterministic=True))
        return objective.loss(model.apply(params, **inputs, deterministic=True), batch)
    value, metrics = jax.eval_shape(loss)
    assert value.shape == () and metrics["loss"].shape == ()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_objectives_implement_the_protocol(name):
    objective = objectives.build_objective(CONFIGS[name], fake_tokenizer())
    assert_implements(objective, Objective)
    assert_implements(objective, StepObjective)
    assert_runs_as_declared(objective, CONFIG_FILES[name].model)
    # BERT's masked-position budget is no longer forced on the others as a stub
    assert not hasattr(objective, "max_predictions") or name in ("bert_pretraining", "spanbert", "electra")


def test_prefix_lm_implements_the_protocol():
    config = gpt2.get_config("size=tiny").objective
    config.unlock()
    config.name = "prefix_lm"
    objective = objectives.build_objective(config, fake_tokenizer())
    assert_implements(objective, Objective)
    assert not isinstance(objective, PhasedObjective)
    assert_runs_as_declared(objective, gpt2.get_config("size=tiny").model)


def test_the_signature_check_sees_what_isinstance_does_not():
    class NamesOnly:  # the protocol's method names with other parameters: isinstance says yes
        def model_inputs(self):
            return {}

        def loss(self, outputs, batch, weights):
            return 0.0, {}

    assert isinstance(NamesOnly(), StepObjective)
    with pytest.raises(AssertionError, match="loss"):
        assert_implements(NamesOnly(), StepObjective)
    assert protocol_methods(PhasedObjective) == ["create_instances", "for_long_phase", "loss", "make_batch",
                                                 "model_inputs"]


@pytest.mark.parametrize("name", ["bert_pretraining", "spanbert"])
def test_bert_long_phase_masks_more(name):
    config = CONFIGS[name]
    objective = objectives.build_objective(config, fake_tokenizer())
    assert_implements(objective, PhasedObjective)
    long = objective.for_long_phase()
    assert type(long) is type(objective)
    assert_implements(long, Objective)
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
    objective = FineTuningObjective(kind, labels)
    assert_implements(objective, StepObjective)
    assert not isinstance(objective, Objective)
    # called as the steps call them, on uniform logits: the loss is log(classes), the mean square for regression
    b, length, spans = 3, 6, 2
    batch = {"input_ids": jnp.ones((b, length), jnp.int32), "segment_ids": jnp.zeros((b, length), jnp.int32),
             "input_mask": jnp.ones((b, length), jnp.int32), "weight": jnp.array([1.0, 1.0, 0.0]),
             "label": jnp.array([1.0, 0.5, 7.0]) if kind == "regression" else jnp.array([0, 1, 2]) % labels,
             "labels": jnp.zeros((b, length), jnp.int32), "spans": jnp.zeros((b, spans, 2), jnp.int32),
             "span_labels": jnp.zeros((b, spans), jnp.int32),
             "start_position": jnp.zeros((b,), jnp.int32), "end_position": jnp.zeros((b,), jnp.int32)}
    inputs = objective.model_inputs(batch)
    assert set(inputs) == {"input_ids", "segment_ids", "input_mask"} | ({"spans"} if kind == "span" else set())
    shape = {"tagging": (b, length, labels), "span": (b, spans, labels)}.get(kind, (b, labels))
    outputs = ({"start_logits": jnp.zeros((b, length)), "end_logits": jnp.zeros((b, length))} if kind == "qa" else
               {"logits": jnp.zeros(shape)})
    loss, metrics = objective.loss(outputs, batch)
    expected = {"regression": (1.0 + 0.25) / 2, "qa": np.log(length)}.get(kind, np.log(labels))
    assert float(loss) == pytest.approx(expected, rel=1e-5) and float(metrics["loss"]) == float(loss)
    assert float(metrics["examples"]) == 2.0  # the padding row weighs nothing


def test_unknown_names_raise_the_layer_error():
    with pytest.raises(ObjectiveError, match="config.objective.name='nope' is unknown"):
        objectives.build_objective(types.SimpleNamespace(name="nope"), fake_tokenizer())
    with pytest.raises(ObjectiveError, match="fine-tuning task kind .* is unknown"):
        FineTuningObjective("nope", 2)


def test_eos_id_or_none_reads_a_missing_token_as_none():
    class NoEos:
        @property
        def eos_id(self):
            raise LookupError("no </s>")

    assert eos_id_or_none(NoEos()) is None
    assert eos_id_or_none(types.SimpleNamespace()) is None
    assert eos_id_or_none(types.SimpleNamespace(eos_id=np.int64(5))) == 5
