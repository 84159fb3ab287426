"""Scanned and rematerialized layer stacks (models/stack.py) compute what the looped stack computes, for
BERT, GPT and T5: outputs, gradients and incremental decoding, with the weights of one layout converted to
the other."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import decoding, gpt, stack, t5
from models.convert.hf_bert import hf_state_dict_from_bert
from models.convert.hf_gpt2 import hf_state_dict_from_gpt
from models.convert.hf_t5 import hf_state_dict_from_t5
from tests.helpers.tiny_families import FAMILIES, IDS, build, tree_max_difference

EXPORTS = {"bert": hf_state_dict_from_bert, "gpt": hf_state_dict_from_gpt, "t5": hf_state_dict_from_t5}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_layouts_convert_both_ways_and_match_what_init_builds(family):
    looped, args = build(family)
    scanned, _ = build(family, scan_layers=True)
    params = looped.init(jax.random.key(0), *args)
    scanned_init = jax.eval_shape(scanned.init, jax.random.key(0), *args)  # shapes and axes only
    converted = stack.to_layout(params, scan=True)
    # the same tree, logical axes included ("layers" first), as a scanned model initialises
    assert jax.tree.structure(converted) == jax.tree.structure(scanned_init)
    assert jax.tree.map(lambda x: x.shape, nn.unbox(converted)) == jax.tree.map(lambda x: x.shape,
                                                                                 nn.unbox(scanned_init))
    assert nn.get_partition_spec(converted) == nn.get_partition_spec(scanned_init)
    assert stack.is_scanned(converted) and not stack.is_scanned(params)
    assert tree_max_difference(nn.unbox(stack.to_layout(converted, scan=False)), nn.unbox(params)) == 0
    # the Hugging Face export reads either layout
    config, export = FAMILIES[family][1], EXPORTS[family]
    assert tree_max_difference(export(converted["params"], config), export(params["params"], config)) == 0


@pytest.mark.parametrize("family, remat", [("bert", "full"), ("t5", "full"), ("gpt", "minimal"), ("gpt", "none"),
                                           ("bert", "minimal_activation"), ("gpt", "dots")])
def test_scanned_and_rematerialized_stacks_give_the_same_outputs_and_gradients(family, remat):
    looped, args = build(family)
    params = nn.unbox(looped.init(jax.random.key(0), *args))
    scanned, _ = build(family, scan_layers=True, remat=remat)

    def loss(p, model):  # deterministic: scan draws other dropout masks than the loop (one rng split per layer)
        outputs = model.apply(p, *args)
        return sum(jnp.sum(jnp.sin(v)) for v in outputs.values()), outputs

    # jitted: op by op, a scanned backward pass dispatches thousands of tiny computations
    grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (_, expected), expected_grads = grad_fn(params, looped)
    (_, outputs), grads = grad_fn(stack.to_layout(params, scan=True), scanned)
    assert tree_max_difference(outputs, expected) < 1e-5
    assert tree_max_difference(stack.to_layout(grads, scan=False), expected_grads) < 1e-4
    if family == "gpt":  # remat without scan (one family: each check compiles another backward pass)
        rematerialized, _ = build(family, remat="full")
        remat_grads = jax.jit(jax.grad(lambda p: loss(p, rematerialized)[0]))(params)
        assert tree_max_difference(remat_grads, expected_grads) < 1e-4


@pytest.mark.parametrize("remat, kept", [("minimal", False), ("minimal_activation", True), ("full", False)])
def test_minimal_activation_keeps_the_mlps_activation_for_the_backward_pass(remat, kept):
    """What the backward pass reads from the forward under each policy: the named GELU output only where asked."""
    from jax._src.ad_checkpoint import saved_residuals
    model, args = build("bert", remat=remat)
    params = nn.unbox(model.init(jax.random.key(0), *args))
    saved = saved_residuals(lambda p: sum(jnp.sum(v) for v in model.apply(p, *args).values()), params)
    named = [where for _, where in saved if stack.MLP_ACTIVATION in where]
    assert bool(named) == kept, named


def test_dropout_trains_under_scan():
    """With dropout on, every layer draws its own mask (the rngs are split per layer)."""
    scanned, args = build("gpt", scan_layers=True, dropout_rate=0.5, attention_dropout_rate=0.0)
    params = scanned.init(jax.random.key(0), *args)
    apply = jax.jit(lambda p, rng: scanned.apply(p, *args, deterministic=False, rngs={"dropout": rng}))
    first, second = (apply(params, jax.random.key(s))
                     for s in (1, 2))
    assert tree_max_difference(first, second) > 0.1


@pytest.mark.parametrize("family", ["gpt", "t5"])
def test_incremental_decoding_under_scan_equals_the_looped_stack(family):
    looped, args = build(family)
    scanned, _ = build(family, scan_layers=True)
    params = nn.unbox(looped.init(jax.random.key(0), *args))["params"]
    if family == "t5":
        outputs = [t5.generate(model, p, args[0], max_length=6, eos_id=1, beam_size=beams)
                   for model, p in ((looped, params), (scanned, stack.to_layout(params, scan=True)))
                   for beams in (1, 2)]
        np.testing.assert_array_equal(outputs[0], outputs[2])
        np.testing.assert_array_equal(outputs[1], outputs[3])
        return
    results = []
    for model, p in ((looped, params), (scanned, stack.to_layout(params, scan=True))):
        cache = gpt.init_cache(model, p, 2, 8)
        results.append(decoding.greedy_search(gpt.make_tokens_to_logits(model, p), cache, IDS[:, 0], 8, eos_id=-1))
    np.testing.assert_array_equal(*results)


def test_a_scanned_stack_needs_numbered_layers():
    with pytest.raises(ValueError, match="not numbered"):
        stack.stack_layers({"layer_0": {"w": np.zeros(2)}, "layer_2": {"w": np.zeros(2)}})
