"""Tests for objectives/nsp.py: BERT sentence-pair instances and the NSP loss; ALBERT's sentence-order pairs
(sentence_order=True) and the objective's switch and metric names.

Token ids encode (document, sentence, position) so that every instance can be traced back to
the corpus: id = 10 + doc * 10**6 + sentence * 10**3 + position.
"""
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from objectives.bert_pretraining import BertPretraining
from objectives.interface import ObjectiveError
from objectives.nsp import _truncate_pair, create_instances, nsp_loss

PAD, CLS, SEP = 0, 1, 2
IDS = {"cls_id": CLS, "sep_id": SEP, "pad_id": PAD}


def make_corpus(rng, n_docs, n_sents, lengths):
    """n_docs documents of n_sents=(lo, hi) sentences, each of lengths=(lo, hi) tokens."""
    return [[10 + d * 10**6 + s * 10**3 + np.arange(rng.integers(lengths[0], lengths[1] + 1))
             for s in range(rng.integers(n_sents[0], n_sents[1] + 1))] for d in range(n_docs)]


class Tracer:
    """Maps token ids back to (doc, offset in doc) and sentence boundaries."""

    def __init__(self, docs):
        self.offsets = [np.concatenate([[0], np.cumsum([len(s) for s in d])]) for d in docs]

    def locate(self, toks):  # -> doc [n], global offset within the doc [n]
        t = np.asarray(toks) - 10
        doc, sent, pos = t // 10**6, t // 10**3 % 10**3, t % 10**3
        return doc, np.array([self.offsets[d][s] for d, s in zip(doc, sent)]) + pos

    def is_sentence_start(self, doc, g):
        return g in self.offsets[doc]

    def is_sentence_end(self, doc, g):
        return g + 1 in self.offsets[doc]


def split(row, seg, n_real):
    """input_ids row -> (A tokens, B tokens); checks the [CLS] A [SEP] B [SEP] layout."""
    assert row[0] == CLS and row[n_real - 1] == SEP
    seps = np.flatnonzero(row[:n_real] == SEP)
    assert len(seps) == 2
    np.testing.assert_array_equal(seg[:n_real], np.arange(n_real) > seps[0])
    return row[1:seps[0]], row[seps[0] + 1:n_real - 1]


def check_layout(out, max_seq_length):
    ids, seg, mask = out["input_ids"], out["segment_ids"], out["input_mask"]
    assert ids.shape[1] == max_seq_length and ids.dtype == np.int32
    assert seg.dtype == mask.dtype == out["next_sentence_labels"].dtype == np.int32
    np.testing.assert_array_equal(mask, ids != PAD)
    assert (np.diff(mask, axis=1) <= 0).all()  # real tokens first, then padding
    assert (seg[mask == 0] == 0).all()


