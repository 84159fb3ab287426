"""GLUE metrics and the BERT paper's results table.

`compute_metrics` returns raw values (fractions, correlations); the table works in the paper's
units (x100). The paper reports F1 for QQP and MRPC, Spearman for STS-B and Matthews correlation for
CoLA, and averages nine columns (MNLI counted twice, WNLI left out); `GlueTask.main_metric` names the
same metric, so model selection optimises what the table shows.
"""

from __future__ import annotations

import numpy as np
import scipy.stats
from sklearn import metrics as skm

from pretrain.tasks.glue.data import GlueTask, get_task

PAPER_COLUMNS = ("MNLI-m", "MNLI-mm", "QQP", "QNLI", "SST-2", "CoLA", "STS-B", "MRPC", "RTE", "Average")

# results key -> (column, task); MNLI's two dev/test sets are separate results and columns.
_COLUMN_OF = {"mnli_matched": "MNLI-m", "mnli_mismatched": "MNLI-mm", "qqp": "QQP", "qnli": "QNLI",
              "sst2": "SST-2", "cola": "CoLA", "stsb": "STS-B", "mrpc": "MRPC", "rte": "RTE"}

# BERT paper (Devlin et al., 2019) Table 1: GLUE test set, scored by the evaluation server.
PAPER_ROWS: dict[str, dict[str, float]] = {
    system: dict(zip(PAPER_COLUMNS, scores)) for system, scores in {
        "Pre-OpenAI SOTA": (80.6, 80.1, 66.1, 82.3, 93.2, 35.0, 81.0, 86.0, 61.7, 74.0),
        "BiLSTM+ELMo+Attn": (76.4, 76.1, 64.8, 79.8, 90.4, 36.0, 73.3, 84.9, 56.8, 71.0),
        "OpenAI GPT": (82.1, 81.4, 70.3, 87.4, 91.3, 45.4, 80.0, 82.3, 56.0, 75.1),
        "BERT-Base": (84.6, 83.4, 71.2, 90.5, 93.5, 52.1, 85.8, 88.9, 66.4, 79.6),
        "BERT-Large": (86.7, 85.9, 72.1, 92.7, 94.9, 60.5, 86.5, 89.3, 70.1, 82.1),
    }.items()
}


def _correlation(fn, x: np.ndarray, y: np.ndarray) -> float:
    """A constant vector has no correlation; report 0 rather than NaN so that model selection can
    still compare it (an untrained regression head often predicts one value)."""
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(fn(x, y)[0])


def compute_metrics(task: GlueTask | str, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The task's official metrics (sklearn / scipy), as fractions and correlations, not x100.

    predictions: [n] class ids, or [n, num_labels] logits (argmax is taken); STS-B: [n] scores.
    labels: [n] class ids or scores; unlabeled (-1) test rows cannot be scored.
    """
    task = get_task(task) if isinstance(task, str) else task
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if task.is_regression:
        predictions, labels = predictions.reshape(-1).astype(np.float64), labels.astype(np.float64)
    else:
        if predictions.ndim == 2:
            predictions = predictions.argmax(-1)
        predictions, labels = predictions.astype(np.int64), labels.astype(np.int64)
    if labels.min(initial=0) < 0:  # STS-B scores are in [0, 5]
        raise ValueError(f"{task.name}: labels contain -1 (unlabeled test rows have no score)")
    if predictions.shape != labels.shape or not len(labels):
        raise ValueError(f"{task.name}: predictions {predictions.shape} and labels {labels.shape} must be"
                         " the same non-empty [n] shape")
    out = {}
    for name in task.metrics:
        if name == "matthews_corr":
            out[name] = float(skm.matthews_corrcoef(labels, predictions))
        elif name == "f1":
            out[name] = float(skm.f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0))
        elif name == "accuracy":
            out[name] = float(skm.accuracy_score(labels, predictions))
        elif name == "pearson":
            out[name] = _correlation(scipy.stats.pearsonr, predictions, labels)
        elif name == "spearman":
            out[name] = _correlation(scipy.stats.spearmanr, predictions, labels)
        else:
            raise ValueError(f"unknown GLUE metric {name!r}")
    return out


def main_score(task: GlueTask | str, metrics: dict[str, float]) -> float:
    """The task's single number: its column in the BERT paper's table (a fraction here)."""
    task = get_task(task) if isinstance(task, str) else task
    return float(metrics[task.main_metric])


def table_scores(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """{'mnli_matched': metrics, 'mnli_mismatched': ..., 'qqp': ..., ...} -> {column: score x 100}.

    'Average' is the plain mean of the nine columns, as in the paper, and only when all nine exist.
    WNLI has no column (the paper leaves it out); any other key must name a GLUE task.
    """
    scores = {}
    for key, metrics in results.items():
        if key in ("mnli_matched", "mnli_mismatched"):
            task = get_task("mnli")
        else:
            task = get_task(key)
            if task.name == "mnli":
                raise ValueError("give MNLI results as 'mnli_matched' and 'mnli_mismatched'")
            if task.name == "wnli":
                continue
        scores[_COLUMN_OF[key if task.name == "mnli" else task.name]] = 100.0 * main_score(task, metrics)
    columns = PAPER_COLUMNS[:-1]
    if all(c in scores for c in columns):
        scores["Average"] = float(np.mean([scores[c] for c in columns]))
    return {c: scores[c] for c in PAPER_COLUMNS if c in scores}


def markdown_table(rows: dict[str, dict[str, float]]) -> str:
    """One row per system (PAPER_ROWS, or table_scores outputs), columns PAPER_COLUMNS, 1 decimal."""
    lines = ["| System | " + " | ".join(PAPER_COLUMNS) + " |", "|---" * (len(PAPER_COLUMNS) + 1) + "|"]
    for system, scores in rows.items():
        cells = [f"{scores[c]:.1f}" if c in scores else "-" for c in PAPER_COLUMNS]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
