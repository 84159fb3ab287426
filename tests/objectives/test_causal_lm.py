"""Tests for objectives/causal_lm.py and objectives/prefix_lm.py: decoder-only batches and loss.

Documents use self-describing ids: token = BASE + STRIDE * document + offset, so every (input,
target) pair of a batch can be checked against the document it came from.
"""
import collections
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from scipy import stats

from objectives import causal_lm, packing, prefix_lm
from objectives.causal_lm import CausalLM, causal_lm_loss
from objectives.interface import ObjectiveError
from objectives.prefix_lm import PrefixLM
from pretrain.data.tokenizers import MissingTokenError

EOS, PAD, BASE, STRIDE = 1, 3, 10, 1000


def tokenizer(eos=True, num_docs=200):
    tok = types.SimpleNamespace(vocab_size=BASE + STRIDE * num_docs, pad_id=PAD)
    if eos:
        tok.eos_id = EOS
    return tok


def objective(cls=CausalLM, tok=None, **kw):
    cfg = ml_collections.ConfigDict(dict(name="causal_lm", pack_documents=True, z_loss=0.0))
    cfg.update(kw)
    return cls(cfg, tok or tokenizer())


def documents(rng, n=40, max_len=30):
    """n documents, each split into 1-3 sentences, of 1..max_len coded tokens."""
    docs = []
    for d in range(n):
        ids = BASE + STRIDE * d + np.arange(rng.integers(1, max_len + 1))
        cuts = np.sort(rng.choice(np.arange(1, len(ids)), min(rng.integers(0, 3), len(ids) - 1), replace=False))
        docs.append(np.split(ids, cuts))
    return docs


def doc_and_offset(token):
    return (token - BASE) // STRIDE, (token - BASE) % STRIDE


def weighted_pairs(batch):
    w = batch["loss_weights"] > 0
    return list(zip(batch["input_ids"][w].tolist(), batch["target_ids"][w].tolist()))


def all_rows(obj, docs, L, seed=0):
    inst = obj.create_instances(docs, np.random.default_rng(seed), L)
    return inst, obj.make_batch(inst, np.random.default_rng(seed + 1))


# ---------------------------------------------------------------------------------------------
# Batches.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [CausalLM, PrefixLM])
@pytest.mark.parametrize("pack", [True, False])
def test_batch_keys_shapes_dtypes(cls, pack):
    L = 16
    obj = objective(cls, pack_documents=pack)
    inst, batch = all_rows(obj, documents(np.random.default_rng(0)), L)
    keys = causal_lm.BATCH_KEYS if cls is CausalLM else prefix_lm.BATCH_KEYS
    assert set(batch) == set(keys)
    B = len(inst["input_ids"])
    assert inst["input_ids"].shape == inst["segment_ids"].shape == (B, L + 1)
    for k in ("input_ids", "target_ids", "segment_ids", "positions"):
        assert batch[k].shape == (B, L) and batch[k].dtype == np.int32, k
    assert batch["loss_weights"].shape == (B, L) and batch["loss_weights"].dtype == np.float32
    if cls is PrefixLM:
        assert batch["prefix_lengths"].shape == (B,) and batch["prefix_lengths"].dtype == np.int32
        assert batch["bidirectional_mask"].shape == (B, L) and batch["bidirectional_mask"].dtype == bool
    assert set(obj.model_inputs(batch)) == set(causal_lm.MODEL_INPUT_KEYS) | (
        {"prefix_lengths"} if cls is PrefixLM else set())


def test_stream_rows_train_every_next_token_pair_once():
    """pack_documents=True: the weighted pairs are exactly the adjacent pairs of the EOS-joined
    stream, each once (rows overlap by one token, so no pair is lost at a row boundary)."""
    docs = documents(np.random.default_rng(1))
    inst, batch = all_rows(objective(pack_documents=True), docs, L=8)
    pairs = collections.Counter(weighted_pairs(batch))
    assert max(pairs.values()) == 1
    total = sum(len(s) for d in docs for s in d)
    assert len(pairs) == total + (len(docs) - 1) - 1  # stream = tokens + EOS between documents
    for a, b in pairs:
        if a == EOS:
            assert doc_and_offset(b)[1] == 0  # EOS is followed by a document's first token
        elif b != EOS:
            assert doc_and_offset(b) == (doc_and_offset(a)[0], doc_and_offset(a)[1] + 1)
    assert (batch["target_ids"][:, :-1] == batch["input_ids"][:, 1:])[batch["loss_weights"][:, :-1] > 0].all()
    assert (batch["positions"] == np.where(batch["segment_ids"] > 0, np.arange(8), 0)).all()
    assert (inst["segment_ids"] <= 1).all()  # one example per row: attention spans the stream


