"""Fused query/key/value projections (model.fused_qkv, models/qkv_layout.py) compute what the three separate
projections compute, for BERT, GPT and T5: the layouts convert both ways exactly (looped and scanned layers,
logical axes, LoRA pairs), outputs and gradients agree, the initial distributions are the separate kernels',
LoRA adapts the same function and exports the same tensors, and incremental decoding matches."""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from models import decoding, gpt, layers, peft, qkv_layout, stack, t5
from models.bert import BertConfig
from models.convert import peft_io
from models.bert_tasks import BertForFineTuning
from objectives.task_heads import head_kind
from pretrain.training import pretrained
from tests.helpers.tiny_families import FAMILIES, IDS, build, tree_max_difference


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("scan", [False, True])
def test_layouts_convert_both_ways_and_match_what_init_builds(family, scan):
    separate, args = build(family, scan_layers=scan)
    fused, _ = build(family, scan_layers=scan, fused_qkv=True)
    params = separate.init(jax.random.key(0), *args)
    fused_init = jax.eval_shape(fused.init, jax.random.key(0), *args)  # shapes and axes only
    converted = qkv_layout.fuse_qkv(params)
    # the same tree, logical axes included (None for the parts axis), as a fused model initialises
    assert jax.tree.structure(converted) == jax.tree.structure(fused_init)
    assert (jax.tree.map(lambda x: x.shape, nn.unbox(converted))
            == jax.tree.map(lambda x: x.shape, nn.unbox(fused_init)))
    assert nn.get_partition_spec(converted) == nn.get_partition_spec(fused_init)
    assert qkv_layout.is_fused(converted) and not qkv_layout.is_fused(params)
    assert tree_max_difference(nn.unbox(qkv_layout.split_qkv(converted)), nn.unbox(params)) == 0
    # a tree already in the asked layout is left as it is
    assert tree_max_difference(nn.unbox(qkv_layout.to_qkv_layout(converted, fused=True)), nn.unbox(converted)) == 0


@pytest.mark.parametrize("family, scan", [("bert", False), ("gpt", True), ("t5", False)])
def test_fused_projections_give_the_same_outputs_and_gradients(family, scan):
    separate, args = build(family, scan_layers=scan)
    fused, _ = build(family, scan_layers=scan, fused_qkv=True)
    params = nn.unbox(separate.init(jax.random.key(0), *args))

    def loss(p, model):  # a mean: gradients of O(0.1), so that 1e-5 is float32's reordering, not a scale
        outputs = model.apply(p, *args)
        return sum(jnp.mean(jnp.sin(v)) for v in outputs.values()), outputs

    grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (_, expected), expected_grads = grad_fn(params, separate)
    (_, outputs), grads = grad_fn(qkv_layout.fuse_qkv(params), fused)
    assert tree_max_difference(outputs, expected) < 1e-5
    assert tree_max_difference(qkv_layout.split_qkv(grads), expected_grads) < 1e-5


def test_each_slice_of_the_fused_kernel_has_its_projections_initial_distribution():
    """T5 folds the query scaling into the query's initializer: the fused kernel's query slice keeps it."""
    model, args = build("t5", fused_qkv=True)
    config = model.config
    kernel = nn.unbox(model.init(jax.random.key(0), *args))["params"]["encoder"]["layer_0"]["self_attention"]["qkv"]
    kernel = np.asarray(kernel["kernel"])  # [D, 3, H, K]
    expected = ((config.d_model * config.head_dim) ** -0.5, config.d_model ** -0.5, config.d_model ** -0.5)
    for part, std in enumerate(expected):
        assert abs(kernel[:, part].std() / std - 1) < 0.15, (part, kernel[:, part].std(), std)
    with pytest.raises(ValueError, match="holds 2 projections"):
        layers.stacked_init((nn.initializers.zeros_init(),) * 3, axis=1)(jax.random.key(0), (4, 2, 3))


def _lora_model(family: str, targets: tuple[str, ...], fused: bool):
    spec = peft.PeftConfig(method="lora", lora_targets=targets, lora_rank=4, lora_alpha=8.0)
    if family == "bert":
        config = BertConfig(vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                            max_position_embeddings=32, fused_qkv=fused)
        return (BertForFineTuning(config, head_kind("classification"), 3, peft=spec),
                (IDS, IDS * 0, (IDS != 0).astype(jnp.int32)))
    model, args = build("t5", fused_qkv=fused)
    return peft.attach(model, spec), args


