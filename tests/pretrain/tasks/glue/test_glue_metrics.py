"""GLUE metrics against plain numpy formulas, and the BERT paper's table arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain.tasks.glue.data import get_task
from pretrain.tasks.glue.metrics import (PAPER_COLUMNS, PAPER_ROWS, compute_metrics, main_score, markdown_table,
                                         table_scores)


def _confusion(labels, predictions):
    tp = np.sum((predictions == 1) & (labels == 1))
    tn = np.sum((predictions == 0) & (labels == 0))
    fp = np.sum((predictions == 1) & (labels == 0))
    fn = np.sum((predictions == 0) & (labels == 1))
    return float(tp), float(tn), float(fp), float(fn)


def _pearson(x, y):
    x, y = x - x.mean(), y - y.mean()
    return float(x @ y / np.sqrt((x @ x) * (y @ y)))


def _average_ranks(x):
    """1-based ranks; tied values share the mean of their positions."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        ranks[x == value] = ranks[x == value].mean()
    return ranks


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.mark.parametrize("seed", range(3))
def test_binary_metrics_match_confusion_matrix(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=301)
    predictions = np.where(rng.random(301) < 0.7, labels, rng.integers(0, 2, size=301))  # correlated, imperfect
    tp, tn, fp, fn = _confusion(labels, predictions)
    mcc = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    f1 = 2 * tp / (2 * tp + fp + fn)
    accuracy = (tp + tn) / len(labels)

    cola = compute_metrics("cola", predictions, labels)
    assert set(cola) == {"matthews_corr"} and abs(cola["matthews_corr"] - mcc) < 1e-9
    mrpc = compute_metrics(get_task("mrpc"), predictions, labels)
    assert set(mrpc) == {"f1", "accuracy"}
    assert abs(mrpc["f1"] - f1) < 1e-9 and abs(mrpc["accuracy"] - accuracy) < 1e-9
    assert main_score("mrpc", mrpc) == mrpc["f1"] and main_score("cola", cola) == cola["matthews_corr"]
    # F1 is for class 1: swapping the classes changes it
    swapped = compute_metrics("qqp", 1 - predictions, 1 - labels)
    assert abs(swapped["f1"] - 2 * tn / (2 * tn + fp + fn)) < 1e-9
    assert all(isinstance(v, float) for v in {**cola, **mrpc}.values())


def test_multiclass_accuracy_from_ids_and_logits(rng):
    labels = rng.integers(0, 3, size=200)
    logits = rng.normal(size=(200, 3))
    logits[np.arange(200), labels] += 0.8
    expected = float(np.mean(logits.argmax(-1) == labels))
    assert abs(compute_metrics("mnli", logits, labels)["accuracy"] - expected) < 1e-9
    assert abs(compute_metrics("mnli", logits.argmax(-1), labels)["accuracy"] - expected) < 1e-9
    assert 0.4 < expected < 1.0  # the vectors are not degenerate


def test_stsb_correlations(rng):
    labels = rng.uniform(0, 5, size=250)
    predictions = labels + rng.normal(scale=1.5, size=250)
    stsb = compute_metrics("sts-b", predictions, labels)
    assert set(stsb) == {"pearson", "spearman"}
    assert abs(stsb["pearson"] - _pearson(predictions, labels)) < 1e-9
    assert abs(stsb["spearman"] - _pearson(_average_ranks(predictions), _average_ranks(labels))) < 1e-9
    assert stsb["spearman"] != stsb["pearson"] and main_score("stsb", stsb) == stsb["spearman"]
    # ties (STS-B scores come in steps of 0.2): average ranks
    tied = np.round(labels * 5) / 5
    assert abs(compute_metrics("stsb", predictions, tied)["spearman"]
               - _pearson(_average_ranks(predictions), _average_ranks(tied))) < 1e-9