def test_stream_windows_start_at_a_random_offset_each_epoch():
    """The window grid of the stream shifts per epoch (nanoGPT samples random offsets), and every
    epoch still trains every pair exactly once. One document: its order cannot change the windows."""
    docs = [[BASE + np.arange(0, 500, dtype=np.int32)]]
    obj = objective(pack_documents=True)
    offsets = set()
    for seed in range(8):
        inst = obj.create_instances(docs, np.random.default_rng(seed), 8)
        full = inst["input_ids"][(inst["segment_ids"] == 1).all(axis=1)]  # whole windows of 9 tokens
        offsets |= {int(row[0] - BASE) % 8 for row in full}                # where the grid starts
        assert len({int(row[0] - BASE) % 8 for row in full}) == 1          # one grid per epoch
        pairs = collections.Counter(weighted_pairs(obj.make_batch(inst, None)))
        assert max(pairs.values()) == 1 and len(pairs) == 499
    assert len(offsets) >= 4


def test_stream_without_eos_concatenates_documents():
    """A tokenizer without EOS (a missing attribute or our Tokenizer's MissingTokenError): no separator."""
    class NoEos:
        vocab_size, pad_id = BASE + STRIDE * 40, PAD

        @property
        def eos_id(self):
            raise MissingTokenError("no </s>")

    docs = documents(np.random.default_rng(2))
    for tok in (tokenizer(eos=False), NoEos()):
        assert causal_lm.eos_id_or_none(tok) is None
        _, batch = all_rows(objective(tok=tok), docs, L=8)
        assert EOS not in batch["input_ids"]
        assert len(weighted_pairs(batch)) == sum(len(s) for d in docs for s in d) - 1


def test_packed_documents_never_cross_a_boundary():
    """pack_documents=False: each weighted pair is inside one document (or its last token -> EOS),
    every pair of every document is there once (also of documents longer than a row), segments
    are contiguous documents with positions from 0, and padding has no weight."""
    L = 12
    docs = documents(np.random.default_rng(3), max_len=40)
    inst, batch = all_rows(objective(pack_documents=False), docs, L)
    pairs = collections.Counter(weighted_pairs(batch))
    assert max(pairs.values()) == 1
    assert len(pairs) == sum(len(s) for d in docs for s in d)  # n tokens + EOS -> n pairs
    for a, b in pairs:
        assert a != EOS
        if b != EOS:
            assert doc_and_offset(b) == (doc_and_offset(a)[0], doc_and_offset(a)[1] + 1)
    assert any(sum(len(s) for s in d) + 1 > L + 1 for d in docs)  # some documents were cut
    assert (inst["segment_ids"].max(axis=1) > 1).any()  # and some rows hold several documents
    seg, pos, ids = batch["segment_ids"], batch["positions"], batch["input_ids"]
    for r in range(len(seg)):
        for s in range(1, seg[r].max() + 1):
            cols = np.flatnonzero(seg[r] == s)
            assert (np.diff(cols) == 1).all()
            assert (pos[r, cols] == np.arange(len(cols))).all()
            real = ids[r, cols][ids[r, cols] != EOS]
            assert len({doc_and_offset(t)[0] for t in real}) == 1
            assert (np.diff(real) == 1).all()
        weights = batch["loss_weights"][r]
        assert (weights[seg[r] == 0] == 0).all() and (ids[r][seg[r] == 0] == PAD).all()
        assert (batch["target_ids"][r][weights == 0] == PAD).all()


def test_positions_match_packing():
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 9, 60)
    packed = packing.pack_flat({"t": rng.integers(5, 50, lengths.sum())}, {"t": lengths}, {"t": 10})
    assert (causal_lm.positions_from_segments(packed["t_segment_ids"]) == packed["t_positions"]).all()


@pytest.mark.parametrize("cls", [CausalLM, PrefixLM])
@pytest.mark.parametrize("pack", [True, False])
def test_deterministic_for_a_given_rng(cls, pack):
    obj, docs = objective(cls, pack_documents=pack), documents(np.random.default_rng(5))
    (i1, b1), (i2, b2), (i3, _) = all_rows(obj, docs, 8, seed=7), all_rows(obj, docs, 8, seed=7), \
        all_rows(obj, docs, 8, seed=8)
    for k in i1:
        np.testing.assert_array_equal(i1[k], i2[k], err_msg=k)
    for k in b1:
        np.testing.assert_array_equal(b1[k], b2[k], err_msg=k)
    assert not np.array_equal(i1["input_ids"], i3["input_ids"])


