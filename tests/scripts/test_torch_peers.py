"""scripts/bench/torch_bert.py, the transformers peers of the budget benchmark: the learning rate at every step is
ours, and ModernBertForMaskedLM given our ModernBERT's weights computes our held-out MLM loss on the same batch; and
scripts/bench/bench_pretrain.py's FLOP count, which both sides' MFU divides by."""
from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import cram
from scripts.bench import torch_bert


def arm_config(arch: str, schedule: str = "linear"):
    config = cram.get_config(f"arch={arch},schedule={schedule}")
    config.model.update(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=48, vocab_size=100)
    config.optimizer.warmup_steps = 3
    config.num_train_steps = 20
    return config


@pytest.mark.parametrize("schedule", ["linear", "wsd"])
def test_peer_learning_rate_is_ours_at_every_step(schedule):
    from pretrain.training import optimizers
    config = arm_config("modernbert", schedule)
    model = torch_bert.build_model(config.model)
    optimizer, scheduler = torch_bert.build_optimizer(model, config.optimizer, config.num_train_steps)
    ours = optimizers.learning_rate_schedule(config.optimizer, config.num_train_steps)
    for step in range(config.num_train_steps):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(float(ours(step)), rel=1e-6, abs=1e-12)
        optimizer.step()
        scheduler.step()


def test_peer_decays_matrices_only():
    model = torch_bert.build_model(arm_config("modernbert").model)
    optimizer, _ = torch_bert.build_optimizer(model, arm_config("modernbert").optimizer, 10)
    decayed, not_decayed = optimizer.param_groups
    assert all(p.ndim >= 2 for p in decayed["params"]) and all(p.ndim == 1 for p in not_decayed["params"])
    assert decayed["weight_decay"] > 0 and not_decayed["weight_decay"] == 0


def test_modernbert_peer_with_our_weights_computes_our_mlm_loss():
    import torch

    import models
    from models.convert import hf_modernbert
    config = arm_config("modernbert")
    ours = models.model_config(config.model.to_dict())
    module = models.family("modernbert").model_cls()(ours)
    rng = np.random.RandomState(0)
    ids = rng.randint(5, 100, (2, 16)).astype(np.int32)
    mask = np.ones((2, 16), np.int32)
    mask[1, 12:] = 0
    positions = np.array([[1, 4, 7], [2, 5, 9]], np.int32)
    targets = rng.randint(5, 100, (2, 3)).astype(np.int32)
    batch = dict(input_ids=ids, segment_ids=np.zeros_like(ids), input_mask=mask, masked_lm_positions=positions,
                 masked_lm_ids=targets, masked_lm_weights=np.ones((2, 3), np.float32))
    inputs = (jnp.asarray(ids), None, jnp.asarray(mask), jnp.asarray(positions))
    params = flax.core.meta.unbox(module.init(jax.random.PRNGKey(0), *inputs)["params"])
    logits = module.apply({"params": params}, *inputs)
    our_loss = float(-jnp.take_along_axis(jax.nn.log_softmax(logits["mlm_logits"]), targets[..., None], -1).mean())

    peer = torch_bert.build_model(config.model).eval()
    state = {k: torch.from_numpy(np.array(v)) for k, v in hf_modernbert.hf_state_dict(params, ours).items()}
    peer.load_state_dict(state, strict=False)
    with torch.no_grad():
        peer_loss = float(torch_bert.loss_of(peer, torch_bert.inputs(batch, next_sentence=False, token_types=False)))
    assert peer_loss == pytest.approx(our_loss, abs=1e-4)
    assert "token_type_ids" not in torch_bert.inputs(batch, next_sentence=False, token_types=False)


def test_model_flops_add_a_modernbert_layers_matrices_and_attention_per_layer():
    """pretrain/loops/aot.model_flops (bench_pretrain's MFU, the fit table's model FLOPs), counted from the step's
    jaxpr: one more ModernBERT layer adds 6 x its matrix parameters x tokens (GeGLU's three matrices among them,
    counted from the model's own parameters) plus 6 x the attention's two products over the pairs it keeps: layer 2
    is a local one, whose window is its (query, key) pairs; over every pair, the whole [S, S]."""
    from models import attention
    from pretrain.loops import aot, setup
    batch_size, flops = 2, {}
    for layers in (2, 3):
        config = arm_config("modernbert")
        config.model.num_layers = layers
        trainer = setup.pretraining_trainer(config)
        flops[layers] = aot.model_flops(trainer, batch_size)  # (kept pairs, every pair)
    matrices = sum(leaf.size for path, leaf in jax.tree_util.tree_flatten_with_path(
        flax.core.meta.unbox(trainer.abstract_state.params))[0]
        if leaf.ndim >= 2 and "layer_2" in jax.tree_util.keystr(path))
    seq_len, hidden = config.data.max_seq_length, config.model.hidden_size
    tokens = batch_size * seq_len
    assert matrices == 4 * hidden ** 2 + 3 * hidden * config.model.intermediate_size
    kept = attention.SegmentMask(window=config.model.local_attention // 2).kept_pairs(seq_len, seq_len)
    assert kept < seq_len ** 2
    assert flops[3][0] - flops[2][0] == 6 * matrices * tokens + 6 * 2 * batch_size * kept * hidden
    assert flops[3][1] - flops[2][1] == 6 * matrices * tokens + 6 * 2 * tokens * seq_len * hidden
