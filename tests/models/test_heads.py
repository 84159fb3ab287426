"""Fine-tuning heads and objectives: span representations, shapes, dropout, padding rows, QA decoding,
and learning: a tiny BertModel + head must learn small synthetic tagging / span / QA tasks."""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models import heads
from models.bert import BertConfig, BertModel
from objectives.task_heads import HEAD_KINDS, head_kind
from objectives.task_heads.objective import FineTuningObjective

TASK_KINDS = tuple(HEAD_KINDS)


def numpy_span_representation(h, spans):
    out = np.zeros(spans.shape[:2] + (3 * h.shape[-1],), np.float32)
    for b in range(spans.shape[0]):
        for s, (i, j) in enumerate(spans[b]):
            out[b, s] = np.concatenate([h[b, i], h[b, j], h[b, i:j + 1].mean(axis=0)])
    return out


def test_span_representation_matches_a_loop():
    rng = np.random.default_rng(0)
    B, L, D, S = 3, 9, 5, 8
    h = rng.normal(size=(B, L, D)).astype(np.float32)
    start = rng.integers(0, L, (B, S))
    end = np.minimum(start + rng.integers(0, 4, (B, S)), L - 1)
    spans = np.stack([start, end], -1)
    spans[:, 0] = [L - 1, L - 1]   # a single token at the last position
    spans[:, 1] = [0, L - 1]       # the whole row
    spans[:, 2] = [3, 3]           # a single token
    got = heads.span_representation(jnp.asarray(h), jnp.asarray(spans, jnp.int32))
    assert got.shape == (B, S, 3 * D) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), numpy_span_representation(h, spans), rtol=1e-5, atol=1e-5)
    # bfloat16 states: the mean is still summed in float32, so it is as close as bf16 can store.
    got16 = heads.span_representation(jnp.asarray(h, jnp.bfloat16), jnp.asarray(spans, jnp.int32))
    assert got16.dtype == jnp.bfloat16
    ref16 = numpy_span_representation(np.asarray(jnp.asarray(h, jnp.bfloat16), np.float32), spans)
    np.testing.assert_allclose(np.asarray(got16, np.float32), ref16, rtol=1e-2, atol=1e-2)


def init_apply(head, *args, **kw):
    """head.init then head.apply, in one jitted function (one compile instead of one per eager op)."""
    def run(*a):
        variables = head.init(jax.random.key(0), *a, **kw)
        return variables, head.apply(variables, *a, **kw)
    return jax.jit(run)(*args)


def test_learned_boundaries_and_attentive_summary_match_the_chapters_equations():
    """boundaries=ffnn, summary=attention (J&M eqs. 11.17-11.20) against numpy on the head's own weights:
    s_i = GELU(h_i W_s + b_s), e_j = GELU(h_j W_e + b_e), g_ij = sum_k softmax_k(h_k w + b) h_k over i <= k <= j."""
    rng = np.random.default_rng(1)
    B, L, D = 2, 7, 4
    h = rng.normal(size=(B, L, D)).astype(np.float32)
    spans = np.array([[[0, 0], [1, 4], [2, 6]], [[3, 5], [6, 6], [0, 6]]], np.int32)
    head = heads.SpanClassificationHead(3, boundaries="ffnn", summary="attention")
    variables = head.init(jax.random.key(0), jnp.asarray(h), jnp.asarray(spans), deterministic=True)
    params = jax.tree.map(np.asarray, nn.meta.unbox(variables["params"]))
    rep = representation(head, variables, h, spans)

    def dense(name, x):
        return x @ params[name]["kernel"] + params[name]["bias"]
    gelu = lambda x: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2)))  # noqa: E731
    for b in range(B):
        for n, (i, j) in enumerate(spans[b]):
            scores = dense("attention_score", h[b, i:j + 1])[:, 0]
            weights = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
            expected = np.concatenate([gelu(dense("start_ffnn", h[b, i])), gelu(dense("end_ffnn", h[b, j])),
                                       weights @ h[b, i:j + 1]])
            np.testing.assert_allclose(rep[b, n], expected, rtol=1e-5, atol=1e-5)
    plain = heads.SpanClassificationHead(3)  # token boundaries + mean: eq. 11.16, as span_representation
    plain_vars = plain.init(jax.random.key(0), jnp.asarray(h), jnp.asarray(spans), deterministic=True)
    np.testing.assert_allclose(representation(plain, plain_vars, h, spans), numpy_span_representation(h, spans),
                               rtol=1e-5, atol=1e-5)


