"""SpanBERT: the SBO head against its equations, what it may depend on, the MLM + SBO loss, the
objective's batches, the config, and a tiny end-to-end training run whose loss falls."""
from __future__ import annotations

import json
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

import objectives
from configs import spanbert as spanbert_config
from models import build_model
from models.bert import BertConfig, BertForPreTraining, BertModel
from objectives.bert_pretraining import SpanBertPretraining
from objectives.interface import ObjectiveError
from objectives.span_masking import SPAN_KEYS
from pretrain.runtime import partitioning

V, B, L, P, T = 60, 2, 12, 4, 3  # vocab, batch, length, predictions, SBO positions


def small_config(**kw) -> BertConfig:
    return BertConfig(**{**dict(vocab_size=V, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                                max_position_embeddings=16, next_sentence=False, span_boundary=True,
                                max_span_tokens=T), **kw})


def inputs():
    """Row 0: one span 3..5 (boundaries 2 and 6) and a padding slot; row 1: spans 1..1 and 7..8."""
    rng = np.random.default_rng(0)
    return dict(
        input_ids=jnp.asarray(rng.integers(4, V, (B, L)), jnp.int32),
        segment_ids=jnp.zeros((B, L), jnp.int32), input_mask=jnp.ones((B, L), jnp.int32),
        masked_lm_positions=jnp.asarray([[3, 4, 5, 0], [1, 7, 8, 0]], jnp.int32),
        span_left_boundary=jnp.asarray([[2, 2, 2, 0], [0, 6, 6, 0]], jnp.int32),
        span_right_boundary=jnp.asarray([[6, 6, 6, 0], [2, 9, 9, 0]], jnp.int32),
        span_position=jnp.asarray([[1, 2, 3, 0], [1, 1, 2, 0]], jnp.int32))


def random_params(model, kw, seed=1):
    """Every weight random, LayerNorm scales near 1 (zero biases / unit scales would hide bugs).
    Drawn with numpy on eval_shape's shapes: a jitted init costs seconds of XLA compile on CPU."""
    shapes = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), **kw))["params"])
    rng = np.random.default_rng(seed)

    def draw(path, x):
        noise = rng.normal(0, 0.1, x.shape).astype(np.float32)
        return jnp.asarray(noise + (jax.tree_util.keystr(path).endswith("['scale']")))
    return jax.tree_util.tree_map_with_path(draw, shapes)


def apply(model, params, kw, **extra):
    """model.apply jitted (one compile instead of one per eager op)."""
    return jax.jit(lambda p, x: model.apply({"params": p}, **x, **extra))(params, kw)


def test_default_bert_is_unchanged():
    model = BertForPreTraining(small_config(span_boundary=False, next_sentence=True))
    kw = {k: v for k, v in inputs().items() if k not in SPAN_KEYS}
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), **kw))["params"]
    assert set(params) == {"bert", "mlm_head", "nsp_head"}
    assert set(jax.eval_shape(lambda p: model.apply({"params": p}, **kw), params)) == {"mlm_logits", "nsp_logits"}
    assert BertConfig().span_boundary is False