def test_pairs_are_bert_instances():
    rng = np.random.default_rng(0)
    docs = make_corpus(rng, 200, (400, 500), (3, 20))
    tr = Tracer(docs)
    L = 128
    # short_seq_prob=0: short targets force single-sentence chunks, which are always random-next
    # in BERT, so with the default 0.1 the rate is ~0.53 on this corpus.
    out = create_instances(docs, rng, max_seq_length=L, short_seq_prob=0.0, **IDS)
    check_layout(out, L)
    labels = out["next_sentence_labels"]
    assert len(labels) >= 10_000
    assert abs(labels.mean() - 0.5) < 0.02
    n_real = out["input_mask"].sum(1)
    assert (n_real <= L).all()
    covered = set()  # (doc, sentence) pairs that made it into some instance as own text
    for row, seg, n, label in zip(out["input_ids"], out["segment_ids"], n_real, labels):
        a, b = split(row, seg, n)
        assert len(a) >= 1 and len(b) >= 1
        (da, ga), (db, gb) = tr.locate(a), tr.locate(b)
        assert (da == da[0]).all() and (db == db[0]).all()
        assert (np.diff(ga) == 1).all() and (np.diff(gb) == 1).all()  # contiguous text
        covered.update(zip(*np.divmod(np.asarray(a) - 10, 10**6)))
        if label == 0:  # the true continuation, within the same document
            assert db[0] == da[0] and gb[0] > ga[-1]
            if len(a) + len(b) < L - 3:  # not truncated: whole sentences, nothing in between
                d = da[0]
                assert gb[0] == ga[-1] + 1
                assert tr.is_sentence_start(d, ga[0]) and tr.is_sentence_end(d, gb[-1])
                assert tr.is_sentence_end(d, ga[-1])
            covered.update(zip(*np.divmod(np.asarray(b) - 10, 10**6)))
        else:
            assert db[0] != da[0]
    # Every sentence is used: a random B "puts back" the unused rest of its chunk. Only a
    # sentence truncated away entirely is lost.
    covered = {(d, off // 10**3) for d, off in covered}
    assert len(covered) > 0.98 * sum(len(d) for d in docs)


def test_truncation_front_and_back():
    rng = np.random.default_rng(1)
    docs = make_corpus(rng, 20, (3, 6), (20, 60))  # sentences longer than the sequence
    tr = Tracer(docs)
    L = 32
    out = create_instances(docs, rng, max_seq_length=L, short_seq_prob=0.0, **IDS)
    check_layout(out, L)
    cut = {"a_front": 0, "a_back": 0, "b_front": 0, "b_back": 0}
    for row, seg, n in zip(out["input_ids"], out["segment_ids"], out["input_mask"].sum(1)):
        assert n == L  # always truncated to exactly max_num_tokens
        a, b = split(row, seg, n)
        for name, toks in (("a", a), ("b", b)):
            d, g = tr.locate(toks)
            assert (np.diff(g) == 1).all()
            cut[name + "_front"] += not tr.is_sentence_start(d[0], g[0])
            cut[name + "_back"] += not tr.is_sentence_end(d[0], g[-1])
    assert min(cut.values()) > 0.2 * len(out["input_ids"]), cut


def test_truncate_pair_matches_bert_loop():
    """The closed form removes as many tokens from A and B as BERT's pop loop (ties: B)."""
    rng = np.random.default_rng(0)
    for la, lb, m in np.ndindex(12, 12, 11):
        if la == 0 or lb == 0 or m < 2:
            continue
        na, nb = la, lb
        while na + nb > m:
            if na > nb:
                na -= 1
            else:
                nb -= 1
        a, b = _truncate_pair(np.arange(la), np.arange(lb), m, rng)
        assert (len(a), len(b)) == (na, nb), (la, lb, m)
        assert (np.diff(a) == 1).all() and (np.diff(b) == 1).all()


def test_short_seq_prob():
    """Per document, with prob p the target length is uniform in [2, 61] instead of 61."""
    docs = make_corpus(np.random.default_rng(2), 2000, (80, 80), (1, 4))
    L = 64  # max_num_tokens = 61
    for p in (0.0, 0.2):
        out = create_instances(docs, np.random.default_rng(3), max_seq_length=L,
                               short_seq_prob=p, **IDS)
        first_doc = (out["input_ids"][:, 1] - 10) // 10**6  # A comes from the document itself
        longest = np.zeros(len(docs), int)
        np.maximum.at(longest, first_doc, out["input_mask"].sum(1))
        # A target t <= 57 caps every instance at t + 3 (the longest sentence, 4, minus 1) < 61
        # tokens; a full-length document reaches 61 with its first chunk.
        short_rate = (longest < L).mean()
        assert abs(short_rate - p * 56 / 60) < 0.025, (p, short_rate)
        if p:  # targets spread over [2, 57]: longest = target + 3 specials + overshoot (<= 3)
            short = longest[longest < L]
            assert 31 < short.mean() < 40 and short.min() < 15 and short.max() > 55, short


def test_no_next_sentence_packs_whole_sentences():
    rng = np.random.default_rng(4)
    docs = make_corpus(rng, 50, (5, 30), (1, 20))
    docs[0][2] = 10 + 2 * 10**3 + np.arange(100)  # longer than the budget: truncated
    tr = Tracer(docs)
    L = 48
    out = create_instances(docs, rng, max_seq_length=L, next_sentence=False, **IDS)
    check_layout(out, L)
    assert (out["segment_ids"] == 0).all() and (out["next_sentence_labels"] == 0).all()
    n_real = out["input_mask"].sum(1)
    total = 0
    for row, n in zip(out["input_ids"], n_real):
        assert row[0] == CLS and row[n - 1] == SEP and (row[1:n - 1] != SEP).all()
        d, g = tr.locate(row[1:n - 1])
        assert (d == d[0]).all() and (np.diff(g) == 1).all()
        assert tr.is_sentence_start(d[0], g[0])
        assert tr.is_sentence_end(d[0], g[-1]) or n == L  # ends a sentence unless truncated
        total += n - 2
    # Nothing is lost but the truncated tail of the long sentence.
    assert total == sum(len(s) for doc in docs for s in doc) - (100 - (L - 2))


def test_deterministic_and_shuffled():
    docs = make_corpus(np.random.default_rng(5), 30, (5, 20), (2, 10))
    a = create_instances(docs, np.random.default_rng(0), max_seq_length=64, **IDS)
    b = create_instances(docs, np.random.default_rng(0), max_seq_length=64, **IDS)
    c = create_instances(docs, np.random.default_rng(1), max_seq_length=64, **IDS)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["input_ids"][:20], c["input_ids"][:20])
    first_doc = (a["input_ids"][:, 1] - 10) // 10**6
    assert (np.diff(first_doc) != 0).mean() > 0.5  # instances shuffled, not grouped by document


def test_errors():
    rng = np.random.default_rng(6)
    one_doc = make_corpus(rng, 1, (5, 5), (3, 5))
    with pytest.raises(ValueError, match="at least 2 non-empty documents"):
        create_instances(one_doc + [[], [np.array([], np.int32)]], rng, max_seq_length=32, **IDS)
    with pytest.raises(ValueError, match="empty"):
        create_instances([[]], rng, max_seq_length=32, next_sentence=False, **IDS)
    with pytest.raises(ValueError, match="max_seq_length"):
        create_instances(make_corpus(rng, 3, (2, 2), (2, 2)), rng, max_seq_length=4, **IDS)
    # One document is enough without NSP.
    out = create_instances(one_doc, rng, max_seq_length=32, next_sentence=False, **IDS)
    assert len(out["input_ids"]) >= 1


def test_nsp_loss_matches_numpy():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(16, 2)).astype(np.float32) * 2
    labels = rng.integers(0, 2, 16)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -logp[np.arange(16), labels].mean()
    loss16, _ = nsp_loss(jnp.asarray(logits, jnp.bfloat16), jnp.asarray(labels))
    assert loss16.dtype == jnp.float32
    np.testing.assert_allclose(loss16, want, rtol=2e-2)
    loss, m = nsp_loss(jnp.asarray(logits), jnp.asarray(labels))
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(m["nsp_loss"], want, rtol=1e-5)
    np.testing.assert_allclose(m["nsp_accuracy"], (logits.argmax(-1) == labels).mean())


