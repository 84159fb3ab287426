"""Plot the loss curves of a run from its metrics.jsonl into a PNG.

  python -m pretrain.tools.plot_metrics --workdir runs/bert_tiny [--output runs/bert_tiny/loss.png]
"""
from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")  # no display on TPU VMs / CI
import matplotlib.pyplot as plt  # noqa: E402

CURVES = ("loss", "mlm_loss", "nsp_loss", "sop_loss")  # sop: ALBERT's objective.sentence_order
ACCURACIES = ("mlm_accuracy", "nsp_accuracy", "sop_accuracy")


def read_metrics(path: str) -> tuple[list[dict], list[dict]]:
    """-> (train records, eval records) from metrics.jsonl."""
    train, evaluation = [], []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            (evaluation if any(k.startswith("eval_") for k in record) else train).append(record)
    return train, evaluation


def drawn(names: tuple[str, ...], train: list[dict], evaluation: list[dict]) -> list[str]:
    """The metrics among `names` that the run logged, less one whose training curve repeats an earlier one's (a run
    without NSP logs its MLM loss as its loss too)."""
    kept, curves = [], []
    for name in names:
        curve = [(r["step"], r[name]) for r in train if name in r]
        if (curve or any(f"eval_{name}" in r for r in evaluation)) and (not curve or curve not in curves):
            kept.append(name)
            curves.append(curve)
    return kept


def _curves(ax, names: list[str], train: list[dict], evaluation: list[dict]) -> None:
    """Train curves as lines, evaluation points as dashed markers, for each metric name."""
    for i, name in enumerate(names):
        color = f"C{i}"  # one colour per metric; evaluation dashed with markers
        for records, key, style, label in ((train, name, "-", "train"), (evaluation, f"eval_{name}", "o--", "eval")):
            points = [(r["step"], r[key]) for r in records if key in r]
            if points:
                ax.plot(*zip(*points), style, color=color, label=f"{label} {name}")


def figure(train: list[dict], evaluation: list[dict]):
    """The loss panel and the accuracy panel, each titled by what it draws."""
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    accuracies = drawn(ACCURACIES, train, evaluation)
    _curves(ax_loss, drawn(CURVES, train, evaluation), train, evaluation)
    _curves(ax_acc, accuracies, train, evaluation)
    heads = " / ".join(name.removesuffix("_accuracy").upper() for name in accuracies)
    ax_loss.set(xlabel="step", ylabel="loss", title="Pretraining loss")
    ax_acc.set(xlabel="step", ylabel="accuracy", title=f"{heads} accuracy" if heads else "no accuracy logged",
               ylim=(0, 1))
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    return fig


def plot(workdir: str, output: str | None = None) -> str:
    train, evaluation = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    if not train:
        raise SystemExit(f"error: {workdir}/metrics.jsonl has no training records to plot")
    output = output or os.path.join(workdir, "loss.png")
    fig = figure(train, evaluation)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    print(f"loss plot: {plot(args.workdir, args.output)}")
