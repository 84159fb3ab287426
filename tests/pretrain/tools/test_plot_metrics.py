"""pretrain/tools/plot_metrics.py: each panel draws each logged metric once and is titled by what it draws."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt

from pretrain.tools import plot_metrics


def labels(ax) -> list[str]:
    return [line.get_label() for line in ax.lines]


def test_a_run_without_nsp_draws_its_loss_once_and_titles_the_accuracy_mlm():
    train = [{"step": s, "loss": 5.0 - s, "mlm_loss": 5.0 - s, "mlm_accuracy": 0.1 * s} for s in (1, 2, 3)]
    evaluation = [{"step": 3, "eval_loss": 2.5, "eval_mlm_loss": 2.5, "eval_mlm_accuracy": 0.3}]
    fig = plot_metrics.figure(train, evaluation)
    loss, accuracy = fig.axes
    assert labels(loss) == ["train loss", "eval loss"]
    assert accuracy.get_title() == "MLM accuracy" and labels(accuracy) == ["train mlm_accuracy", "eval mlm_accuracy"]
    plt.close(fig)


def test_a_bert_run_with_nsp_draws_every_loss_and_both_accuracies():
    train = [{"step": s, "loss": 6.0 - s, "mlm_loss": 5.0 - s, "nsp_loss": 1.0 - 0.1 * s, "mlm_accuracy": 0.1 * s,
              "nsp_accuracy": 0.5 + 0.1 * s} for s in (1, 2)]
    fig = plot_metrics.figure(train, [])
    loss, accuracy = fig.axes
    assert labels(loss) == ["train loss", "train mlm_loss", "train nsp_loss"]
    assert accuracy.get_title() == "MLM / NSP accuracy"
    plt.close(fig)


def test_a_run_without_accuracies_says_so_and_the_command_writes_the_png(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0 / s}) + "\n" for s in (1, 2)))
    fig = plot_metrics.figure(*plot_metrics.read_metrics(str(tmp_path / "metrics.jsonl")))
    assert fig.axes[1].get_title() == "no accuracy logged" and not fig.axes[1].lines
    plt.close(fig)
    assert plot_metrics.plot(str(tmp_path)) == str(tmp_path / "loss.png") and (tmp_path / "loss.png").stat().st_size
