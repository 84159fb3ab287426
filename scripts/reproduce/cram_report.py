r"""The recipe table and the loss-against-minutes plot of budgeted pretraining runs (configs/cram.py's sweeps,
scripts/reproduce/cram.py's directories): docs/cram.md's tables are this script's output.

  python -m scripts.reproduce.cram_report runs/cram_sweep/arch20 runs/cram_sweep/recipe20 --plot docs/cram_loss.png
  python -m scripts.reproduce.cram_report runs/cram runs/cram_old               # cram.py output directories

Per run: the arm (from its config.json), the steps planned and reached, the step time, the held-out MLM loss and
accuracy at the last evaluation (at the config's objective.eval_mask_prob, 15% in configs/cram.py, so that arms with
other masking rates compare), and where it leaves the unigram plateau, with the minute of the budget it came at.
The plateau is where every arm sits for its first steps: it copies the 10% of masked positions that keep their
token and predicts the others from the corpus's token frequencies alone, a held-out loss of (1 - 0.1) x the
entropy of the unigram distribution. A run leaves it at its first evaluation PLATEAU_MARGIN nats below that. Each row ends with the command that replays the run without a clock (`--config.budget_steps=N`).
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from pretrain.tools import plot_metrics
from scripts.reproduce import reproduction as rp

PLATEAU_MARGIN = 0.3  # nats below the plateau: the model predicts from context, not from frequency alone


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def runs(paths: list[str]) -> list[tuple[str, str]]:
    """(workdir, the command that replays it) for every run under `paths`: a sweep directory's cells, a cram.py
    directory's run, or a pretrain.train workdir."""
    from pretrain.jobs import sweep_cells
    found = []
    for path in map(os.path.abspath, paths):
        if os.path.exists(os.path.join(path, "sweep.json")):
            spec = read_json(os.path.join(path, "sweep.json"))
            for values in spec["cells"]:
                workdir = os.path.join(path, sweep_cells.cell_name(values))
                config = sweep_cells.cell_config(spec["config"], values)
                found.append((workdir, f"python -m pretrain.train --config={config} --workdir=DIR"))
        elif os.path.exists(os.path.join(path, "cram.json")):
            record = read_json(os.path.join(path, "cram.json"))
            found.append((record["workdir"], record.get("reproduce", "")))
        else:
            found.append((path, ""))
    return [(w, c) for w, c in found if os.path.exists(os.path.join(w, "metrics.jsonl"))]


def arm(config: dict) -> dict[str, str]:
    """What distinguishes a run: architecture, shape, sequence, masking, schedule, clipping, batch (rows an update:
    '16-64' for a batch-size ramp)."""
    model, optimizer = config["model"], config["optimizer"]
    arch = model["name"] + ("_preln" if model.get("pre_norm") else "")
    warmup = optimizer["warmup_steps"] / config["num_train_steps"]
    schedule = {"warmup_stable_decay": "wsd"}.get(optimizer["schedule"],
                                                  "onecycle" if warmup >= 0.4 else "linear")
    return dict(arch=arch, size=f"{model['num_layers']}x{model['hidden_size']}",
                seq=str(config["data"]["max_seq_length"]), mask=f"{config['objective']['mask_prob']:g}",
                schedule=schedule, clip=f"{optimizer['grad_clip_norm']:g}", batch=batch_of(config),
                minutes=f"{config.get('budget_minutes', 0):g}")


def batch_of(config: dict) -> str:
    """Rows an update: config.batch_size, or 'first-last' under optimizer.ramp_accumulation."""
    rows, ramp = config["batch_size"], config["optimizer"].get("ramp_accumulation", 1)
    return f"{rows}-{rows * ramp}" if ramp > 1 else str(rows)


def minute_of(step: int, plan: dict) -> float:
    """The minute of the budget at which `step` ends on the machine as the plan timed it: the calibration run, the
    run's set-up, then timed_step_sec per step (held-out evaluations are outside the budget). A function of the plan,
    not of this run's clock, so that a run slowed by other work on the machine, and resumed, plots where it would
    have been."""
    return (plan.get("calibration_sec", 0.0) + plan.get("setup_sec", 0.0) + step * plan["timed_step_sec"]) / 60


