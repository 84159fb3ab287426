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


def _curves(ax, names: tuple[str, ...], train: list[dict], evaluation: list[dict]) -> None:
    """Train curves as lines, evaluation points as dashed markers, for each metric name."""
    for i, name in enumerate(names):
        color = f"C{i}"  # one colour per metric; evaluation dashed with markers
        for records, key, style, label in ((train, name, "-", "train"), (evaluation, f"eval_{name}", "o--", "eval")):
            points = [(r["step"], r[key]) for r in records if key in r]
            if points:
                ax.plot(*zip(*points), style, color=color, label=f"{label} {name}")


def plot(workdir: str, output: str | None = None) -> str:
    train, evaluation = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    if not train:
        raise SystemExit(f"error: {workdir}/metrics.jsonl has no training records to plot")
    output = output or os.path.join(workdir, "loss.png")
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    _curves(ax_loss, CURVES, train, evaluation)
    _curves(ax_acc, ACCURACIES, train, evaluation)
    ax_loss.set(xlabel="step", ylabel="loss", title="Pretraining loss")
    ax_acc.set(xlabel="step", ylabel="accuracy", title="MLM / NSP accuracy", ylim=(0, 1))
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    print(f"loss plot: {plot(args.workdir, args.output)}")
