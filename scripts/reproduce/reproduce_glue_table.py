"""Reproduce Table 1 of the BERT paper (GLUE) with this codebase's fine-tuning command.

Runs every task x learning rate x seed through `python -m pretrain.finetune` as a sweep (configs/glue.py's
`table`, pretrain/jobs/sweep_*.py: cells in <output>/task=T_learning_rate=LR_seed=S/, --parallel at once,
finished cells not rerun, a killed sweep resumed by the same command), then, per task,
selects the learning rate with the best mean dev main metric over seeds (the paper selects on dev)
and reports mean ± std over seeds at that learning rate (MNLI gives matched and mismatched). Prints a
markdown table laid out like the paper's Table 1 -- the paper's rows are GLUE *test*-server scores,
ours are *dev* scores -- and writes <output>/table.json with every cell and the selection. The same
cells run with `python -m pretrain.sweep --config=configs/glue.py --sweep=table --workdir=<output> ...`.
Defaults follow the paper (Section 4.1): batch 32, 3 epochs, lr in {5e-5, 4e-5, 3e-5, 2e-5}; the
paper reports the best of several restarts, here we report the mean over seeds. Changing --epochs,
--max_train_examples or --init needs another --output (the sweep refuses to mix settings).

  python -m scripts.reproduce.reproduce_glue_table --init=/path/to/bert-base-uncased      # HF directory
  python -m scripts.reproduce.reproduce_glue_table --init=runs/bert_base --tasks mrpc rte --seeds 0
  python -m scripts.reproduce.reproduce_glue_table --init=DIR --tasks mrpc wnli --learning_rates 5e-5 --seeds 0 \\
      --epochs 1 --max_train_examples 64 --output runs/glue_smoke                # smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from configs.sweep_axes import product, sweep
from pretrain.jobs import sweep_cells, sweep_runner
from pretrain.jobs.sweep_dir import SweepDir
from pretrain.runtime.errors import EXIT_PREEMPTED, UserError
from pretrain.tasks.glue import data as glue
from pretrain.tasks.glue import metrics as glue_metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]


def data_problem(args, task_name: str) -> str:
    """'' when the task's train and dev splits load, else why not (the task is then skipped)."""
    try:
        task = glue.get_task(task_name)
        for split in ("train", *task.dev_splits):
            data_dir = args.glue_dir if args.source == "dir" else args.tfds_data_dir
            if not glue.load_split(task, split, source=args.source, data_dir=data_dir):
                return f"{split} split is empty"
    except Exception as e:  # noqa: BLE001 -- missing files, no tfds, unknown task: report, do not crash
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    return ""


def shared_flags(args) -> list[str]:
    """What every cell's pretrain.finetune gets besides its task, learning rate and seed."""
    return [f"--config.init={args.init}", f"--config.num_epochs={args.epochs}",
            f"--config.batch_size={args.batch_size}",
            f"--config.data.max_seq_length={args.max_seq_length}", f"--config.data.source={args.source}",
            f"--config.data.glue_dir={args.glue_dir}", f"--config.data.tfds_data_dir={args.tfds_data_dir}",
            f"--config.data.max_train_examples={args.max_train_examples}"]


def run_sweep(args, tasks: list[str]) -> tuple[dict[str, dict[float, list[dict]]], list[str]]:
    """configs/glue.py's `table` sweep over these tasks, learning rates and seeds (pretrain/jobs: resumable,
    --parallel at once). -> ({task: {lr: finished runs' results.json}}, failed cell names)."""
    values = product(sweep("arg.task", tasks), sweep("optimizer.learning_rate", args.learning_rates),
                     sweep("seed", args.seeds))
    cells = sweep_cells.build_cells("configs/glue.py", values, "finetune", shared_flags(args), args.output)
    sweep_dir = SweepDir(args.output)
    sweep_dir.claim({"config": "configs/glue.py", "sweep": "table", "entry_point": "finetune",
                     "shared_flags": shared_flags(args), "run_root": args.output, "launch": None,
                     "cells": [c.values for c in cells]})
    statuses = sweep_runner.run_cells(sweep_dir, cells, args.parallel, say=lambda line: print(line, flush=True))
    found: dict[str, dict[float, list[dict]]] = {t: {lr: [] for lr in args.learning_rates} for t in tasks}
    for cell in cells:
        if sweep_dir.outcome(cell):
            with open(os.path.join(args.output, cell.name, "results.json")) as f:
                found[cell.values["arg.task"]][cell.values["optimizer.learning_rate"]].append(json.load(f))
    return found, [name for name, code in statuses.items() if code != 0]


def table_key(task: str, split: str) -> str:
    """Keys of glue_metrics.table_scores: the task name, or mnli_matched / mnli_mismatched."""
    return task if split in ("dev", "validation") else f"{task}_{split.removeprefix('dev_')}"