def plateau_loss(config: dict) -> float:
    """The held-out MLM loss of a model that copies the masked positions that keep their token and predicts the
    others from the training corpus's token frequencies: (replace_with_mask + replace_with_random) x the entropy
    (nats) of those frequencies, special tokens left out."""
    import ml_collections

    from pretrain.data import documents, tokenizers
    tokenizer = tokenizers.from_config(ml_collections.ConfigDict(config["tokenizer"]))
    train_docs, _ = documents.load_documents(ml_collections.ConfigDict(config["data"]), tokenizer)
    ids = np.concatenate([sentence for doc in train_docs for sentence in doc])
    counts = np.bincount(ids, minlength=tokenizer.vocab_size).astype(np.float64)
    counts[list(tokenizer.special_ids)] = 0
    p = counts[counts > 0] / counts.sum()
    hidden = config["objective"]["replace_with_mask"] + config["objective"]["replace_with_random"]
    return hidden * float(-(p * np.log(p)).sum())


def summarize(workdir: str, command: str, plateau: dict[str, float]) -> dict:
    """One run's row: its arm, steps, held-out figures, the plateau exit and the replay command."""
    config = read_json(os.path.join(workdir, "config.json"))
    plan_path = os.path.join(workdir, "budget.json")
    plan = read_json(plan_path) if os.path.exists(plan_path) else {}
    train, held_out = plot_metrics.read_metrics(os.path.join(workdir, "metrics.jsonl"))  # (train, eval records)
    corpus = config["data"]["path"]
    if corpus not in plateau:
        plateau[corpus] = plateau_loss(config)
    exit_step = next((r["step"] for r in held_out if r["eval_mlm_loss"] < plateau[corpus] - PLATEAU_MARGIN), None)
    exit_minute = minute_of(exit_step, plan) if exit_step and plan else None
    steps = plan.get("planned_steps", config["num_train_steps"])
    if command and "--config.budget_steps" not in command and "--steps=" not in command:
        command += f" --config.budget_steps={steps}"
    return dict(workdir=workdir, **arm(config), planned=steps, reached=max((r["step"] for r in train), default=0),
                step_sec=plan.get("timed_step_sec", float("nan")), loss=held_out[-1]["eval_mlm_loss"],
                accuracy=held_out[-1]["eval_mlm_accuracy"], exit_step=exit_step, exit_minute=exit_minute,
                curve=[(minute_of(r["step"], plan) if plan else np.nan, r["eval_mlm_loss"]) for r in held_out],
                command=command)


def table(rows: list[dict], plateau: dict[str, float]) -> str:
    header = ["arch", "size", "seq", "mask", "schedule", "clip", "batch", "minutes", "steps reached / planned",
              "s / step", "held-out MLM loss", "accuracy", "leaves the plateau at step (minute)", "command"]
    body = [[r["arch"], r["size"], r["seq"], r["mask"], r["schedule"], r["clip"], r["batch"], r["minutes"],
             f"{r['reached']:,} / {r['planned']:,}", f"{r['step_sec']:.3f}", f"{r['loss']:.3f}",
             f"{r['accuracy']:.3f}",
             (f"{r['exit_step']:,} ({r['exit_minute']:.1f})" if r["exit_minute"] else f"{r['exit_step']:,}")
             if r["exit_step"] else "not within the run",
             f"`{r['command']}`"] for r in rows]
    levels = ", ".join(f"{v:.3f}" for v in plateau.values())
    return (rp.markdown(header, body) + f"\n\nThe unigram plateau: {levels}; a run leaves it at its first held-out loss "
            f"{PLATEAU_MARGIN} below it.")


def plot(rows: list[dict], path: str) -> None:
    with rp.figure(path, "minutes of the budget (2 CPU cores)", "held-out MLM loss at 15% masking", 7) as ax:
        for r in rows:
            minutes, losses = zip(*r["curve"])
            label = (f"{r['arch']} {r['size']} seq {r['seq']} mask {r['mask']} {r['schedule']} clip {r['clip']} "
                     f"batch {r['batch']}")
            ax.plot(minutes, losses, marker=".", label=f"{label} ({r['minutes']} min)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="sweep directories, cram.py directories or pretrain.train workdirs")
    parser.add_argument("--plot", default="", help="PNG of held-out loss against minutes")
    args = parser.parse_args(argv)
    plateau: dict[str, float] = {}
    rows = [summarize(workdir, command, plateau) for workdir, command in runs(args.paths)]
    if not rows:
        raise SystemExit(f"error: no finished or running run under {', '.join(args.paths)} (no metrics.jsonl)")
    print(table(rows, plateau))
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