# ----- sentence-order prediction (ALBERT) -----
def sop(docs, seed=0, max_seq_length=64, short_seq_prob=0.0):
    return create_instances(docs, np.random.default_rng(seed), max_seq_length=max_seq_length,
                            short_seq_prob=short_seq_prob, **IDS, sentence_order=True)


def pairs(out):
    n_real = out["input_mask"].sum(1)
    return [(*split(row, seg, n), label) for row, seg, n, label
            in zip(out["input_ids"], out["segment_ids"], n_real, out["next_sentence_labels"])]


def test_sop_pairs_are_consecutive_segments_of_one_document_swapped_half_the_time():
    rng = np.random.default_rng(0)
    docs = make_corpus(rng, 400, (1, 12), (2, 15))  # one pair per document
    out = sop(docs, max_seq_length=512)  # longer than any document: nothing is truncated
    check_layout(out, 512)
    tracer = Tracer(docs)
    labels = []
    for a, b, label in pairs(out):
        assert len(a) and len(b)
        first, second = (b, a) if label else (a, b)  # label 1: B came first in the document
        doc, offsets = tracer.locate(np.concatenate([first, second]))
        assert (doc == doc[0]).all()
        np.testing.assert_array_equal(offsets, offsets[0] + np.arange(len(offsets)))  # one contiguous run
        labels.append(label)
    n = len(labels)
    assert n == 400 and abs(np.mean(labels) - 0.5) < 4 * np.sqrt(0.25 / n)  # swapped with probability 1/2