def select(task: str, cells: dict[float, list[dict]]) -> dict:
    """The learning rate with the best mean dev main metric; mean/std of every metric there."""
    per_lr = {lr: float(np.mean([r["best_score"] for r in runs])) for lr, runs in cells.items() if runs}
    lr = max(per_lr, key=per_lr.get)
    runs = cells[lr]
    metrics = {}
    for split in runs[0]["metrics"]:
        metrics[table_key(task, split)] = {
            m: {"mean": float(np.mean([r["metrics"][split][m] for r in runs])),
                "std": float(np.std([r["metrics"][split][m] for r in runs], ddof=1)) if len(runs) > 1 else 0.0}
            for m in runs[0]["metrics"][split]}
    return {"learning_rate": lr, "main_metric": runs[0]["main_metric"], "mean_main_by_lr": per_lr,
            "seeds": [r["seed"] for r in runs], "best_epochs": [r["best_epoch"] for r in runs], "metrics": metrics}


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The docstring as written, and every flag's default."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--init", required=True, help="Hugging Face BERT directory or a pretrain.train workdir")
    parser.add_argument("--tasks", nargs="+", default=TASKS, help=f"GLUE task names (default: {' '.join(TASKS)})")
    parser.add_argument("--learning_rates", nargs="+", type=float, default=[5e-5, 4e-5, 3e-5, 2e-5],
                        help="the paper's grid; the best mean dev score over seeds is selected per task")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="training seeds")
    parser.add_argument("--epochs", type=int, default=3, help="fine-tuning epochs")
    parser.add_argument("--batch_size", type=int, default=32, help="sequences per optimizer step")
    parser.add_argument("--max_seq_length", type=int, default=128, help="tokens; longer pairs are truncated")
    parser.add_argument("--source", default="dir", choices=["dir", "tfds"], help="GLUE TSVs or TensorFlow Datasets")
    parser.add_argument("--glue_dir", default=os.path.join(REPO, "..", "shared", "data", "glue"),
                        help="official GLUE layout <glue_dir>/{CoLA,SST-2,MRPC,...}/ (for --source=dir)")
    parser.add_argument("--tfds_data_dir", default="", help="TFDS data_dir for --source=tfds ('' = TFDS default)")
    parser.add_argument("--max_train_examples", type=int, default=0, help="fixed train subset (smoke runs); 0 = all")
    parser.add_argument("--output", default="runs/glue_table",
                        help="the sweep's directory: cells in <output>/task=T_learning_rate=LR_seed=S/")
    parser.add_argument("--parallel", type=int, default=1, help="cells run at once")
    args = parser.parse_args()
    args.output, args.glue_dir = os.path.abspath(args.output), os.path.abspath(args.glue_dir)
    args.tfds_data_dir = os.path.abspath(args.tfds_data_dir) if args.tfds_data_dir else ""
    if os.path.exists(args.init):
        args.init = os.path.abspath(args.init)  # the command runs from the repo root

    skipped = {}
    for task in args.tasks:
        if problem := data_problem(args, task):
            skipped[task] = problem
            print(f"{task}: skipped, no data ({problem})")
    tasks = [t for t in args.tasks if t not in skipped]
    try:
        cells, failed = run_sweep(args, tasks) if tasks else ({}, [])
    except UserError as e:
        sys.exit(f"error: {e}")
    except sweep_runner.SweepStopped as e:
        print(e, file=sys.stderr)
        sys.exit(EXIT_PREEMPTED)

    selection = {t: select(t, c) for t, c in cells.items() if any(c.values())}
    print("\nPer task: learning rate chosen by mean dev main metric over seeds; dev metrics x100, mean ± std")
    for task, s in selection.items():
        by_lr = ", ".join(f"{lr:g}: {100 * v:.1f}" for lr, v in s["mean_main_by_lr"].items())
        scores = "; ".join(f"{key} " + " ".join(f"{m} {100 * v['mean']:.1f} ± {100 * v['std']:.1f}"
                                                  for m, v in ms.items()) for key, ms in s["metrics"].items())
        print(f"  {task:5s} lr {s['learning_rate']:g} (seeds {s['seeds']}): {scores}   "
              f"[{s['main_metric']} by lr: {by_lr}]")

    ours = glue_metrics.table_scores({key: {m: v["mean"] for m, v in ms.items()}
                                      for s in selection.values() for key, ms in s["metrics"].items()})
    name = "/".join(os.path.normpath(args.init).split(os.sep)[-2:])
    rows = {f"{row} (paper, test)": scores for row, scores in glue_metrics.PAPER_ROWS.items()}
    rows[f"ours: {name} (dev, mean of {len(args.seeds)} seeds)"] = ours
    table = glue_metrics.markdown_table(rows)
    print("\nBERT paper Table 1 layout (paper rows: GLUE test server; ours: dev sets, so not directly comparable)\n")
    print(table)

    os.makedirs(args.output, exist_ok=True)
    out = os.path.join(args.output, "table.json")
    with open(out, "w") as f:
        json.dump({"settings": vars(args), "cells": {t: {f"{lr:g}": runs for lr, runs in c.items()}
                                                     for t, c in cells.items()},
                   "selection": selection, "table": rows, "markdown": table, "skipped": skipped,
                   "failed": failed}, f, indent=1)
    print(f"\nwrote {out}" + (f"; FAILED cells: {failed}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