def test_user_errors():
    with pytest.raises(ObjectiveError, match="pack_documents"):
        CausalLM(ml_collections.ConfigDict(dict(name="causal_lm", pack_documents="yes")), tokenizer())
    with pytest.raises(ObjectiveError, match="z_loss"):
        objective(z_loss=-1.0)
    with pytest.raises(ObjectiveError, match="no tokens"):
        objective().create_instances([[np.zeros(0, np.int32)]], np.random.default_rng(0), 8)
    with pytest.raises(ObjectiveError, match="fewer than 2"):
        objective(tok=tokenizer(eos=False), pack_documents=False).create_instances(
            [[np.array([BASE])]], np.random.default_rng(0), 8)


# ---------------------------------------------------------------------------------------------
# Prefix LM.
# ---------------------------------------------------------------------------------------------
def test_prefix_split_uniform_and_no_loss_inside_the_prefix():
    L = 8
    obj = objective(PrefixLM, pack_documents=True)
    inst = obj.create_instances(documents(np.random.default_rng(6), n=60), np.random.default_rng(0), L)
    causal = CausalLM.make_batch(obj, inst, None)
    rng = np.random.default_rng(1)
    splits = collections.Counter()
    for _ in range(60):
        batch = obj.make_batch(inst, rng)
        n = (inst["segment_ids"] > 0).sum(axis=1)
        p = batch["prefix_lengths"]
        assert ((p >= 1) & (p <= n - 1)).all()
        cols = np.arange(L)
        assert (batch["bidirectional_mask"] == (cols < p[:, None])).all()
        # Targets x_{i+1} inside the prefix (i + 1 < p) carry no loss; every later target keeps it.
        expected = np.where(cols + 1 < p[:, None], 0.0, causal["loss_weights"])
        np.testing.assert_array_equal(batch["loss_weights"], expected)
        splits.update(p[n == L + 1].tolist())
    counts = np.array([splits[k] for k in range(1, L + 1)])
    assert counts.sum() == sum(splits.values()) and counts.sum() > 5000  # only values in [1, L]
    assert stats.chisquare(counts).pvalue > 1e-4


# ---------------------------------------------------------------------------------------------
# Loss.
# ---------------------------------------------------------------------------------------------
def reference_loss(logits, batch, z_loss):
    """Per-token loop in float64: mean over weighted tokens of -log p(target) + z_loss log(Z)^2."""
    logits = np.asarray(logits, np.float64)
    ce = zl = correct = total = 0.0
    for b, i in zip(*np.nonzero(batch["loss_weights"])):
        w = batch["loss_weights"][b, i]
        row = logits[b, i]
        log_z = np.log(np.exp(row - row.max()).sum()) + row.max()
        ce += w * (log_z - row[batch["target_ids"][b, i]])
        zl += w * z_loss * log_z ** 2
        correct += w * (row.argmax() == batch["target_ids"][b, i])
        total += w
    return ce / total, zl / total, correct / total


@pytest.mark.parametrize("cls", [CausalLM, PrefixLM])
def test_loss_matches_numpy_reference(cls):
    """A stand-in bigram "model" (logits = a fixed table row per input id) through model_inputs."""
    z = 1e-2
    obj = objective(cls, pack_documents=False, z_loss=z, tok=tokenizer(num_docs=3))
    docs = documents(np.random.default_rng(7), n=3, max_len=20)
    _, batch = all_rows(obj, docs, L=10)
    V = obj.tokenizer.vocab_size
    table = jnp.asarray(np.random.default_rng(8).normal(0, 3, (V, V)).astype(np.float32))

    def model(input_ids, segment_ids, positions, prefix_lengths=None):
        return {"logits": table[input_ids]}

    loss, metrics = jax.jit(lambda b: obj.loss(model(**obj.model_inputs(b)), b))(batch)
    ce, zl, acc = reference_loss(np.asarray(table)[batch["input_ids"]], batch, z)
    np.testing.assert_allclose(float(metrics["cross_entropy"]), ce, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["z_loss"]), zl, rtol=1e-5)
    np.testing.assert_allclose(float(loss), ce + zl, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss"]), ce + zl, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["accuracy"]), acc, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["perplexity"]), np.exp(ce), rtol=1e-5)
    assert float(metrics["tokens"]) == (batch["segment_ids"] > 0).sum()


def test_loss_of_all_padding_batch_is_zero():
    batch = {"target_ids": jnp.zeros((2, 4), jnp.int32), "loss_weights": jnp.zeros((2, 4)),
             "segment_ids": jnp.zeros((2, 4), jnp.int32)}
    loss, metrics = causal_lm_loss(jnp.ones((2, 4, 7)), batch, z_loss=1e-4)
    assert float(loss) == 0.0 and float(metrics["perplexity"]) == 1.0 and float(metrics["tokens"]) == 0
