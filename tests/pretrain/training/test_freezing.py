"""Freezing strategies: which parameters train when, and frozen ones stay bitwise unchanged."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from models.bert import BertConfig
from models.bert_tasks import BertForFineTuning
from objectives.task_heads import head_kind
from pretrain.runtime.errors import ConfigError
from pretrain.training import freezing, optimizers, train_state

NUM_LAYERS, STEPS_PER_EPOCH = 3, 4


def _model_and_params():
    config = BertConfig(vocab_size=40, hidden_size=16, num_layers=NUM_LAYERS, num_heads=2, intermediate_size=32,
                        max_position_embeddings=16, dropout_rate=0.0, attention_dropout_rate=0.0)
    model = BertForFineTuning(config, head_kind("classification"), 3, classifier_dropout=0.0)
    ids = jnp.ones((2, 8), jnp.int32)
    params = train_state.unbox(model.init(jax.random.key(0), ids, jnp.zeros_like(ids), jnp.ones_like(ids))["params"])
    return model, params


def _freezing(strategy: str, **kw) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(strategy=strategy, num_frozen_layers=kw.get("n", 0),
                                          freeze_embeddings=kw.get("embeddings", True), unfreeze_every_epochs=1))


def _start_of(starts, *names):
    node = starts
    for n in names:
        node = node[n]
    values = set(jax.tree.leaves(node))
    assert len(values) == 1, (names, values)
    return values.pop()


def test_strategies_assign_start_steps():
    _, params = _model_and_params()
    kw = dict(num_layers=NUM_LAYERS, steps_per_epoch=STEPS_PER_EPOCH)

    none = freezing.unfreeze_steps(params, _freezing("none"), **kw)
    assert set(jax.tree.leaves(none)) == {0}

    head = freezing.unfreeze_steps(params, _freezing("head_only"), **kw)
    assert _start_of(head, "head") == 0 and _start_of(head, "bert") == freezing.NEVER

    lowest = freezing.unfreeze_steps(params, _freezing("lowest", n=2), **kw)
    assert _start_of(lowest, "bert", "embeddings") == freezing.NEVER
    assert _start_of(lowest, "bert", "layer_0") == _start_of(lowest, "bert", "layer_1") == freezing.NEVER
    assert _start_of(lowest, "bert", "layer_2") == 0 and _start_of(lowest, "head") == 0
    keep_emb = freezing.unfreeze_steps(params, _freezing("lowest", n=1, embeddings=False), **kw)
    assert _start_of(keep_emb, "bert", "embeddings") == 0

    gradual = freezing.unfreeze_steps(params, _freezing("gradual"), **kw)
    # Top layer with the head in epoch 0, then one more layer per epoch, the embeddings last.
    assert _start_of(gradual, "head") == 0 and _start_of(gradual, "bert", "pooler") == 0
    assert [_start_of(gradual, "bert", f"layer_{i}") for i in range(NUM_LAYERS)] == [8, 4, 0]
    assert _start_of(gradual, "bert", "embeddings") == 12

    with pytest.raises(ValueError, match="num_frozen_layers"):
        freezing.unfreeze_steps(params, _freezing("lowest", n=NUM_LAYERS + 1), **kw)
    with pytest.raises(ValueError, match="strategy"):
        freezing.unfreeze_steps(params, _freezing("sometimes"), **kw)


def _train(strategy: str, steps: int, **kw):
    """`steps` AdamW steps (weight decay on) with random gradients; returns (before, after, starts)."""
    _, params = _model_and_params()
    starts = freezing.unfreeze_steps(params, _freezing(strategy, **kw), num_layers=NUM_LAYERS,
                                     steps_per_epoch=STEPS_PER_EPOCH)
    opt = ml_collections.ConfigDict(dict(name="adamw", learning_rate=1e-2, end_learning_rate=0.0,
                                         schedule="constant", warmup_steps=0, b1=0.9, b2=0.999, eps=1e-6,
                                         weight_decay=0.1, grad_clip_norm=1.0))
    tx = freezing.freeze(optimizers.make_optimizer(opt, 100), starts)
    opt_state, current = tx.init(params), params
    update = jax.jit(tx.update)
    for step in range(steps):
        keys = jax.random.split(jax.random.key(step), len(jax.tree.leaves(params)))
        grads = jax.tree.unflatten(jax.tree.structure(params),
                                   [jax.random.normal(k, p.shape) for k, p in zip(keys, jax.tree.leaves(params))])
        updates, opt_state = update(grads, opt_state, current)
        current = jax.tree.map(lambda p, u: p + u, current, updates)
    return params, current, starts


def _changed(before, after, starts, steps):
    """(frozen params that changed, trainable params that did not)."""
    flat_b = jax.tree_util.tree_flatten_with_path(before)[0]
    bad_frozen, bad_trained = [], []
    for (path, b), a, s in zip(flat_b, jax.tree.leaves(after), jax.tree.leaves(starts)):
        name = jax.tree_util.keystr(path)
        same = np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))  # bitwise
        if s >= steps and not same:
            bad_frozen.append(name)
        if s < steps and same:
            bad_trained.append(name)
    return bad_frozen, bad_trained


@pytest.mark.parametrize("strategy,kw", [("head_only", {}), ("lowest", {"n": 2}), ("gradual", {})])
def test_frozen_parameters_stay_bitwise_unchanged(strategy, kw):
    steps = 6  # gradual: the top layer trains from 0, the middle one from step 4, the rest never here
    before, after, starts = _train(strategy, steps, **kw)
    bad_frozen, bad_trained = _changed(before, after, starts, steps)
    assert not bad_frozen, f"frozen parameters moved: {bad_frozen}"
    assert not bad_trained, f"trainable parameters did not move: {bad_trained}"
    frozen_share = 1 - freezing.trainable_fraction(before, starts, steps)
    assert frozen_share > 0.3  # the strategy really froze something


def test_gradual_unfreezing_reaches_every_layer():
    before, after, starts = _train("gradual", 13)  # past the embeddings' start step (12)
    bad_frozen, bad_trained = _changed(before, after, starts, 13)
    assert not bad_frozen and not bad_trained
    assert freezing.trainable_fraction(before, starts, 13) == 1.0


# ----- ALBERT: one shared layer and the factorised embeddings' projection -----
def _albert_params():
    """A fine-tuning ALBERT's tree: bert/{embeddings, embeddings_project, shared_layer, pooler}, head."""
    config = BertConfig(vocab_size=40, hidden_size=16, num_layers=NUM_LAYERS, num_heads=2, intermediate_size=32,
                        max_position_embeddings=16, dropout_rate=0.0, attention_dropout_rate=0.0,
                        embedding_size=8, shared_layers=True)
    ids = jnp.ones((2, 8), jnp.int32)
    model = BertForFineTuning(config, head_kind("classification"), 3, classifier_dropout=0.0)
    params = train_state.unbox(model.init(jax.random.key(0), ids, jnp.zeros_like(ids), jnp.ones_like(ids))["params"])
    assert {"shared_layer", "embeddings_project"} <= set(params["bert"]) and "layer_0" not in params["bert"]
    return params


