"""ULMFiT's discriminative fine-tuning (Howard & Ruder 2018, Section 3.2) as config.discriminative_factor: through the
fine-tuning loop's make_optimizer, every layer's update is the factor-1 update / factor^(its distance below the top
layer), the embeddings' / factor^num_layers, the head's and the top blocks' unchanged; looped, scanned (one rate per
slice) and shared (ALBERT) stacks of BERT and ModernBERT."""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import glue
from models import modernbert, modernbert_tasks
from models.bert import BertConfig
from models.bert_tasks import BertForFineTuning
from objectives.task_heads import head_kind
from pretrain.loops import finetuning
from pretrain.runtime.errors import ConfigError
from pretrain.training import discriminative, freezing, train_state, validation

LAYERS, FACTOR = 3, 2.6


def _bert(**kw):
    config = BertConfig(vocab_size=40, hidden_size=16, num_layers=LAYERS, num_heads=2, intermediate_size=32,
                        max_position_embeddings=16, **kw)
    return BertForFineTuning(config, head_kind("classification"), 3)


def _modernbert(**kw):
    config = modernbert.ModernBertConfig(vocab_size=40, hidden_size=16, num_layers=LAYERS, num_heads=2,
                                         intermediate_size=32, max_position_embeddings=16, local_attention=8, **kw)
    return modernbert_tasks.ModernBertForFineTuning(config, head_kind("classification"), 3)


MODELS = {"bert": lambda: _bert(), "bert scanned": lambda: _bert(scan_layers=True),
          "albert shared": lambda: _bert(shared_layers=True, embedding_size=8),
          "modernbert": lambda: _modernbert(), "modernbert scanned": lambda: _modernbert(scan_layers=True)}


def _params(model) -> dict:
    ids = jnp.ones((2, 8), jnp.int32)
    return train_state.unbox(model.init(jax.random.key(0), ids, jnp.zeros_like(ids), jnp.ones_like(ids))["params"])


def _updates(params: dict, factor: float, **config_keys) -> dict:
    """One update of the loop's optimizer (AdamW, weight decay on, a constant rate) from fixed random gradients."""
    config = glue.get_config("task=mrpc")
    config.update_from_flattened_dict({"discriminative_factor": factor, "optimizer.schedule": "constant",
                                       "optimizer.warmup_steps": 0, **config_keys})
    finetuner = types.SimpleNamespace(num_layers=LAYERS, name="bert")
    tx = finetuning.make_optimizer(config, params, steps_per_epoch=4, finetuner=finetuner)[0]
    leaves, tree = jax.tree.flatten(params)
    grads = jax.tree.unflatten(tree, [jax.random.normal(jax.random.key(i), p.shape) for i, p in enumerate(leaves)])
    return jax.device_get(jax.jit(tx.update)(grads, tx.init(params), params)[0])


def _expected(names: list[str], leaf, looped_beside: int) -> float | np.ndarray:
    """factor^-(distance below the top layer), written out for the blocks these models have."""
    if names[0] not in ("bert", "modernbert") or names[1] in ("pooler", "final_norm", "shared_layer"):
        return 1.0                                     # head, ModernBERT's prediction head, the top blocks, shared
    if names[1].startswith("layer_"):
        return FACTOR ** -(LAYERS - 1 - int(names[1][len("layer_"):]))
    if names[1] == "layers":                           # slice i is layer looped_beside + i
        depths = LAYERS - 1 - (looped_beside + np.arange(leaf.shape[0]))
        return (FACTOR ** -depths.astype(float)).reshape((-1,) + (1,) * (leaf.ndim - 1))
    assert names[1] in ("embeddings", "embeddings_project"), names
    return FACTOR ** -LAYERS


