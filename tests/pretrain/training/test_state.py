"""Optimizer recipe: which weights decay, the warmup/decay schedule, clipping."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import bert as bert_configs
from models.bert import BertConfig, BertForPreTraining
from pretrain.training import optimizers, train_state


def small_params():
    model = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=8, num_layers=1, num_heads=2,
                                          intermediate_size=16, max_position_embeddings=16))
    ids = jnp.zeros((1, 4), jnp.int32)
    return train_state.unbox(model.init(jax.random.key(0), ids, ids, jnp.ones_like(ids), ids[:, :2]))["params"]


def test_weight_decay_skips_layernorm_and_biases():
    mask = optimizers.weight_decay_mask(small_params())
    flat = {"/".join(str(k.key) for k in path): v for path, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
    assert flat["bert/embeddings/word_embeddings/embedding"] and flat["bert/layer_0/attention/query/kernel"]
    assert flat["bert/layer_0/mlp/intermediate/kernel"] and flat["nsp_head/classifier/kernel"]
    assert not flat["bert/layer_0/attention_norm/scale"] and not flat["bert/embeddings/norm/bias"]
    assert not flat["bert/layer_0/attention/query/bias"] and not flat["mlm_head/bias"]
    decayed = sum(flat.values())
    assert 0 < decayed < len(flat)


def test_decay_is_applied_only_where_masked():
    """With zero gradients AdamW's update is exactly -lr * wd * w on decayed weights, 0 elsewhere."""
    config = bert_configs.get_config("size=tiny").optimizer
    params = small_params()
    tx = optimizers.make_optimizer(config, num_train_steps=config.warmup_steps + 100)
    opt_state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    for _ in range(config.warmup_steps + 1):  # update number `warmup_steps` runs at the peak rate
        updates, opt_state = tx.update(zeros, opt_state, params)
    mask = optimizers.weight_decay_mask(params)
    lr = config.learning_rate
    for u, w, m in zip(jax.tree.leaves(updates), jax.tree.leaves(params), jax.tree.leaves(mask)):
        expected = -lr * config.weight_decay * np.asarray(w) if m else np.zeros_like(w)
        np.testing.assert_allclose(np.asarray(u), expected, rtol=1e-4, atol=1e-9)


def test_paper_schedule_and_adam_settings():
    c = bert_configs.get_config("size=base")
    schedule = optimizers.learning_rate_schedule(c.optimizer, c.num_train_steps)
    assert float(schedule(0)) == 0.0
    assert float(schedule(5_000)) == pytest.approx(0.5e-4)
    assert float(schedule(10_000)) == pytest.approx(1e-4)
    assert float(schedule(505_000)) == pytest.approx(0.5e-4, rel=1e-4)
    assert float(schedule(1_000_000)) == pytest.approx(0.0, abs=1e-12)
    o = c.optimizer
    assert (o.b1, o.b2, o.eps, o.weight_decay, o.grad_clip_norm) == (0.9, 0.999, 1e-6, 0.01, 1.0)


def test_gradients_are_clipped_to_global_norm_one_before_adam():
    """Adam's first moment after one step is (1 - b1) x the gradient it saw: the clipped one."""
    config = bert_configs.get_config("size=tiny").optimizer
    params = {"w": jnp.ones((4,))}
    tx = optimizers.make_optimizer(config, num_train_steps=10)
    gradient = jnp.asarray([10.0, -20.0, 0.0, 20.0])  # global norm 30
    _, opt_state = tx.update({"w": gradient}, tx.init(params), params)
    adam_state = opt_state[1][0]  # chain(clip, adamw); adamw = chain(scale_by_adam, decay, lr)
    np.testing.assert_allclose(adam_state.mu["w"], (1 - config.b1) * gradient / 30.0, rtol=1e-6)


def test_train_step_traces_the_models_activation_constraints():
    """The activations' constraint (models/ops.split_rows: the residual stream, the logits) reaches the jitted
    step's program: flax drops every constraint when it finds no abstract mesh, and `with mesh:` sets none."""
    from models import ops
    from pretrain.runtime import partitioning
    mesh = partitioning.create_mesh((1, 1, 1), jax.devices()[:1])
    replicated = partitioning.replicated(mesh)

    def step(state, batch, rng):
        return state, {"x": ops.split_rows(batch["x"][0] * 2.0).sum()}

    jitted = train_state.jit_train_step(step, {"w": replicated}, mesh)
    with mesh:
        traced = jitted.trace({"w": jnp.zeros(3)}, {"x": jnp.ones((1, 2, 4, 8))}, jax.random.key(0))
    assert "sharding_constraint" in str(traced.jaxpr)