def test_sop_pairs_stay_in_order_within_their_document_when_truncated():
    rng = np.random.default_rng(1)
    docs = make_corpus(rng, 30, (5, 30), (3, 20))
    out = sop(docs, max_seq_length=24, short_seq_prob=0.1)
    check_layout(out, 24)
    tracer = Tracer(docs)
    for a, b, label in pairs(out):
        first, second = (b, a) if label else (a, b)
        (doc_1, off_1), (doc_2, off_2) = tracer.locate(first), tracer.locate(second)
        assert len(set(doc_1) | set(doc_2)) == 1       # never another document's text
        assert off_1.max() < off_2.min()                # the first segment precedes the second
        assert len(a) + len(b) <= 24 - 3


def test_a_single_sentence_is_cut_in_two_and_one_document_suffices():
    docs = [[10 + np.arange(40)]]  # one document of one 40-token sentence
    out = sop(docs, max_seq_length=64)
    (a, b, label), = pairs(out)
    first, second = (b, a) if label else (a, b)
    np.testing.assert_array_equal(np.concatenate([first, second]), 10 + np.arange(40))


def test_a_corpus_of_one_token_documents_has_no_sop_pair():
    with pytest.raises(ValueError, match="^no sentence-order pair: every document is a single token"):
        sop([[np.array([11])], [np.array([12])]])


@pytest.mark.parametrize("next_sentence, needle", [(True, "no next-sentence pair"),
                                                   (False, "no packed sequence (next_sentence=False)")])
def test_the_no_instance_error_names_the_mode_in_use(monkeypatch, next_sentence, needle):
    """NSP and packing make an instance of any non-empty document, so their documents are made to yield none here:
    the error names their mode, not sentence order's."""
    from objectives import nsp
    monkeypatch.setattr(nsp, "_pairs_from_document" if next_sentence else "_packed_from_document",
                        lambda *args: [])
    with pytest.raises(ValueError) as e:
        create_instances([[np.arange(10, 20)], [np.arange(20, 30)]], np.random.default_rng(0), max_seq_length=32,
                         next_sentence=next_sentence, **IDS)
    assert str(e.value).startswith(needle) and "sentence-order" not in str(e.value) and "\n" not in str(e.value)


def test_sentence_order_without_next_sentence_is_an_error():
    with pytest.raises(ValueError, match="needs next_sentence=True"):
        create_instances([[np.arange(10, 20)]], np.random.default_rng(0), max_seq_length=32, **IDS,
                         next_sentence=False, sentence_order=True)
    config = ml_collections.ConfigDict(dict(next_sentence=False, sentence_order=True, max_predictions_per_seq=4))
    with pytest.raises(ObjectiveError) as e:
        BertPretraining(config, tokenizer=None)
    assert "objective.sentence_order=True needs config.objective.next_sentence=True" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("sentence_order, name", [(False, "nsp"), (True, "sop")])
def test_pair_head_metrics_are_named_sop_under_sentence_order(sentence_order, name):
    config = ml_collections.ConfigDict(dict(next_sentence=True, sentence_order=sentence_order,
                                            max_predictions_per_seq=2))
    objective = BertPretraining(config, tokenizer=None)
    batch = {"masked_lm_ids": jnp.zeros((2, 2), jnp.int32), "masked_lm_weights": jnp.ones((2, 2)),
             "next_sentence_labels": jnp.array([0, 1]), "input_mask": jnp.ones((2, 4), jnp.int32)}
    outputs = {"mlm_logits": jnp.zeros((2, 2, 5)), "nsp_logits": jnp.array([[2.0, 0.0], [0.0, 2.0]])}
    _, metrics = objective.loss(outputs, batch)
    assert float(metrics[f"{name}_accuracy"]) == 1.0 and f"{name}_loss" in metrics
    assert not {"nsp_loss", "sop_loss"} - {f"{name}_loss"} & set(metrics)
