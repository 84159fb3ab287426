"""ModernBERT's own properties (the parity with transformers is tests/models/convert/test_hf_modernbert.py's): packed
rows compute what each example computes alone, layer 0 alone lacks an attention norm, looped and scanned layouts
agree, and a bad config is one line."""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers, stack
from models.errors import ModelInputError
from models.modernbert import ModernBertConfig, ModernBertForMaskedLM
from tests.helpers.states import with_base

CONFIG = ModernBertConfig(vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, intermediate_size=48,
                          local_attention=6, max_position_embeddings=64, attention="einsum")


@pytest.fixture(scope="module")
def params():
    ids = jnp.ones((1, 16), jnp.int32)
    return ModernBertForMaskedLM(CONFIG).init(jax.random.key(0), ids, None, ids)["params"]


def logits(params, ids, mask, config=CONFIG, positions=None) -> np.ndarray:
    out = ModernBertForMaskedLM(config).apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(mask),
                                             positions=None if positions is None else jnp.asarray(positions))
    return np.asarray(out["mlm_logits"])


def test_packed_row_gives_each_example_the_logits_it_has_alone(params):
    """Two examples of 9 and 7 tokens in one row (segment ids 1 and 2, positions restarting) against each alone:
    attention, the sliding window and the rotary positions all stay inside an example."""
    rng = np.random.default_rng(0)
    a, b = rng.integers(3, 64, 9), rng.integers(3, 64, 7)
    packed = logits(params, np.concatenate([a, b])[None], np.array([[1] * 9 + [2] * 7]),
                    positions=np.concatenate([np.arange(9), np.arange(7)])[None])
    np.testing.assert_allclose(packed[0, :9], logits(params, a[None], np.ones((1, 9)))[0], atol=1e-5)
    np.testing.assert_allclose(packed[0, 9:], logits(params, b[None], np.ones((1, 7)))[0], atol=1e-5)


def test_only_layer_zero_lacks_the_attention_norm(params):
    body = params["modernbert"]
    assert "attention_norm" not in body["layer_0"]
    assert all("attention_norm" in body[f"layer_{i}"] for i in range(1, CONFIG.num_layers))
    assert not any("bias" in jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(body)[0])


def test_scanned_layers_stack_after_layer_zero_and_compute_the_same(params):
    scanned = stack.stack_layers(params)
    assert set(scanned["modernbert"]) >= {"layer_0", "layers"} and "layer_1" not in scanned["modernbert"]
    assert jax.tree.leaves(scanned["modernbert"]["layers"])[0].shape[0] == CONFIG.num_layers - 1
    ids = np.random.default_rng(1).integers(3, 64, (2, 16))
    mask = np.ones((2, 16), np.int32)
    mask[1, 11:] = 0
    np.testing.assert_allclose(logits(scanned, ids, mask, dataclasses.replace(CONFIG, scan_layers=True)),
                               logits(params, ids, mask), atol=1e-5)
    back = stack.unstack_layers(scanned)
    assert jax.tree.structure(back) == jax.tree.structure(params)


@pytest.mark.parametrize("fields, message", [
    (dict(global_attn_every_n_layers=0), r"model.global_attn_every_n_layers=0 must be >= 1"),
    (dict(local_attention=7), r"model.local_attention=7 must be an even window >= 2"),
    (dict(hidden_size=30), r"model.hidden_size=30 is not a multiple of model.num_heads=4"),
    (dict(classifier_pooling="max"), r"model.classifier_pooling='max' is not one of"),
])
def test_bad_modernbert_config_is_one_line(fields, message):
    with pytest.raises(ModelInputError, match=message) as info:
        dataclasses.replace(CONFIG, **fields)
    assert "\n" not in str(info.value)


# ----- Fine-tuning: PEFT attaches from outside (models/peft/model.py), in either layout -----
def task_model(method: str = "none", scan: bool = False, pooling: str = "cls", **peft_fields):
    from models import peft
    from models.modernbert_tasks import ModernBertForFineTuning
    from objectives.task_heads import head_kind
    config = dataclasses.replace(CONFIG, scan_layers=scan, classifier_pooling=pooling)
    return ModernBertForFineTuning(config, head_kind("classification"), 3,
                                   peft=peft.PeftConfig(method=method, **peft_fields))


IDS = jnp.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 0, 0], [3, 4, 5, 6, 7, 8, 9, 1, 3, 4, 5, 6]], jnp.int32)


def classify(model, params) -> np.ndarray:
    return np.asarray(model.apply({"params": params}, IDS, IDS * 0, (IDS != 0).astype(jnp.int32))["logits"])


