"""objectives/bert_pretraining.py's masking option: ALBERT's n-grams (masking="ngrams") through the objective's
batches, with sentence-order pairs, as configs/albert.py trains; BERT's single tokens stay the default; ModernBERT's
packed rows (configs/modernbert.py packing=True) at 30% masking."""
from __future__ import annotations

import types

import ml_collections
import numpy as np
import pytest

import objectives
from configs import albert, bert, modernbert
from objectives import mlm, nsp
from objectives.bert_pretraining import MLM_KEYS, BertPretraining
from objectives.interface import ObjectiveError
from objectives.span_masking import mask_spans, ngram_length_pmf

PAD, CLS, SEP, MASK = 0, 1, 2, 3
V = 1000


def tokenizer():
    """Even ids start a word, odd ids continue one (ids 0-3 are the specials)."""
    return types.SimpleNamespace(vocab_size=V, pad_id=PAD, cls_id=CLS, sep_id=SEP, mask_id=MASK,
                                 special_ids=(PAD, CLS, SEP, MASK), word_start=np.arange(V) % 2 == 0)


def documents(rng: np.random.Generator, n_docs: int = 60, n_sentences: int = 6) -> list[list[np.ndarray]]:
    """Sentences of 4-16 words of 1-3 tokens each (60%, 30%, 10%)."""
    def word():
        pieces = rng.choice([1, 2, 3], p=[0.6, 0.3, 0.1])
        return [2 * int(rng.integers(5, V // 2))] + [2 * int(rng.integers(5, V // 2)) + 1 for _ in range(pieces - 1)]
    return [[np.array([t for _ in range(rng.integers(4, 17)) for t in word()], np.int32) for _ in range(n_sentences)]
            for _ in range(n_docs)]


def albert_objective(**overrides) -> BertPretraining:
    """configs/albert.py's objective (n-grams of whole words, SOP), built by name as the trainer does."""
    config = albert.get_config("size=tiny").objective
    with config.unlocked():
        config.update(overrides)
    objective = objectives.build_objective(config, tokenizer())
    assert type(objective) is BertPretraining and objective.masking == "ngrams" and objective.sentence_order
    return objective


def albert_batch(seed: int = 0, max_seq_length: int = 64, n_docs: int = 60, **overrides):
    """(instances, batch) of SOP pairs from `documents`, masked by the ALBERT objective."""
    objective = albert_objective(**overrides)
    rng = np.random.default_rng(seed)
    instances = objective.create_instances(documents(rng, n_docs), rng, max_seq_length)
    return instances, objective.make_batch(instances, rng)


def selected(batch, shape) -> np.ndarray:
    """[B, L] True at the masked positions."""
    sel = np.zeros(shape, bool)
    r, c = np.nonzero(batch["masked_lm_weights"])
    sel[r, batch["masked_lm_positions"][r, c]] = True
    return sel


def runs(mask_row: np.ndarray) -> list[tuple[int, int]]:
    """[(first, last)] of each run of True: one n-gram each, since one unmasked word stays between two."""
    edges = np.diff(np.concatenate([[0], mask_row.astype(np.int8), [0]]))
    return list(zip(np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0] - 1))


def test_ngram_masking_is_mask_spans_with_one_over_n_lengths_of_whole_words():
    """The objective's batch is exactly span_masking.mask_spans with ngram_length_pmf(3) and a draw per token (whose length statistics
    tests/objectives/test_span_masking.py checks) over the tokenizer's whole words, without the SBO's keys."""
    objective = albert_objective()
    rng = np.random.default_rng(0)
    instances = objective.create_instances(documents(rng), rng, 64)
    batch = objective.make_batch(instances, np.random.default_rng(1))
    reference = mask_spans(instances["input_ids"], np.random.default_rng(1), vocab_size=V, mask_id=MASK,
                           special_ids=(PAD, CLS, SEP, MASK), max_predictions=20,
                           word_starts=tokenizer().word_start[instances["input_ids"]],
                           input_mask=instances["input_mask"], span_lengths=ngram_length_pmf(3), draw_per_token=True)
    for key in MLM_KEYS:
        np.testing.assert_array_equal(batch[key], reference[key], err_msg=key)
    assert not {"span_left_boundary", "span_right_boundary", "span_position"} & set(batch)


@pytest.mark.parametrize("max_predictions", [20, 5])
def test_ngram_masking_keeps_the_budget_at_mask_prob_and_max_predictions(max_predictions):
    """Per row: min(max_predictions, round(15% of the non-special tokens)), less by under one word (whole words
    only); never a special or a padding position."""
    instances, batch = albert_batch(seed=2, max_predictions_per_seq=max_predictions)
    ids = instances["input_ids"]
    candidate = ~np.isin(ids, (PAD, CLS, SEP, MASK))
    budget = np.minimum(max_predictions, np.maximum(1, np.rint(candidate.sum(1) * 0.15)))
    sel = selected(batch, ids.shape)
    count = sel.sum(1)
    assert batch["masked_lm_positions"].shape == (len(ids), max_predictions)
    assert not (sel & ~candidate).any() and (count <= budget).all()
    assert (budget - count < 3).all()  # a word has at most 3 tokens
    assert (budget - count == 0).mean() > 0.5
    if max_predictions == 20:
        assert 0.13 < count.sum() / candidate.sum() <= 0.15 + 0.5 / candidate.sum(1).mean()


def test_ngram_masking_draws_80_10_10_per_token_as_albert_code():
    """ALBERT's create_pretraining_data.py draws [MASK] (80%), a random id (10%) or the original (10%) for each token
    of an n-gram: per token the shares are 80/10/10, and about a third of the n-grams of two or more tokens mix
    kinds (a draw per n-gram, SpanBERT's, would mix none)."""
    instances, batch = albert_batch(seed=3, max_seq_length=128, n_docs=1500)
    ids, out = instances["input_ids"], batch["input_ids"]
    sel = selected(batch, ids.shape)
    new, old = out[sel], ids[sel]
    assert len(new) > 3000
    assert abs((new == MASK).mean() - 0.8) < 0.02
    assert abs((new == old).mean() - 0.1) < 0.02 and abs(((new != MASK) & (new != old)).mean() - 0.1) < 0.02
    mixed = []
    for b in range(len(ids)):
        for first, last in runs(sel[b]):
            if last > first:  # the single tokens cannot show a mixed draw
                kinds = np.where(out[b, first:last + 1] == MASK, 0, np.where(out[b, first:last + 1] == ids[b, first:last + 1], 1, 2))
                mixed.append(len(set(kinds)) > 1)
    assert 0.25 < np.mean(mixed) < 0.6
    np.testing.assert_array_equal(out[~sel], ids[~sel])  # nothing else changes


def test_ngram_masking_composes_with_sentence_order():
    """ALBERT = n-gram masking + SOP: the batch has the pairs' segments and sentence-order labels (both classes),
    n-grams stay inside one segment, and the model's inputs are BERT's."""
    instances, batch = albert_batch(seed=4)
    assert set(batch) == set(MLM_KEYS) | {"segment_ids", "input_mask", "next_sentence_labels"}
    assert set(np.unique(batch["next_sentence_labels"])) == {0, 1}
    sel = selected(batch, instances["input_ids"].shape)
    for b in range(len(sel)):
        for first, last in runs(sel[b]):
            assert len(set(batch["segment_ids"][b, first:last + 1])) == 1
    assert set(BertPretraining.model_inputs(batch)) == {"input_ids", "segment_ids", "input_mask",
                                                        "masked_lm_positions"}


def test_tokens_is_bert_masking_and_the_default():
    """configs/bert.py masks single tokens (mlm.mask_tokens, exactly); an objective config without the key (ELECTRA's,
    a test's) does too."""
    config = bert.get_config("size=tiny").objective
    assert config.masking == "tokens"
    objective = BertPretraining(config, tokenizer())
    rng = np.random.default_rng(5)
    instances = objective.create_instances(documents(rng), rng, 64)
    batch = objective.make_batch(instances, np.random.default_rng(6))
    reference = mlm.mask_tokens(instances["input_ids"], np.random.default_rng(6), vocab_size=V, mask_id=MASK,
                                special_ids=(PAD, CLS, SEP, MASK), max_predictions=20)
    for key in MLM_KEYS:
        np.testing.assert_array_equal(batch[key], reference[key], err_msg=key)
    bare = ml_collections.ConfigDict(dict(next_sentence=True, max_predictions_per_seq=2))
    assert BertPretraining(bare, tokenizer()).masking == "tokens"


@pytest.mark.parametrize("overrides, message", [
    (dict(masking="spans"), "config.objective.masking='spans' is unknown; use one of tokens, ngrams"),
    (dict(ngram_max=0), "config.objective.ngram_max=0 must be an integer >= 1 for masking='ngrams'"),
])
def test_bad_masking_is_a_one_line_error(overrides, message):
    config = albert.get_config("size=tiny").objective
    with config.unlocked():
        config.update(overrides)
    with pytest.raises(ObjectiveError) as info:
        BertPretraining(config, tokenizer())
    assert message in str(info.value) and "\n" not in str(info.value)


def test_sop_instances_of_the_test_corpus_are_pairs():
    """The corpus above makes SOP pairs at 64 tokens (a guard for the tests that read its batches)."""
    rng = np.random.default_rng(7)
    out = nsp.create_instances(documents(rng), rng, max_seq_length=64, cls_id=CLS, sep_id=SEP, pad_id=PAD,
                               sentence_order=True)
    assert len(out["input_ids"]) > 100 and (out["segment_ids"].max(1) == 1).all()


def test_packing_fills_rows_with_whole_instances_numbered_and_positioned_inside_each():
    """configs/modernbert.py:packing=True: every instance of the unpacked epoch appears whole, in order, in one row,
    its tokens numbered by segment (input_mask 1..n, 0 = padding) and positioned from 0; fewer rows, same tokens;
    30% of each row's non-special tokens masked."""
    config = modernbert.get_config("size=tiny,packing=True").objective
    objective = objectives.build_objective(config, tokenizer())
    unpacked_objective = objectives.build_objective(modernbert.get_config("size=tiny").objective, tokenizer())
    docs = documents(np.random.default_rng(0), n_docs=40, n_sentences=2)
    packed = objective.create_instances(docs, np.random.default_rng(1), 64)
    unpacked = unpacked_objective.create_instances(docs, np.random.default_rng(1), 64)
    assert len(packed["input_ids"]) < len(unpacked["input_ids"])
    examples = []
    for ids, segments, positions in zip(packed["input_ids"], packed["input_mask"], packed["positions"]):
        for segment in range(1, segments.max() + 1):
            where = segments == segment
            np.testing.assert_array_equal(positions[where], np.arange(where.sum()))
            examples.append(ids[where])
        assert np.all(ids[segments == 0] == PAD)
    expected = [row[:n] for row, n in zip(unpacked["input_ids"], unpacked["input_mask"].sum(1))]
    assert len(examples) == len(expected) and all(np.array_equal(a, b) for a, b in zip(examples, expected))
    batch = objective.make_batch(packed, np.random.default_rng(2))
    assert set(objective.model_inputs(batch)) == {"input_ids", "segment_ids", "input_mask", "masked_lm_positions",
                                                  "positions"}
    real = (packed["input_mask"] > 0) & ~np.isin(packed["input_ids"], (CLS, SEP))
    rate = batch["masked_lm_weights"].sum() / real.sum()
    assert 0.27 < rate < 0.33, rate


def test_packing_with_sentence_pairs_is_one_line_error():
    config = bert.get_config("size=tiny").objective
    with config.unlocked():
        config.packing = True
    with pytest.raises(ObjectiveError, match="packing=True packs single segments: it needs"):
        objectives.build_objective(config, tokenizer())