def _albert_starts(strategy: str, **kw):
    return freezing.unfreeze_steps(_albert_params(), _freezing(strategy, **kw), num_layers=NUM_LAYERS,
                                   steps_per_epoch=STEPS_PER_EPOCH)


def test_gradual_trains_the_shared_layer_from_the_start_and_thaws_the_projection_with_the_embeddings():
    """The shared weights are every layer, the top one included: they train from the top layer's step (0). The
    E -> H projection is part of the embeddings: it joins with them, after the lowest layer."""
    starts = _albert_starts("gradual")
    assert _start_of(starts, "bert", "shared_layer") == 0 and _start_of(starts, "head") == 0
    assert _start_of(starts, "bert", "embeddings") == _start_of(starts, "bert", "embeddings_project") == 12


@pytest.mark.parametrize("frozen_layers, shared_start", [(0, 0), (NUM_LAYERS, freezing.NEVER)])
def test_lowest_freezes_the_shared_layer_only_with_every_layer_and_the_projection_with_the_embeddings(
        frozen_layers, shared_start):
    starts = _albert_starts("lowest", n=frozen_layers)
    assert _start_of(starts, "bert", "shared_layer") == shared_start
    assert _start_of(starts, "bert", "embeddings_project") == freezing.NEVER  # freeze_embeddings=True
    assert _start_of(_albert_starts("lowest", n=frozen_layers, embeddings=False), "bert", "embeddings_project") == 0