def test_lora_with_b_zero_leaves_modernbert_unchanged_and_attaches_to_query_and_value():
    base_model, lora_model = task_model(), task_model("lora", lora_targets=("query", "value"), lora_rank=4)
    base = nn.unbox(base_model.init(jax.random.key(0), IDS, IDS * 0, IDS)["params"])
    params = with_base(nn.unbox(lora_model.init(jax.random.key(1), IDS, IDS * 0, IDS)["params"]), base)
    lora = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
            if "lora" in jax.tree_util.keystr(p)]
    assert len(lora) == CONFIG.num_layers * 2 * 2 and all("query" in k or "value" in k for k in lora)
    np.testing.assert_array_equal(classify(lora_model, params), classify(base_model, base))


@pytest.mark.parametrize("method", ["lora", "adapters", "prefix", "prompt"])
def test_peft_on_modernbert_gives_the_same_logits_looped_and_scanned(method):
    """Layer 0 runs outside the scan: prefix-tuning's per-layer keys and values must reach it and the rest."""
    fields = dict(prefix_length=3, prompt_length=3, adapter_size=8, prefix_hidden_size=0)
    looped, scanned = task_model(method, **fields), task_model(method, scan=True, **fields)
    params = looped.init(jax.random.key(0), IDS, IDS * 0, IDS)["params"]
    params = jax.tree.map(lambda x: x + np.random.default_rng(1).normal(0, 0.05, x.shape).astype(x.dtype),
                          jax.tree.map(np.asarray, params))
    np.testing.assert_allclose(classify(scanned, stack.stack_layers(params)), classify(looped, params), atol=1e-5)


def test_mean_pooling_keeps_gradients_finite_beside_a_padding_row():
    """A data loader fills a short last batch with rows of padding (mask all zero): mean pooling must give them
    a finite value and gradient, and leave the real rows' logits as they are alone."""
    model = task_model(pooling="mean")
    params = model.init(jax.random.key(0), IDS, IDS * 0, IDS)["params"]
    padded = jnp.concatenate([IDS, jnp.zeros((1, IDS.shape[1]), jnp.int32)])

    def loss(p, ids):
        out = model.apply({"params": p}, ids, ids * 0, (ids != 0).astype(jnp.int32))["logits"]
        return jnp.sum(out[:2] ** 2), out[:2]

    (_, alone), _ = jax.value_and_grad(loss, has_aux=True)(params, IDS)
    (_, beside), grads = jax.value_and_grad(loss, has_aux=True)(params, padded)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    np.testing.assert_allclose(np.asarray(beside), np.asarray(alone), atol=1e-5)


def test_rotate_half_as_a_matmul_off_a_cpu_equals_the_slices(monkeypatch):
    """Off a CPU rotate_half is a matmul with a +-1 permutation: the same rotation, float32 and bf16."""
    x = jax.random.normal(jax.random.key(1), (2, 8, 2, 16), jnp.float32)
    cos, sin = layers.rotary_embedding(jnp.arange(8)[None], 16, 10000.0)
    sliced = {dtype: layers.apply_rotary(x.astype(dtype), cos, sin) for dtype in (jnp.float32, jnp.bfloat16)}
    monkeypatch.setattr(layers.attention, "platform", lambda: "tpu")
    for dtype, want in sliced.items():
        got = layers.apply_rotary(x.astype(dtype), cos, sin)
        assert got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-6, atol=1e-6)


def test_rotary_runs_in_the_activations_dtype_as_hugging_faces():
    """apply_rotary casts cos and sin to x's dtype (transformers' apply_rotary_pos_emb does): bf16 in, bf16 out,
    within bf16's rounding of the float32 rotation; float32 in, the float32 rotation itself."""
    x = jax.random.normal(jax.random.key(0), (2, 8, 2, 16), jnp.float32)
    cos, sin = layers.rotary_embedding(jnp.arange(8)[None], 16, 10000.0)
    exact = layers.apply_rotary(x, cos, sin)
    half = np.concatenate([-np.asarray(x)[..., 8:], np.asarray(x)[..., :8]], axis=-1)
    expected = np.asarray(x) * np.asarray(cos)[:, :, None] + half * np.asarray(sin)[:, :, None]
    np.testing.assert_allclose(exact, expected, rtol=1e-6, atol=1e-6)
    low = layers.apply_rotary(x.astype(jnp.bfloat16), cos, sin)
    assert low.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(low, np.float32), expected, rtol=0, atol=4 * 2.0 ** -8 * np.abs(expected).max())