def representation(head, variables, h, spans) -> np.ndarray:
    """The spanRep [B, S, 3D] the head classifies (sown in 'intermediates')."""
    _, state = head.apply(variables, jnp.asarray(h), jnp.asarray(spans), deterministic=True, mutable=["intermediates"])
    return np.asarray(state["intermediates"]["span_representation"][0])


def test_head_shapes_and_logical_axes():
    B, L, D, S = 2, 7, 12, 3
    seq = jnp.ones((B, L, D)) * jnp.arange(L)[None, :, None] / L
    spans = jnp.asarray([[[0, 0], [1, 4], [6, 6]]] * B, jnp.int32)
    cases = [
        (heads.SequenceClassificationHead(3), (seq[:, 0],), (B, 3)),
        (heads.SequenceClassificationHead(1), (seq[:, 0],), (B, 1)),
        (heads.TokenClassificationHead(5), (seq,), (B, L, 5)),
        (heads.SpanClassificationHead(4), (seq, spans), (B, S, 4)),
        (heads.SpanClassificationHead(4, hidden_size=6), (seq, spans), (B, S, 4)),
    ]
    for head, args, shape in cases:
        variables, out = init_apply(head, *args, deterministic=True)
        assert out.shape == shape and out.dtype == jnp.float32, type(head).__name__
        for leaf in jax.tree.leaves(variables, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
            assert isinstance(leaf, nn.Partitioned) and None not in leaf.names[:1]  # sharding rules apply
    kernel = variables["params"]["hidden"]["kernel"].value
    assert kernel.shape == (3 * D, 6)  # spanRep_ij = [h_i; h_j; g_ij]
    variables, out = init_apply(heads.SpanClassificationHead(4), seq, spans, deterministic=True)
    assert variables["params"]["hidden"]["kernel"].value.shape == (3 * D, D)  # hidden_size=0: encoder width
    _, (start, end) = init_apply(heads.QuestionAnsweringHead(), seq)
    assert start.shape == end.shape == (B, L) and start.dtype == jnp.float32


def dropout_runner(head, variables, args):
    """(deterministic, seed) -> head output, jitted once per head."""
    return jax.jit(lambda det, seed: head.apply(variables, *args, deterministic=det,
                                                rngs={"dropout": jax.random.key(seed)}), static_argnums=0)


def test_dropout_only_when_not_deterministic():
    rng = np.random.default_rng(0)
    seq = jnp.asarray(rng.normal(size=(2, 6, 8)), jnp.float32)
    spans = jnp.asarray([[[0, 2], [3, 5]]] * 2, jnp.int32)
    for head, args in [(heads.SequenceClassificationHead(3, dropout_rate=0.5), (seq[:, 0],)),
                       (heads.TokenClassificationHead(3, dropout_rate=0.5), (seq,)),
                       (heads.SpanClassificationHead(3, dropout_rate=0.5), (seq, spans))]:
        variables = head.init(jax.random.key(0), *args, deterministic=True)
        run = dropout_runner(head, variables, args)
        np.testing.assert_array_equal(run(True, 1), run(True, 2))
        assert not np.allclose(run(False, 1), run(False, 2)), type(head).__name__


# ---------------------------------------------------------------------------------- objectives

L, C, S = 8, 3, 4


def random_case(kind, rng, B, pad=False):
    """Outputs and a batch for `kind`; pad=True makes weight-0 rows full of (valid-looking) junk."""
    mask = np.ones((B, L), np.int32)
    mask[:, 6:] = rng.integers(0, 2, (B, 2)) if not pad else 0
    batch = {"input_ids": rng.integers(5, 50, (B, L)).astype(np.int32),
             "segment_ids": np.repeat([[0, 0, 0, 1, 1, 1, 1, 1]], B, 0).astype(np.int32),
             "input_mask": mask, "weight": np.full(B, 0.0 if pad else 1.0, np.float32)}

    def normal(*shape):
        return rng.normal(size=shape).astype(np.float32) * 3
    if kind == "classification":
        out = {"logits": normal(B, C)}
        batch["label"] = rng.integers(0, C, B).astype(np.int32)
    elif kind == "regression":
        out = {"logits": normal(B, 1)}
        batch["label"] = rng.uniform(0, 5, B).astype(np.float32)
    elif kind == "tagging":
        out = {"logits": normal(B, L, C)}
        batch["labels"] = np.where(rng.random((B, L)) < 0.3, -100, rng.integers(0, C, (B, L))).astype(np.int32)
    elif kind == "span":
        out = {"logits": normal(B, S, C)}
        start = rng.integers(0, L, (B, S))
        batch["spans"] = np.stack([start, np.minimum(start + 2, L - 1)], -1).astype(np.int32)
        batch["span_labels"] = np.where(rng.random((B, S)) < 0.3, -100, rng.integers(0, C, (B, S))).astype(np.int32)
    else:
        out = {"start_logits": normal(B, L), "end_logits": normal(B, L)}
        batch["start_position"] = rng.integers(3, 6, B).astype(np.int32)
        batch["end_position"] = (batch["start_position"] + rng.integers(0, 2, B)).astype(np.int32)
    return out, batch


def concat(a, b):
    return {k: np.concatenate([a[k], b[k]]) for k in a}


@pytest.mark.parametrize("kind", TASK_KINDS)
def test_padding_examples_change_nothing(kind):
    rng = np.random.default_rng(TASK_KINDS.index(kind))
    obj = FineTuningObjective(kind, 1 if kind == "regression" else C)
    out, batch = random_case(kind, rng, 5)
    pad_out, pad_batch = random_case(kind, rng, 3, pad=True)
    loss_fn = jax.jit(obj.loss)
    loss, metrics = loss_fn(out, batch)
    padded_loss, padded_metrics = loss_fn(concat(out, pad_out), concat(batch, pad_batch))
    assert set(metrics) == {"loss", "examples"} | ({"accuracy"} if kind != "regression" else set())
    assert float(metrics["examples"]) == 5.0 and float(metrics["loss"]) == float(loss) > 0
    assert all(v.dtype == jnp.float32 and v.shape == () for v in metrics.values())
    np.testing.assert_allclose(float(padded_loss), float(loss), rtol=1e-6)
    for k in metrics:
        np.testing.assert_allclose(float(padded_metrics[k]), float(metrics[k]), rtol=1e-6, err_msg=k)
    # Gradients stay finite and exactly zero on the padding rows.
    grads = jax.jit(jax.grad(lambda o: obj.loss(o, concat(batch, pad_batch))[0]))(concat(out, pad_out))
    for g in grads.values():
        assert np.isfinite(g).all() and not np.asarray(g[5:]).any()
    inputs = obj.model_inputs(batch)
    assert set(inputs) == {"input_ids", "segment_ids", "input_mask"} | ({"spans"} if kind == "span" else set())


def test_losses_match_numpy():
    rng = np.random.default_rng(7)
    out, batch = random_case("regression", rng, 6)
    batch["weight"][[1, 4]] = 0
    loss, _ = FineTuningObjective("regression", 1).loss(out, batch)
    real = batch["weight"] > 0
    np.testing.assert_allclose(float(loss), np.mean((out["logits"][real, 0] - batch["label"][real]) ** 2), rtol=1e-6)

    out, batch = random_case("tagging", rng, 6)
    batch["weight"][2] = 0
    loss, metrics = FineTuningObjective("tagging", C).loss(out, batch)
    logp = out["logits"] - np.log(np.exp(out["logits"]).sum(-1, keepdims=True))
    keep = (batch["labels"] != -100) & (batch["weight"][:, None] > 0)
    ce = -np.take_along_axis(logp, np.maximum(batch["labels"], 0)[..., None], -1)[..., 0]
    np.testing.assert_allclose(float(loss), ce[keep].mean(), rtol=1e-5)
    acc = (out["logits"].argmax(-1) == batch["labels"])[keep].mean()
    np.testing.assert_allclose(float(metrics["accuracy"]), acc, rtol=1e-6)
    with pytest.raises(ValueError, match="kind"):
        FineTuningObjective("ner", 3)


def test_qa_predictions_are_the_best_valid_context_span():
    rng = np.random.default_rng(3)
    B, Lq, K = 64, 20, 4
    seg, mask = np.zeros((B, Lq), np.int32), np.zeros((B, Lq), np.int32)
    for b in range(B):  # [CLS] question [SEP] | context [SEP] | padding
        q, c = rng.integers(1, 6), rng.integers(1, 11)
        seg[b, q + 2:q + c + 3], mask[b, :q + c + 3] = 1, 1
    out = {"start_logits": rng.normal(size=(B, Lq)).astype(np.float32),
           "end_logits": rng.normal(size=(B, Lq)).astype(np.float32)}
    out["start_logits"][:, 0] += 3  # [CLS] is tempting, but not an answer unless allowed
    out["end_logits"][:, 0] += 3
    batch = {"segment_ids": seg, "input_mask": mask}
    pred = FineTuningObjective("qa", 2, max_answer_length=K).predictions(out, batch)
    for b in range(B):
        ctx = [i for i in range(Lq) if seg[b, i] == 1 and mask[b, i] == 1][:-1]  # the last [SEP] is not context
        best = max(((i, j) for i in ctx for j in ctx if i <= j < i + K),
                   key=lambda ij: out["start_logits"][b, ij[0]] + out["end_logits"][b, ij[1]])
        assert (int(pred["start"][b]), int(pred["end"][b])) == best
    null = FineTuningObjective("qa", 2, allow_null_answer=True).predictions(out, batch)
    chose_null = (np.asarray(null["start"]) == 0) & (np.asarray(null["end"]) == 0)
    null_score = out["start_logits"][:, 0] + out["end_logits"][:, 0]
    assert chose_null.any() and (null_score[chose_null] > 2).all()
    with pytest.raises(ValueError, match="batch"):
        FineTuningObjective("qa", 2).predictions(out)


# ------------------------------------------------------------------------------------- learning

VOCAB, TRIGGERS = 50, np.arange(5, 20)  # ids 0-4 are specials; 15 of the 45 word ids are triggers
CONFIG = BertConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                    max_position_embeddings=32, dropout_rate=0.0, attention_dropout_rate=0.0)