def test_degenerate_inputs(rng):
    labels = rng.uniform(0, 5, size=20)
    assert compute_metrics("stsb", np.full(20, 2.5), labels) == {"pearson": 0.0, "spearman": 0.0}
    assert compute_metrics("mrpc", np.zeros(20, int), np.ones(20, int)) == {"f1": 0.0, "accuracy": 0.0}
    with pytest.raises(ValueError, match="-1"):
        compute_metrics("rte", np.zeros(3, int), np.array([0, -1, 1]))
    with pytest.raises(ValueError, match="shape"):
        compute_metrics("rte", np.zeros(3, int), np.zeros(4, int))


def _paper_results(row: dict[str, float]) -> dict[str, dict[str, float]]:
    """A paper row as compute_metrics outputs (fractions), with decoy values for the non-table metrics."""
    f = {c: v / 100 for c, v in row.items()}
    return {
        "mnli_matched": {"accuracy": f["MNLI-m"]}, "mnli_mismatched": {"accuracy": f["MNLI-mm"]},
        "qqp": {"f1": f["QQP"], "accuracy": 0.11}, "qnli": {"accuracy": f["QNLI"]}, "sst2": {"accuracy": f["SST-2"]},
        "cola": {"matthews_corr": f["CoLA"]}, "stsb": {"pearson": 0.22, "spearman": f["STS-B"]},
        "mrpc": {"f1": f["MRPC"], "accuracy": 0.33}, "rte": {"accuracy": f["RTE"]}, "wnli": {"accuracy": 0.65},
    }


@pytest.mark.parametrize("system", list(PAPER_ROWS))
def test_table_scores_reproduce_paper_average(system):
    row = PAPER_ROWS[system]
    scores = table_scores(_paper_results(row))
    assert list(scores) == list(PAPER_COLUMNS)
    for column in PAPER_COLUMNS[:-1]:
        assert abs(scores[column] - row[column]) < 1e-9, column
    # The paper averaged unrounded scores: rounded columns (+-0.05) and a rounded average (+-0.05) can
    # differ by up to 0.1 (BiLSTM+ELMo+Attn: 70.94 vs 71.0). BERT's own rows agree to 0.05.
    tolerance = 0.05 if system.startswith("BERT") else 0.1
    assert abs(scores["Average"] - row["Average"]) < tolerance, (scores["Average"], row["Average"])


def test_paper_rows_and_partial_table():
    assert PAPER_COLUMNS == ("MNLI-m", "MNLI-mm", "QQP", "QNLI", "SST-2", "CoLA", "STS-B", "MRPC", "RTE", "Average")
    assert [PAPER_ROWS["BERT-Base"][c] for c in PAPER_COLUMNS] == [84.6, 83.4, 71.2, 90.5, 93.5, 52.1, 85.8, 88.9,
                                                                    66.4, 79.6]
    assert PAPER_ROWS["BERT-Large"]["CoLA"] == 60.5 and PAPER_ROWS["OpenAI GPT"]["Average"] == 75.1
    partial = table_scores({"SST-2": {"accuracy": 0.9}, "cola": {"matthews_corr": 0.5}, "wnli": {"accuracy": 0.5}})
    assert partial == {"SST-2": 90.0, "CoLA": 50.0}  # no Average without all nine columns
    with pytest.raises(ValueError):
        table_scores({"mnli": {"accuracy": 0.8}})  # which MNLI?


def test_markdown_table():
    rows = {"BERT-Base": PAPER_ROWS["BERT-Base"], "ours": {"SST-2": 91.26, "CoLA": 48.04}}
    lines = markdown_table(rows).splitlines()
    assert lines[0] == ("| System | MNLI-m | MNLI-mm | QQP | QNLI | SST-2 | CoLA | STS-B | MRPC | RTE | Average |")
    assert set(lines[1].replace("|", "").replace("-", "")) == set() and lines[1].count("|") == 12
    assert lines[2] == "| BERT-Base | 84.6 | 83.4 | 71.2 | 90.5 | 93.5 | 52.1 | 85.8 | 88.9 | 66.4 | 79.6 |"
    assert lines[3] == "| ours | - | - | - | - | 91.3 | 48.0 | - | - | - | - |"
    assert len(lines) == 4