def test_lowest_with_some_of_the_shared_layers_frozen_is_a_one_line_error():
    """Freezing the lowest 1 of 3 layers that share their weights would freeze all three (or train the frozen one):
    an error that says so and names the values that work."""
    with pytest.raises(ConfigError) as info:
        _albert_starts("lowest", n=1)
    message = str(info.value)
    assert "\n" not in message and "config.freezing.num_frozen_layers=1" in message
    assert "share" in message and f"0 or {NUM_LAYERS}" in message and "head_only" in message


def test_head_only_freezes_the_shared_layer_and_the_projection():
    starts = _albert_starts("head_only")
    assert _start_of(starts, "bert") == freezing.NEVER and _start_of(starts, "head") == 0


def test_lowest_with_every_layer_frozen_gives_the_shared_layer_and_projection_zero_updates():
    """End to end through freeze(): under lowest with every layer frozen, the shared layer and the projection keep
    their bits while the head and pooler train."""
    params = _albert_params()
    starts = freezing.unfreeze_steps(params, _freezing("lowest", n=NUM_LAYERS), num_layers=NUM_LAYERS,
                                     steps_per_epoch=STEPS_PER_EPOCH)
    opt = ml_collections.ConfigDict(dict(name="adamw", learning_rate=1e-2, end_learning_rate=0.0,
                                         schedule="constant", warmup_steps=0, b1=0.9, b2=0.999, eps=1e-6,
                                         weight_decay=0.1, grad_clip_norm=1.0))
    tx = freezing.freeze(optimizers.make_optimizer(opt, 10), starts)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    assert not any(np.any(u) for u in jax.tree.leaves(updates["bert"]["shared_layer"]))
    assert not any(np.any(u) for u in jax.tree.leaves(updates["bert"]["embeddings_project"]))
    assert all(np.any(u) for u in jax.tree.leaves(updates["bert"]["pooler"]))


@pytest.mark.parametrize("strategy,kw", [("head_only", {}), ("lowest", {"n": 3}), ("gradual", {})])
def test_a_body_weight_the_checkpoint_lacked_trains_from_the_start(strategy, kw):
    """An ELECTRA discriminator or a distilled student has no pooler: fine-tuning's fresh one trains with the head."""
    _, params = _model_and_params()
    starts = freezing.unfreeze_steps(params, _freezing(strategy, **kw), num_layers=NUM_LAYERS,
                                     steps_per_epoch=STEPS_PER_EPOCH)
    fresh = freezing.train_fresh(starts, ["bert/pooler/kernel", "bert/pooler/bias"])
    assert _start_of(fresh, "bert", "pooler") == 0 and _start_of(fresh, "head") == 0
    assert _start_of(fresh, "bert", "layer_0") == _start_of(starts, "bert", "layer_0") > 0  # the rest as the strategy
    assert _start_of(fresh, "bert", "embeddings") == _start_of(starts, "bert", "embeddings") > 0


# ----- ModernBERT: layer 0 has no attention norm, a final norm and a pretrained prediction head above the top -----
def test_gradual_unfreezing_thaws_modernbert_from_the_top_down():
    from models.modernbert import ModernBertConfig
    from models.modernbert_tasks import ModernBertForFineTuning
    config = ModernBertConfig(vocab_size=40, hidden_size=16, num_layers=NUM_LAYERS, num_heads=2, intermediate_size=24,
                              max_position_embeddings=16)
    model = ModernBertForFineTuning(config, head_kind("classification"), 3)
    ids = jnp.ones((2, 8), jnp.int32)
    params = train_state.unbox(model.init(jax.random.key(0), ids, jnp.zeros_like(ids), jnp.ones_like(ids))["params"])
    starts = freezing.unfreeze_steps(params, _freezing("gradual"), num_layers=NUM_LAYERS,
                                     steps_per_epoch=STEPS_PER_EPOCH)
    assert _start_of(starts, "head") == _start_of(starts, "prediction_head") == 0
    assert _start_of(starts, "modernbert", "final_norm") == 0
    for layer in range(NUM_LAYERS):  # the top layer with the head, then one more per epoch
        assert _start_of(starts, "modernbert", f"layer_{layer}") == (NUM_LAYERS - 1 - layer) * STEPS_PER_EPOCH
    assert _start_of(starts, "modernbert", "embeddings") == NUM_LAYERS * STEPS_PER_EPOCH