def _random_lora_b(params):
    """B starts at zero, which would make every LoRA the identity: random B's make the updates count."""
    rng = np.random.default_rng(0)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: rng.normal(0, 0.2, x.shape).astype(x.dtype) if str(path[-1].key) == "lora_b" else x, params)


@pytest.mark.parametrize("family, targets", [("bert", ("query", "value")), ("t5", ("query", "key", "value", "out"))])
def test_lora_on_fused_projections_adapts_each_part_as_the_separate_ones(family, targets):
    separate, args = _lora_model(family, targets, fused=False)
    fused, _ = _lora_model(family, targets, fused=True)
    params = _random_lora_b(nn.unbox(separate.init(jax.random.key(0), *args))["params"])
    converted = qkv_layout.fuse_qkv(params)
    fused_init = nn.unbox(jax.eval_shape(fused.init, jax.random.key(0), *args))["params"]
    assert jax.tree.structure(converted) == jax.tree.structure(fused_init)
    assert tree_max_difference(qkv_layout.split_qkv(converted), params) == 0
    expected = separate.apply({"params": params}, *args)
    assert tree_max_difference(fused.apply({"params": converted}, *args), expected) < 1e-5
    # merge_lora reads the Hugging Face layout, whichever the model trained with
    scale = 8.0 / 4
    merged = peft.merge_lora(qkv_layout.hf_layout(converted), scale)
    assert tree_max_difference(merged, peft.merge_lora(params, scale)) == 0


def test_peft_export_of_a_fused_lora_run_writes_the_separate_runs_tensors(tmp_path):
    separate, args = _lora_model("bert", ("query", "key", "value"), fused=False)
    params = _random_lora_b(nn.unbox(separate.init(jax.random.key(0), *args))["params"])
    fused_config = dataclasses.replace(separate.config, fused_qkv=True)
    peft_io.save_peft_bert(str(tmp_path / "separate"), params, separate.config, separate.peft)
    peft_io.save_peft_bert(str(tmp_path / "fused"), qkv_layout.fuse_qkv(params), fused_config, separate.peft)
    written = [safetensors.numpy.load_file(str(tmp_path / name / peft_io.ADAPTER_WEIGHTS))
               for name in ("separate", "fused")]
    assert sorted(written[0]) == sorted(written[1]) and any("lora_A" in name for name in written[0])
    for name, array in written[0].items():
        assert np.array_equal(written[1][name], array), name


def test_pretrained_weights_of_either_layout_load_into_both():
    separate, args = build("gpt")
    fused, _ = build("gpt", fused_qkv=True, scan_layers=True)
    params = nn.unbox(separate.init(jax.random.key(0), *args))["params"]
    blank = jax.tree.map(np.zeros_like, nn.unbox(fused.init(jax.random.key(1), *args))["params"])
    loaded, fresh = pretrained.merge_params(blank, params, "test")
    assert not fresh
    assert tree_max_difference(loaded, stack.stack_layers(qkv_layout.fuse_qkv(params))) == 0
    back, fresh = pretrained.merge_params(jax.tree.map(np.zeros_like, params), loaded, "test")
    assert not fresh and tree_max_difference(back, params) == 0


def test_incremental_decoding_with_fused_projections_equals_the_separate_ones():
    results = []
    for fused in (False, True):
        model, _ = build("gpt", fused_qkv=fused)
        params = nn.unbox(build("gpt")[0].init(jax.random.key(0), *FAMILIES["gpt"][2]))["params"]
        params = qkv_layout.to_qkv_layout(params, fused)
        cache = gpt.init_cache(model, params, 2, 8)
        results.append(decoding.greedy_search(gpt.make_tokens_to_logits(model, params), cache, IDS[:, 0], 8, eos_id=-1))
        model, args = build("t5", fused_qkv=fused)
        params = qkv_layout.to_qkv_layout(nn.unbox(build("t5")[0].init(jax.random.key(0), *args))["params"], fused)
        results.append(t5.generate(model, params, args[0], max_length=6, eos_id=1, beam_size=2))
    np.testing.assert_array_equal(results[0], results[2])
    np.testing.assert_array_equal(results[1], results[3])


def test_cross_attention_is_never_fused():
    attention = layers.MultiHeadAttention(num_heads=2, head_dim=4, fused_qkv=True)
    x = jnp.ones((1, 3, 8))
    with pytest.raises(ValueError, match="fused_qkv is for self-attention"):
        attention.init(jax.random.key(0), x, jnp.ones((1, 5, 8)))
