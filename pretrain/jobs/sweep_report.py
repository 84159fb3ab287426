"""A sweep's results: each cell's metric from its workdir, as a CSV, a markdown table and a plot.

Fine-tuning cells are read from results.json (`best_score` is the task's main dev metric at the best
epoch), pretraining cells from metrics.jsonl (each key's last logged value, e.g. `eval_loss`). With seeds
among the swept keys the markdown adds the mean ± std over seeds of every other combination, which is how
a learning rate is picked (Devlin et al. select on the dev mean), and the plot draws that mean with the
seeds' spread around it.
"""
from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

import numpy as np
from etils import epath  # local paths and gs:// alike (Orbax's dependency)

from pretrain.jobs.sweep_cells import Cell, format_value
from pretrain.jobs.sweep_dir import SweepDir
from pretrain.runtime.errors import UserError
from pretrain.workdir.run_files import flatten

DEFAULT_METRICS = {"finetune": "best_score", "train": "eval_loss"}
SEED_KEYS = ("seed",)


def _numbers(tree: Any) -> dict[str, float]:
    """The numeric leaves of a JSON record, keyed 'a.b' (workdir.flatten)."""
    return {k: float(v) for k, v in flatten(tree).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def run_metrics(run_dir: str, entry: str) -> dict[str, float]:
    """Numbers a finished run left: results.json's (finetune) or the last of each in metrics.jsonl (train)."""
    root = epath.Path(run_dir)
    if entry == "finetune":
        path = root / "results.json"
        return _numbers(json.loads(path.read_text())) if path.exists() else {}
    path, last = root / "metrics.jsonl", {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                last.update({k: v for k, v in _numbers(json.loads(line)).items() if k != "step"})
    return last


def metric_key(available: list[dict[str, float]], name: str) -> str:
    """`name` itself, or the one key that ends with '.name' (f1 -> metrics.dev.f1)."""
    keys = sorted({k for metrics in available for k in metrics})
    if name in keys:
        return name
    matches = [k for k in keys if k.endswith("." + name)]
    if len(matches) == 1:
        return matches[0]
    raise UserError(f"--metric={name}: " + (f"ambiguous, give one of {matches}" if matches else
                                             f"no finished cell has it; they have {keys[:20]}"))


def swept_keys(cells: list[Cell]) -> list[str]:
    """Every key some cell sets, in order of appearance."""
    return list(dict.fromkeys(k for cell in cells for k in cell.values))


def collect(sweep: SweepDir, cells: list[Cell], run_root: str, entry: str, metric: str) -> tuple[list[dict], str]:
    """-> (one row per cell: its swept values ('' where a chained cell has no such key), the metric, wall s,
    status), the metric's full key."""
    found = {c.name: run_metrics(f"{run_root.rstrip('/')}/{c.name}", entry) for c in cells if sweep.outcome(c)}
    key = metric_key(list(found.values()), metric) if found else metric
    rows = []
    for cell in cells:
        outcome, metrics = sweep.outcome(cell), found.get(cell.name, {})
        rows.append({"cell": cell.name, **{k: cell.values.get(k, "") for k in swept_keys(cells)},
                     key: metrics.get(key, math.nan), "wall_sec": outcome["wall_sec"] if outcome else math.nan,
                     "status": "done" if outcome else "not done"})
    return rows, key


def write_csv(path: str, rows: list[dict]) -> None:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    epath.Path(path).write_text(out.getvalue())


def _cell_text(value: Any) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def markdown(rows: list[dict], swept: list[str], key: str) -> str:
    """Every cell, then (seeds swept) the mean ± std over seeds per combination of the other keys."""
    columns = [*swept, key, "wall_sec", "status"]
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    lines += ["| " + " | ".join(_cell_text(row[c]) for c in columns) + " |" for row in rows]
    others = [k for k in swept if k not in SEED_KEYS]
    if len(others) < len(swept):
        lines += ["", f"mean ± std of {key} over seeds:", "",
                  "| " + " | ".join([*others, key, "seeds"]) + " |", "|---" * (len(others) + 2) + "|"]
        for group, values in grouped(rows, others, key).items():
            mean, std = _mean_std(values)
            lines.append("| " + " | ".join([*(format_value(g) for g in group), f"{mean:.4g} ± {std:.2g}",
                                             str(len(values))]) + " |")
    return "\n".join(lines) + "\n"


def grouped(rows: list[dict], keys: list[str], metric: str) -> dict[tuple, list[float]]:
    """{values of `keys`: the finished cells' metric values}, in the sweep's order."""
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        if not math.isnan(row[metric]):
            groups.setdefault(tuple(row[k] for k in keys), []).append(row[metric])
    return groups


def _mean_std(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def plot(path: str, rows: list[dict], swept: list[str], key: str, title: str) -> None:
    """The metric over the first numeric swept key (log scale across a factor of 3 or more), one line per
    combination of the other non-seed keys: the mean over seeds, the seeds as dots."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    others = [k for k in swept if k not in SEED_KEYS]
    numeric = [k for k in others if all(isinstance(r[k], (int, float)) and not isinstance(r[k], bool) for r in rows)]
    x_key = numeric[0] if numeric else None
    lines = [k for k in others if k != x_key]
    fig, ax = plt.subplots(figsize=(6, 4))
    for group, _ in grouped(rows, lines, key).items():
        members = [r for r in rows if tuple(r[k] for k in lines) == group and not math.isnan(r[key])]
        xs = sorted({r[x_key] for r in members}) if x_key else list(range(len(members)))
        means = [np.mean([r[key] for r in members if r[x_key] == x]) for x in xs] if x_key else \
            [r[key] for r in members]
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={format_value(v)}" for k, v in zip(lines, group)) or key
        (line,) = ax.plot(xs, means, marker="o", label=label)
        if x_key:
            ax.scatter([r[x_key] for r in members], [r[key] for r in members], s=12, alpha=0.5, color=line.get_color())
    if x_key:
        values = sorted({r[x_key] for r in rows})
        if min(values) > 0 and max(values) / min(values) >= 3:
            ax.set_xscale("log")
        if len(values) <= 12:  # the swept values themselves as ticks, written as the cells name them
            ax.set_xticks(values, [format_value(v) for v in values])
            ax.minorticks_off()
        ax.set_xlabel(x_key)
    else:
        ax.set_xlabel("cell")
    ax.set_ylabel(key)
    ax.set_title(title, fontsize=9)
    if lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    with epath.Path(path).open("wb") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)


def write_report(sweep: SweepDir, rows: list[dict], swept: list[str], key: str, title: str) -> dict[str, str]:
    """results.csv, results.md and <metric>.png in the sweep directory. -> {kind: path}."""
    root = sweep.root.rstrip("/")
    paths = {"csv": f"{root}/results.csv", "markdown": f"{root}/results.md",
             "plot": f"{root}/{key.replace('.', '_')}.png"}
    write_csv(paths["csv"], rows)
    epath.Path(paths["markdown"]).write_text(markdown(rows, swept, key))
    if any(not math.isnan(r[key]) for r in rows):
        plot(paths["plot"], rows, swept, key, title)
    else:
        del paths["plot"]
    return paths