def test_sbo_head_matches_the_equations():
    """s = FFNN([y_{s-1}; y_{e+1}; p_i]) (2 x Dense-GeLU-LayerNorm), z = E s + b (J&M 11.9-11.10)."""
    model = BertForPreTraining(small_config())
    kw = inputs()
    kw["span_position"] = kw["span_position"].at[1, 2].set(7)  # past the table: shares the last row
    params = random_params(model, kw)
    got = np.asarray(apply(model, params, kw)["sbo_logits"])
    assert got.shape == (B, P, V) and got.dtype == np.float32

    sequence, _ = jax.jit(lambda p: model.apply({"params": p}, kw["input_ids"], kw["segment_ids"],
                                                kw["input_mask"], method=lambda m, *a: m.bert(*a)))(params)
    y = np.asarray(sequence, np.float64)
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    sbo, E = p["sbo_head"], p["bert"]["embeddings"]["word_embeddings"]["embedding"]

    def gelu(x):
        return 0.5 * x * (1 + erf(x / np.sqrt(2)))

    def layer_norm(x, norm):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * norm["scale"] + norm["bias"]

    rows = np.arange(B)[:, None]
    pos = np.minimum(np.asarray(kw["span_position"]), T) - 1
    pos = np.maximum(pos, 0)
    h = np.concatenate([y[rows, np.asarray(kw["span_left_boundary"])], y[rows, np.asarray(kw["span_right_boundary"])],
                        sbo["position_embeddings"]["embedding"][pos]], axis=-1)
    h = layer_norm(gelu(h @ sbo["boundary_transform"]["kernel"] + sbo["boundary_transform"]["bias"]),
                   sbo["boundary_transform_norm"])
    dec = sbo["decoder"]
    h = layer_norm(gelu(h @ dec["transform"]["kernel"] + dec["transform"]["bias"]), dec["transform_norm"])
    want = h @ E.T + dec["bias"]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def encoder_offset(delta):
    """Adds delta [B, L, D] to the encoder's output, as if those tokens had other states."""
    def interceptor(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if isinstance(context.module, BertModel) and context.method_name == "__call__":
            return out[0] + delta, out[1]
        return out
    return nn.intercept_methods(interceptor)


def test_sbo_logits_depend_only_on_boundaries_and_position():
    model = BertForPreTraining(small_config())
    kw = inputs()
    params = random_params(model, kw)

    @jax.jit
    def run(x, delta):
        with encoder_offset(delta):
            return model.apply({"params": params}, **x)

    base = run(kw, jnp.zeros((B, L, 16)))

    def changed_at(positions, row=0):
        return run(kw, jnp.zeros((B, L, 16)).at[row, np.asarray(positions)].set(1.0))

    inside = changed_at([3, 4, 5])  # the span's own states: the MLM sees them, the SBO must not
    np.testing.assert_array_equal(np.asarray(inside["sbo_logits"]), np.asarray(base["sbo_logits"]))
    assert not np.allclose(inside["mlm_logits"][0, :3], base["mlm_logits"][0, :3])
    far = changed_at([1, 9, 11])  # (position 0 is the padding slot's boundary)
    np.testing.assert_array_equal(np.asarray(far["sbo_logits"]), np.asarray(base["sbo_logits"]))
    for boundary in (2, 6):
        moved = changed_at([boundary])["sbo_logits"]
        assert not np.allclose(moved[0, :3], base["sbo_logits"][0, :3], atol=1e-4)
        np.testing.assert_array_equal(np.asarray(moved[1]), np.asarray(base["sbo_logits"][1]))
    other = run({**kw, "span_position": kw["span_position"].at[0, 0].set(2)}, jnp.zeros((B, L, 16)))["sbo_logits"]
    np.testing.assert_allclose(other[0, 0], base["sbo_logits"][0, 1], rtol=1e-6)  # same boundaries, position 2


def test_every_sbo_weight_has_logical_axes_and_shards():
    model = BertForPreTraining(small_config())
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), **inputs()))
    leaves = jax.tree.leaves(boxed["params"]["sbo_head"], is_leaf=lambda x: hasattr(x, "names"))
    assert len(leaves) == 10 and all(hasattr(x, "names") for x in leaves)
    partitioning.logical_shardings(boxed, partitioning.create_mesh((-1, 1, 1)))
    with pytest.raises(ValueError, match="span_left_boundary"):
        jax.eval_shape(lambda: model.init(jax.random.key(0), **{k: v for k, v in inputs().items()
                                                                 if k not in SPAN_KEYS}))


# ------------------------------------------------------------------------------ the objective
def fake_tokenizer(vocab=V):
    return types.SimpleNamespace(vocab_size=vocab, pad_id=0, cls_id=1, sep_id=2, mask_id=3, unk_id=4,
                                 special_ids=(0, 1, 2, 3), word_start=np.arange(vocab) % 3 != 0)


def objective(**kw):
    config = spanbert_config.get_config("size=tiny").objective
    with config.unlocked():
        config.update(kw)
    return SpanBertPretraining(config, fake_tokenizer())


def cross_entropy(logits, labels, weights):
    logits = np.asarray(logits, np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    ce = logz - np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    return (ce * weights).sum() / max(weights.sum(), 1)


@pytest.mark.parametrize("next_sentence", [False, True])
def test_loss_is_mlm_plus_sbo(next_sentence):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, V, (B, P)).astype(np.int32)
    weights = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
    outputs = {"mlm_logits": rng.normal(size=(B, P, V)), "sbo_logits": 3 * rng.normal(size=(B, P, V)),
               "nsp_logits": rng.normal(size=(B, 2))}
    batch = {"masked_lm_ids": labels, "masked_lm_weights": weights, "input_mask": np.ones((B, L), np.int32),
             "next_sentence_labels": np.array([0, 1], np.int32)}
    loss, metrics = objective(next_sentence=next_sentence).loss(
        jax.tree.map(jnp.asarray, outputs), jax.tree.map(jnp.asarray, batch))
    mlm = cross_entropy(outputs["mlm_logits"], labels, weights)
    sbo = cross_entropy(outputs["sbo_logits"], labels, weights)
    nsp = cross_entropy(outputs["nsp_logits"], batch["next_sentence_labels"], np.ones(B)) if next_sentence else 0.0
    assert abs(float(metrics["mlm_loss"]) - mlm) < 1e-4 and abs(float(metrics["sbo_loss"]) - sbo) < 1e-4
    assert abs(float(loss) - (mlm + sbo + nsp)) < 1e-4 and float(metrics["loss"]) == float(loss)
    assert float(metrics["tokens"]) == B * L and "sbo_accuracy" in metrics
    assert ("nsp_loss" in metrics) == next_sentence
    with pytest.raises(ObjectiveError, match="span_boundary"):
        objective().loss({"mlm_logits": jnp.asarray(outputs["mlm_logits"])}, batch)