@pytest.mark.parametrize("kind", list(MODELS))
def test_each_layers_rate_is_the_one_above_over_the_factor(kind):
    params = _params(MODELS[kind]())
    body = "modernbert" if "modernbert" in params else "bert"
    looped_beside = sum(1 for k in params[body] if k.startswith("layer_"))
    base, scaled = _updates(params, 1.0), _updates(params, FACTOR)
    flat_base = jax.tree_util.tree_flatten_with_path(base)[0]
    seen = set()
    for (path, u1), uf in zip(flat_base, jax.tree.leaves(scaled)):
        names = freezing.path_names(path)
        expected = _expected(names, u1, looped_beside)
        np.testing.assert_allclose(uf, u1 * np.float32(expected) if np.ndim(expected) == 0 else
                                   u1 * expected.astype(np.float32), rtol=2e-7, atol=0, err_msg="/".join(names))
        seen.add(names[1] if len(names) > 1 and names[0] != "head" else names[0])
    assert "head" in seen and ({"embeddings"} <= seen)
    if kind == "bert scanned":
        assert "layers" in seen and not any(s.startswith("layer_") for s in seen)


def test_the_lowest_layer_and_the_embeddings_of_a_bert():
    """The numbers spelled out for 3 layers at 2.6: top x1, middle x1/2.6, lowest x1/2.6^2, embeddings x1/2.6^3."""
    scales = discriminative.rate_scales(_params(_bert()), FACTOR, LAYERS)
    rates = {block: {float(x) for x in jax.tree.leaves(scales["bert"][block])} for block in scales["bert"]}
    assert rates == {"embeddings": {FACTOR ** -3}, "layer_0": {FACTOR ** -2}, "layer_1": {FACTOR ** -1},
                     "layer_2": {1.0}, "pooler": {1.0}}
    assert set(jax.tree.leaves(scales["head"])) == {1.0}
    text = discriminative.describe(scales)
    assert "bert/embeddings x0.0569" in text and "bert/layer_2 x1" in text and "head x1" in text


def test_weights_the_checkpoint_lacked_train_at_the_base_rate():
    params = _params(_bert())
    scales = discriminative.rate_scales(params, FACTOR, LAYERS, fresh=["bert/layer_0/attention/query/kernel"])
    assert scales["bert"]["layer_0"]["attention"]["query"]["kernel"] == 1.0
    assert scales["bert"]["layer_0"]["attention"]["key"]["kernel"] == pytest.approx(FACTOR ** -2)


def test_the_head_learning_rate_still_applies_to_the_head():
    params = _params(_bert())
    base = _updates(params, 1.0)
    scaled = _updates(params, FACTOR, head_learning_rate=1e-3)  # 50 x the base 2e-5
    for u1, uf in zip(jax.tree.leaves(base["head"]), jax.tree.leaves(scaled["head"])):
        np.testing.assert_allclose(uf, u1 * np.float32(1e-3 / 2e-5), rtol=1e-6)


def test_a_model_without_a_registered_body_is_a_one_line_error():
    with pytest.raises(ConfigError) as info:
        discriminative.rate_scales({"encoder": {"w": np.zeros(2)}, "decoder": {"w": np.zeros(2)}}, FACTOR, 2)
    assert "\n" not in str(info.value) and "config.discriminative_factor=2.6" in str(info.value)


def test_a_factor_below_one_and_one_with_peft_are_one_line_errors():
    config = glue.get_config("task=mrpc")
    config.discriminative_factor = 0.5
    with pytest.raises(ConfigError, match=r"config\.discriminative_factor=0\.5 is invalid: it must be a number >= 1"):
        validation.check_ranges(config)
    config = glue.get_config("task=mrpc,peft=lora")
    config.update_from_flattened_dict({"discriminative_factor": 2.6, "init": "/some/run"})
    with pytest.raises(ConfigError) as info:
        validation.check_relations(config)
    message = str(info.value)
    assert "\n" not in message and "config.discriminative_factor=2.6" in message
    assert "--config.discriminative_factor=1" in message and "peft" in message