class Finetuner(nn.Module):
    """BertModel + a head, returning what FineTuningObjective reads (the registered head kind's outputs)."""
    kind: str
    head: nn.Module

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic=True, **inputs):
        seq, pooled = BertModel(CONFIG, name="bert")(input_ids, segment_ids, input_mask, deterministic)
        return head_kind(self.kind).outputs(self.head, seq, pooled, inputs, deterministic)


@functools.cache
def bert_params():
    """The encoder's initial weights, shared by the learning tests: compiling BERT's init takes seconds."""
    ids = jnp.zeros((1, 8), jnp.int32)
    return nn.meta.unbox(jax.jit(BertModel(CONFIG).init)(jax.random.key(0), ids, ids, ids + 1)["params"])


def fit(kind, head, train, steps=600, lr=3e-3, batch_size=32):
    """Adam on random minibatches of `train`; returns a jitted function batch -> predictions."""
    obj, model = FineTuningObjective(kind, getattr(head, "num_labels", 2)), Finetuner(kind, head)
    train = {**train, "weight": np.ones(len(train["input_ids"]), np.float32)}
    seq = jnp.zeros((1, 8, CONFIG.hidden_size))
    head_args = {"tagging": (seq, True), "span": (seq, jnp.zeros((1, 1, 2), jnp.int32), True), "qa": (seq,)}[kind]
    params = {"bert": bert_params(), "head": nn.meta.unbox(head.init(jax.random.key(1), *head_args)["params"])}
    tx = optax.adam(optax.linear_schedule(0.0, lr, 50))  # a short warmup, as BERT fine-tuning does

    @jax.jit
    def step(params, opt_state, batch):
        grads = jax.grad(lambda p: obj.loss(model.apply({"params": p}, **obj.model_inputs(batch)), batch)[0])(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state

    opt_state, rng = jax.jit(tx.init)(params), np.random.default_rng(1)
    for _ in range(steps):
        idx = rng.integers(0, len(train["input_ids"]), batch_size)
        params, opt_state = step(params, opt_state, {k: v[idx] for k, v in train.items()})
    return jax.jit(lambda batch: obj.predictions(model.apply({"params": params}, **obj.model_inputs(batch)), batch))


def token_batch(rng, n, length):
    ids = rng.integers(5, VOCAB, (n, length)).astype(np.int32)
    ids[:, 0] = 2  # [CLS]
    return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": np.ones_like(ids)}


def test_learns_bio_tagging_that_needs_context():
    """I after a trigger, B on a trigger that no trigger precedes, O elsewhere: one token alone cannot say."""
    def data(rng, n):
        b = token_batch(rng, n, 16)
        trig = np.isin(b["input_ids"], TRIGGERS)
        after = np.pad(trig[:, :-1], ((0, 0), (1, 0)))
        b["labels"] = np.where(after, 2, np.where(trig, 1, 0)).astype(np.int32)
        b["labels"][:, 0] = -100
        return b
    train, test = data(np.random.default_rng(0), 1024), data(np.random.default_rng(1), 256)
    tags = np.asarray(fit("tagging", heads.TokenClassificationHead(3), train)(test)["tags"])
    keep = test["labels"] != -100
    accuracy = (tags == test["labels"])[keep].mean()
    majority = np.bincount(train["labels"][train["labels"] != -100]).argmax()
    baseline = (test["labels"][keep] == majority).mean()
    assert accuracy > 0.95 and accuracy > baseline + 0.3, (accuracy, baseline)


def test_learns_span_classification_from_boundaries():
    """Label 1: the span starts on a trigger; 2: it ends on one (and does not start on one); 0: neither."""
    def data(rng, n):
        b = token_batch(rng, n, 16)
        start = rng.integers(1, 16, (n, 6))
        end = np.minimum(start + rng.integers(0, 4, (n, 6)), 15)
        b["spans"] = np.stack([start, end], -1).astype(np.int32)

        def trig(pos):
            return np.isin(np.take_along_axis(b["input_ids"], pos, 1), TRIGGERS)
        b["span_labels"] = np.where(trig(start), 1, np.where(trig(end), 2, 0)).astype(np.int32)
        return b
    train, test = data(np.random.default_rng(0), 1024), data(np.random.default_rng(1), 256)
    pred = np.asarray(fit("span", heads.SpanClassificationHead(3), train)(test)["span_label"])
    accuracy = (pred == test["span_labels"]).mean()
    baseline = (test["span_labels"] == np.bincount(train["span_labels"].ravel()).argmax()).mean()
    assert accuracy > 0.9 and accuracy > baseline + 0.3, (accuracy, baseline)


def test_learns_extractive_qa_between_markers():
    """The answer is the context text between markers 5 and 6; the question holds decoy markers."""
    def data(rng, n):
        ids = rng.integers(7, VOCAB, (n, 24)).astype(np.int32)
        ids[:, [0, 1, 3, 5]] = [2, 5, 6, 3]                # [CLS] 5 w 6 [SEP]: decoy markers, segment 0
        first = rng.integers(7, 18, n)                     # context at 6..22, closing [SEP] at 23
        last = first + rng.integers(0, 3, n)               # answers of 1 to 3 tokens
        rows = np.arange(n)
        ids[rows, first - 1], ids[rows, last + 1], ids[:, 23] = 5, 6, 3
        seg = np.zeros_like(ids)
        seg[:, 6:] = 1
        return {"input_ids": ids, "segment_ids": seg, "input_mask": np.ones_like(ids),
                "start_position": first.astype(np.int32), "end_position": last.astype(np.int32)}
    train, test = data(np.random.default_rng(0), 1024), data(np.random.default_rng(1), 256)
    pred = fit("qa", heads.QuestionAnsweringHead(), train, steps=800)(test)
    exact = ((np.asarray(pred["start"]) == test["start_position"])
             & (np.asarray(pred["end"]) == test["end_position"])).mean()
    pairs, counts = np.unique(np.stack([train["start_position"], train["end_position"]], 1), axis=0,
                              return_counts=True)
    s, e = pairs[counts.argmax()]
    baseline = ((test["start_position"] == s) & (test["end_position"] == e)).mean()
    assert exact > 0.9 and exact > baseline + 0.5, (exact, baseline)
