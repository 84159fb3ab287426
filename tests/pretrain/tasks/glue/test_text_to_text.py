"""GLUE as T5 text-to-text: inputs, targets, STS-B rounding, and decoded text back to labels."""
import math
import os

import numpy as np
import pytest

from pretrain.tasks.glue import data as glue
from pretrain.tasks.glue import metrics as glue_metrics
from pretrain.tasks.glue import text_to_text as t2t
from tests.helpers.paths import SHARED_DATA

A, B = "The cat sat.", "A cat was sitting."

# Raffel et al. 2020 Appendix D / the t5 library's glue preprocessor, written out by hand.
EXPECTED_INPUTS = {
    "cola": f"cola sentence: {A}",
    "sst2": f"sst2 sentence: {A}",
    "mrpc": f"mrpc sentence1: {A} sentence2: {B}",
    "stsb": f"stsb sentence1: {A} sentence2: {B}",
    "qqp": f"qqp question1: {A} question2: {B}",
    "mnli": f"mnli hypothesis: {B} premise: {A}",  # text_a is MNLI's premise
    "qnli": f"qnli question: {A} sentence: {B}",
    "rte": f"rte sentence1: {A} sentence2: {B}",
    "wnli": f"wnli sentence1: {A} sentence2: {B}",
}
# Label words by class id (TFDS's order, which T5 used).
EXPECTED_WORDS = {
    "cola": ["unacceptable", "acceptable"], "sst2": ["negative", "positive"],
    "mrpc": ["not_equivalent", "equivalent"], "qqp": ["not_duplicate", "duplicate"],
    "mnli": ["entailment", "neutral", "contradiction"], "qnli": ["entailment", "not_entailment"],
    "rte": ["entailment", "not_entailment"], "wnli": ["not_entailment", "entailment"],
}


@pytest.mark.parametrize("name", list(EXPECTED_INPUTS))
def test_input_and_target_text(name):
    task = glue.get_task(name)
    label = 3.8 if task.is_regression else 1
    example = glue.Example(A, B if task.is_pair else None, label, idx=0)
    assert t2t.input_text(task, example) == t2t.input_text(name, example) == EXPECTED_INPUTS[name]
    assert t2t.text_pairs(task, [example]) == [(EXPECTED_INPUTS[name],
                                                "3.8" if task.is_regression else EXPECTED_WORDS[name][1])]


def test_field_order_is_t5s_sorted_tfds_features():
    """t5 writes the fields sorted by TFDS feature name; glue.py knows TFDS's names."""
    for name, (key_a, key_b) in glue._TFDS_FEATURES.items():
        named = {"text_a": key_a, "text_b": key_b}
        assert [field for field, _ in t2t._FIELDS[name]] == sorted(k for k in (key_a, key_b) if k), name
        assert all(named[attribute] == field for field, attribute in t2t._FIELDS[name]), name


@pytest.mark.parametrize("name", list(EXPECTED_WORDS))
def test_every_label_round_trips(name):
    task = glue.get_task(name)
    words = [t2t.label_text(task, i) for i in range(task.num_labels)]
    assert words == EXPECTED_WORDS[name]
    assert [t2t.parse_label(task, w) for w in words] == list(range(task.num_labels))
    assert t2t.label_text(task, -1) == "<unk>"  # unlabeled test rows, as t5 writes them
    with pytest.raises(ValueError, match=name):
        t2t.label_text(task, task.num_labels)


def test_stsb_rounds_to_fifths_half_to_even():
    """t5: tf.as_string(tf.round(x * 5) / 5, precision=1) in float32; tf.round is half to even."""
    cases = {0.0: "0.0", 5.0: "5.0", 1.8: "1.8", 3.8: "3.8", 0.25: "0.2", 0.35: "0.4", 4.99: "5.0",
             2.5: "2.4", 0.5: "0.4", 0.3: "0.4", 3.3: "3.2", 0.1: "0.0", 1.1: "1.2", 2.667: "2.6", 4.6: "4.6"}
    assert {x: t2t.label_text("stsb", x) for x in cases} == cases
    fifths = [f"{k / 5:.1f}" for k in range(26)]
    assert [t2t.label_text("stsb", k / 5) for k in range(26)] == fifths
    assert [t2t.parse_label("stsb", s) for s in fifths] == pytest.approx([k / 5 for k in range(26)])
    scores = np.random.default_rng(0).uniform(0, 5, 2000)
    back = np.array([t2t.parse_label("stsb", t2t.label_text("stsb", x)) for x in scores])
    assert np.abs(back - scores).max() <= 0.1 + 1e-6  # the nearest multiple of 0.2
    assert set(np.round(back * 5, 6)) <= set(range(26))


def test_unknown_strings_score_as_wrong():
    for name, words in EXPECTED_WORDS.items():
        for text in ["", "maybe", words[0].upper(), words[0] + ".", "<unk>", "1", "entailment neutral"]:
            assert t2t.parse_label(name, text) == t2t.INVALID_CLASS == -1, (name, text)
        assert t2t.parse_label(name, f"  {words[-1]}\n") == len(words) - 1  # whitespace is not a mistake
    for text in ["", "abc", "3.4.1", "nan", "inf", "-inf", "<unk>"]:
        score = t2t.parse_label("stsb", text)
        assert score == t2t.INVALID_SCORE == -1.0 and math.isfinite(score), text
    assert t2t.parse_label("stsb", " 3.4 ") == pytest.approx(3.4)


def test_invalid_predictions_are_scored_wrong_by_the_metrics():
    labels = np.array([1, 0, 0, 1, 1, 0])
    parsed = np.array([1, -1, 0, -1, 1, 1])  # two answers that name no class
    ready = t2t.predictions_for_metrics("mrpc", parsed, labels)
    assert ready.tolist() == [1, 1, 0, 0, 1, 1]  # t5's f1_score_with_invalid: the opposite of the label
    scores = glue_metrics.compute_metrics("mrpc", ready, labels)
    assert scores["accuracy"] == pytest.approx(3 / 6)
    assert scores["f1"] == pytest.approx(2 * 2 / (2 * 2 + 2 + 1))  # tp 2, fp 2, fn 1
    for name in ("sst2", "mnli", "cola"):  # -1 kept: never equal to a label
        assert t2t.predictions_for_metrics(name, parsed, labels).tolist() == parsed.tolist()
    assert glue_metrics.compute_metrics("sst2", parsed, labels)["accuracy"] == pytest.approx(3 / 6)
    stsb = [t2t.parse_label("stsb", s) for s in ["4.2", "junk", "0.6", "2.0"]]
    result = glue_metrics.compute_metrics("stsb", t2t.predictions_for_metrics("stsb", stsb, []),
                                          np.array([4.0, 3.0, 1.0, 2.2]))
    assert all(math.isfinite(v) for v in result.values())


@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_DATA, "glue", "MRPC")), reason="no GLUE copy here")
def test_real_mrpc_rows():
    task = glue.get_task("mrpc")
    examples = glue.read_glue_dir(task, "dev", os.path.join(SHARED_DATA, "glue"))[:50]
    for (source, target), e in zip(t2t.text_pairs(task, examples), examples):
        assert source == f"mrpc sentence1: {e.text_a} sentence2: {e.text_b}"
        assert t2t.parse_label(task, target) == e.label