def test_batches_feed_the_model():
    obj = objective(max_predictions_per_seq=6)
    rng = np.random.default_rng(0)
    docs = [[rng.integers(5, V, rng.integers(3, 9)) for _ in range(6)] for _ in range(5)]
    instances = obj.create_instances(docs, rng, max_seq_length=24)
    batch = obj.make_batch({k: v[:8] for k, v in instances.items()}, np.random.default_rng(1))
    inputs = obj.model_inputs(batch)
    assert set(inputs) == {"input_ids", "segment_ids", "input_mask", "masked_lm_positions", *SPAN_KEYS}
    assert all(inputs[k].shape == (8, 6) for k in ("masked_lm_positions", *SPAN_KEYS))
    assert batch["masked_lm_weights"].sum() >= 8
    # whole words of the tokenizer: a span starts on a word start and its right boundary is one
    ids = instances["input_ids"][:8]
    special = np.isin(ids, (0, 1, 2, 3))
    starts = fake_tokenizer().word_start[ids] | special
    starts[:, 1:] |= special[:, :-1]  # a piece right after [CLS]/[SEP] starts a word (as objectives.mlm)
    w = batch["masked_lm_weights"] > 0
    first = batch["span_position"] == 1
    r, c = np.nonzero(w & first)
    assert starts[r, batch["masked_lm_positions"][r, c]].all()
    r, c = np.nonzero(w)
    assert starts[r, batch["span_right_boundary"][r, c]].all()
    model = BertForPreTraining(small_config(max_position_embeddings=24))
    out = apply(model, random_params(model, inputs), inputs)
    loss, metrics = obj.loss(out, batch)
    assert np.isfinite(float(loss)) and abs(float(loss) - float(metrics["mlm_loss"] + metrics["sbo_loss"])) < 1e-5


def test_config_is_the_papers_recipe():
    c = spanbert_config.get_config()
    o = c.objective
    assert (o.name, o.geometric_p, o.max_span_length, o.mask_prob) == ("spanbert", 0.2, 10, 0.15)
    assert (o.replace_with_mask, o.replace_with_random, o.next_sentence) == (0.8, 0.1, False)
    assert c.model.span_boundary and not c.model.next_sentence
    assert (c.data.max_seq_length, c.data.long_seq_length, o.short_seq_prob) == (512, 0, 0.0)
    assert (c.batch_size, c.num_train_steps, c.optimizer.learning_rate) == (256, 2_400_000, 1e-4)
    assert o.max_predictions_per_seq >= round(510 * 0.15)
    # SpanBERT-Large = BERT-Large (HF's 336,226,108) without NSP, plus the SBO head.
    D, vocab, table = 1024, c.model.vocab_size, c.model.max_span_tokens
    sbo = table * D + (3 * D * D + D) + 2 * D + (D * D + D) + 2 * D + vocab
    shapes = jax.eval_shape(lambda: build_model(c.model).init(jax.random.key(0), **{
        k: jnp.zeros((1, 8), jnp.int32) for k in ("input_ids", "segment_ids", "input_mask")},
        **{k: jnp.ones((1, 2), jnp.int32) for k in ("masked_lm_positions", *SPAN_KEYS)}))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == 336_226_108 - (2 * D + 2) + sbo
    tiny = spanbert_config.get_config("size=tiny")
    assert tiny.data.max_seq_length == 128 and tiny.objective.name == "spanbert"
    with pytest.raises(ValueError, match="nsp"):
        spanbert_config.get_config("nsp=True")


def test_bad_objective_config_is_a_user_error():
    with pytest.raises(ObjectiveError, match="geometric_p"):
        objective(geometric_p=1.5)
    with pytest.raises(ObjectiveError, match="max_span_length"):
        objective(max_span_length=0)


def test_training_end_to_end_loss_falls(tmp_path, corpus_and_tokenizer):
    """configs/spanbert.py through the registry and the real trainer, on a tiny corpus."""
    from pretrain.loops import pretraining
    corpus, spm = corpus_and_tokenizer
    config = spanbert_config.get_config("size=tiny")
    assert isinstance(objectives.build_objective(config.objective, fake_tokenizer()), SpanBertPretraining)
    config.update_from_flattened_dict({
        "data.path": corpus, "tokenizer.path": spm, "model.vocab_size": 1000, "model.hidden_size": 32,
        "model.num_heads": 2, "model.intermediate_size": 64, "model.num_layers": 2, "data.max_seq_length": 32,
        "objective.max_predictions_per_seq": 6, "batch_size": 8, "num_train_steps": 40, "log_every": 1,
        "checkpoint_every": 40, "eval_every": 0, "data.eval_documents": 4, "eval_batches": 1,
        "optimizer.warmup_steps": 2, "optimizer.learning_rate": 3e-3, "prefetch": 0})
    pretraining.train_and_evaluate(config, str(tmp_path))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 41))
    for r in train:
        assert abs(r["loss"] - r["mlm_loss"] - r["sbo_loss"]) < 1e-4
    first, last = np.mean([r["loss"] for r in train[:5]]), np.mean([r["loss"] for r in train[-5:]])
    assert last < first - 0.5
    assert np.mean([r["sbo_loss"] for r in train[-5:]]) < np.mean([r["sbo_loss"] for r in train[:5]]) - 0.2
    assert any("eval_sbo_loss" in r for r in records)
