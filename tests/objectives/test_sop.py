"""Sentence-order prediction (ALBERT): objectives/nsp.py with sentence_order=True, and the objective's switch.

Token ids trace back to the corpus as in test_nsp.py: id = 10 + doc * 10**6 + sentence * 10**3 + position.
"""
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from objectives.bert_pretraining import BertPretraining
from objectives.interface import ObjectiveError
from objectives.nsp import create_instances
from tests.objectives.test_nsp import IDS, Tracer, check_layout, make_corpus, split


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
    with pytest.raises(ValueError, match="no sentence-order pair"):
        sop([[np.array([11])], [np.array([12])]])


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
