r"""How many labels pretraining saves, by ULMFiT's protocol (Howard & Ruder 2018): SST-2 dev accuracy against the number
of labels from random weights, general pretraining and domain adaptation, with 95% intervals over fine-tuning seeds
and pretraining runs. The successor of scripts/bench/bench_cram.py's curve.

  python -m scripts.bench.bench_transfer --general runs/transfer/general_0 runs/transfer/general_1 \
      --adapted runs/transfer/adapted_0 runs/transfer/adapted_1 --full_random --output runs/bench_transfer --parallel 2
  python -m scripts.bench.bench_transfer --general ... --report   # the table and plot of the finished runs, runs none

The checkpoints (make bench-transfer): independent general pretraining runs, 2 or more, each its own seed, and each
one's adaptation to SST-2's training text (its sentences, never a label, dev or test):
  python -m pretrain.train --config=configs/cram.py:recipe=best,steps=N --workdir=runs/transfer/general_K \
      --config.seed=K --config.data.path=CORPUS --config.tokenizer.path=SPM
  python -m pretrain.adapt --init=runs/transfer/general_K --task=sst2 --workdir=runs/transfer/adapted_K
  python -m pretrain.adapt --init=runs/transfer/general_K --task=sst2 --labelled_only=N \
      --workdir=runs/transfer/supervised/N/K                  # --supervised: one per label count N and run K

Arms, each fine-tuned by pretrain.finetune (scripts/reproduce/glue_study.py):
  random              random weights of the general runs' architecture and tokenizer (--config.init_weights=random)
  pretrained          --general: seed k fine-tunes from run k % n, so each cell's interval covers pretraining too
  adapted             --adapted (one per general run, the same order): adapted on all of SST-2's unlabelled training
                      text, ULMFiT's "semi-supervised" stage 2
  adapted_supervised  --supervised: adapted on the text of the labelled examples only, --supervised_dir/N/k for N
                      labels and general run k (a label count lacking one of them is skipped, with a line)
  minilm              all-MiniLM-L6-v2, the ceiling of full pretraining (22M parameters, no budget), BERT's head at its
                      one standard rate (--no_ceiling: without)
and recipes (--recipes): plain (configs/glue.py's defaults for the family, ours with mean pooling: MLM never trains
[CLS]) and ulmfit (plus discriminative rates, factor 2.6, and the slanted triangular schedule).

Protocol. A cell (arm, recipe, N labels) trains on --config.data.max_train_examples=N less the validation_size(N) (a
tenth, at least 10) held out to pick its best epoch on: N counts every label a run sees, and dev is only the test.
Epochs give 300 steps or more (glue_study.task_spec). Each (arm, recipe) takes ONE learning rate from
--learning_rates, the best mean accuracy on the carved validation split at --select_labels labels over the first
--select_seeds seeds, and runs every cell at it. --extra_seeds K spends K more runs where the intervals are widest:
in rounds of --parallel runs, each round adds seeds to the one cell whose 95% interval is widest then (a cell of one
seed first); the seeds added are kept in OUTPUT/extra_seeds.json, so that a resumed run spends only the rest.

Each (arm, recipe) is a sweep directory of its own, OUTPUT/<arm>_<recipe>/ (resumable; an arm or recipe added later
runs beside the others); --ledger keys each run by its checkpoints' roles and what they were (family, steps,
held-out loss), as bench_cram.py's does. Outputs: the table (mean ± the 95% interval's half-width; arm - random of
the same recipe with Welch's interval [low, high]; the labels at which a row reaches random's mean at 8,000,
interpolated in log labels), the aim (the best of our arms at 1,000 labels against the best random row at 8,000 and
at 1,000), OUTPUT/sample_efficiency.png and OUTPUT/bench_transfer.json (every number).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Callable

import numpy as np

from scripts.bench import bench_cram, intervals, transfer_report
from scripts.reproduce import glue_study

FULL = 67349  # SST-2's training examples
POOLING = ("--config.model.classifier_pooling=mean",)
RECIPES = {"plain": (),
           "ulmfit": ("--config.discriminative_factor=2.6", "--config.optimizer.schedule=slanted_triangular")}
VALIDATION = "validation"  # results.json's metrics of the carved split (pretrain/loops/scoring.py's VALIDATION)


@dataclasses.dataclass
class Arm:
    name: str
    init: Callable[[int, int], list[str]]  # (labels, seed) -> the flags that choose its weights
    model: str                             # configs/glue.py's model=
    settings: list[str]                    # the paths `init` draws on (its sweep's settings)
    labels: list[int]
    recipe: tuple[str, ...] = POOLING      # the flags of every recipe of the arm
    rates: list[float] | None = None       # its one rate (None: --learning_rates, chosen on validation)
    available: Callable[[int], bool] = lambda labels: True  # whether its checkpoints for a label count exist


def round_robin(workdirs: list[str], seed: int) -> str:
    """The pretraining run seed k fine-tunes from: the k % n-th of n, so that a cell's seeds spread over the runs."""
    return workdirs[seed % len(workdirs)]


def supervised_workdir(directory: str, labels: int, seed: int, runs: int) -> str:
    """--supervised_dir's general run seed % runs, adapted on the text of `labels` labelled examples."""
    return os.path.join(directory, str(labels), str(seed % runs))


def workdirs(paths: list[str], flag: str) -> list[str]:
    """The absolute paths of pretrain.train workdirs (a one-line error for one without its config or metrics)."""
    for path in paths:
        missing = [name for name in ("config.json", "metrics.jsonl") if not os.path.exists(os.path.join(path, name))]
        if missing:
            raise SystemExit(f"error: {flag} {path} is not a pretrain.train workdir (no {missing[0]}); the "
                             "Makefile's bench-transfer comment says how to make the checkpoints")
    return [os.path.abspath(path) for path in paths]


def build_arms(args) -> list[Arm]:
    general, adapted = workdirs(args.general, "--general"), workdirs(args.adapted, "--adapted")
    if adapted and len(adapted) != len(general):
        raise SystemExit(f"error: {len(adapted)} --adapted workdirs for {len(general)} --general runs: give one "
                         "adaptation of each run, in the same order")
    model, labels = glue_study.model_of(general[0]), sorted(set(args.labels))
    full = sorted(set(getattr(args, "random_labels", [])) - set(labels))
    full += [FULL] if args.full_random and FULL not in labels + full else []
    arms = [Arm("random", lambda n, k: [f"--config.init={general[0]}", "--config.init_weights=random"], model,
                general[:1], labels + full),
            Arm("pretrained", lambda n, k: [f"--config.init={round_robin(general, k)}"], model, general, labels)]
    if adapted:
        arms.append(Arm("adapted", lambda n, k: [f"--config.init={round_robin(adapted, k)}"], model, adapted, labels))
    if args.supervised:
        directory, runs = os.path.abspath(args.supervised_dir), len(general)

        def found(n: int) -> bool:
            return all(os.path.isdir(supervised_workdir(directory, n, k, runs)) for k in range(runs))
        for n in (n for n in labels if not found(n)):
            print(f"adapted_supervised: {n:,} labels skipped, no {os.path.join(directory, str(n))}/<k> for every run "
                  f"k < {runs} (python -m pretrain.adapt --init=GENERAL_K --task=sst2 --labelled_only={n} "
                  f"--workdir={os.path.join(directory, str(n))}/K)")
        arms.append(Arm("adapted_supervised", lambda n, k: [
            f"--config.init={supervised_workdir(directory, n, k, runs)}"], model, [directory],
            [n for n in labels if found(n)], available=found))
    if not args.no_ceiling:
        path = bench_cram.ceiling_path()
        arms.append(Arm("minilm", lambda n, k: [f"--config.init={path}"], "bert", [path], labels, recipe=(),
                        rates=[bench_cram.CEILING_RATE]))
    return arms


def ledger_places(args, arms: list[Arm]) -> dict[str, str]:
    """How --ledger names the checkpoints' paths: by role and what the run was (family, steps, held-out loss), so that
    a run recorded on one machine counts on another, and never for another checkpoint at the same path."""
    from scripts.reproduce import cram
    roles = [(f"general {k}", w) for k, w in enumerate(args.general)]
    roles += [(f"adapted {k}", w) for k, w in enumerate(args.adapted)]
    for arm in (arm for arm in arms if arm.name == "adapted_supervised"):
        roles += [(f"adapted on {n} labels {k}", supervised_workdir(arm.settings[0], n, k, len(args.general)))
                  for n in arm.labels for k in range(len(args.general))]
    places = bench_cram.ceiling_place() if not args.no_ceiling else {}
    for role, workdir in roles:
        steps, _, held_out = cram.last_metrics(workdir)
        loss = next((v for k, v in sorted(held_out.items()) if k.endswith("loss")), float("nan"))
        places[f"<{role}: {glue_study.model_of(workdir)}, {steps} steps, held-out loss {loss:.3f}>"] = \
            os.path.abspath(workdir)
    return places


class Row:
    """One arm fine-tuned one way: a GlueStudy of its own in OUTPUT/<arm>_<recipe>/, at one learning rate."""

    def __init__(self, arm: Arm, recipe: str, args, places: dict[str, str]):
        self.arm, self.name, self.key = arm, f"{arm.name}/{recipe}", f"{arm.name}_{recipe}"
        self.rates = arm.rates or list(args.learning_rates)
        study_args = argparse.Namespace(**{**vars(args), "output": os.path.join(args.output, self.key),
                                           "tasks": [glue_study.sst2_row(n) for n in arm.labels]})
        self.study = glue_study.GlueStudy(
            study_args, {self.key: [*arm.recipe, *RECIPES[recipe]]}, settings=arm.settings,
            models={self.key: arm.model}, rates={self.key: self.rates}, places=places, carve_validation=True,
            per_cell={self.key: lambda task, seed: arm.init(glue_study.task_spec(task)[1], seed)})
        self.rate: float | None = None
        self.selection: dict[float, list[float]] = {}  # rate -> validation accuracy x100 per selection seed

    def cell(self, labels: int, rate: float, seed: int):
        return self.study.cell(self.key, glue_study.sst2_row(labels), rate, seed)

    def finished(self, cell) -> bool:
        harness = self.study.harness
        return harness.sweep.outcome(cell) is not None or harness.in_ledger(cell, say=False)

    def scores(self, cells, split: str = "dev") -> list[float]:
        """The finished cells' accuracy x100 on `split` (dev, or the carved "validation")."""
        return [self.study.score(cell, split) for cell in cells if self.finished(cell)]

    def results(self, labels: int, seeds: list[int]) -> dict[int, float]:
        """seed -> dev accuracy x100 of the finished seeds of a label count, at the chosen rate ({} before it)."""
        if self.rate is None:
            return {}
        cells = {seed: self.cell(labels, self.rate, seed) for seed in seeds}
        return {seed: self.study.score(cell) for seed, cell in cells.items() if self.finished(cell)}

    def run(self, cells) -> None:
        self.study.harness.run(cells)


def select_rate(validation: dict[float, list[float]], seeds: int) -> float | None:
    """The rate of the best mean validation accuracy; None until every rate has `seeds` finished runs."""
    if any(len(scores) < seeds for scores in validation.values()):
        return None
    return max(validation, key=lambda rate: np.mean(validation[rate]))


def choose_rate(row: Row, args, run: bool) -> float | None:
    """Row's learning rate, chosen on the carved validation split at --select_labels (dev never seen), running the
    selection cells first where `run`; None where they are not all finished (or the arm lacks that label count)."""
    if len(row.rates) == 1:
        return row.rates[0]
    if not row.arm.available(args.select_labels):
        print(f"{row.name}: no checkpoint for --select_labels={args.select_labels}: not run")
        return None
    seeds = args.seeds[:args.select_seeds]
    cells = {rate: [row.cell(args.select_labels, rate, seed) for seed in seeds] for rate in row.rates}
    if run:
        row.run([cell for rate_cells in cells.values() for cell in rate_cells])
    row.selection = {rate: row.scores(rate_cells, VALIDATION) for rate, rate_cells in cells.items()}
    rate = select_rate(row.selection, len(seeds))
    shown = ", ".join(f"{r:g}: {np.mean(s):.1f}" if s else f"{r:g}: —" for r, s in row.selection.items())
    print(f"{row.name}: learning rate {'not chosen yet' if rate is None else f'{rate:g}'} (validation accuracy at "
          f"{args.select_labels:,} labels over seeds {seeds}: {shown})", flush=True)
    return rate


def seeds_of(args, extra: dict[str, list[int]], row: str, labels: int) -> list[int]:
    """A cell's seeds: --seeds and those --extra_seeds added to it."""
    return list(args.seeds) + extra.get(f"{row}@{labels}", [])


def curves_of(rows: list[Row], args, extra) -> dict[str, dict[int, dict[int, float]]]:
    """row -> labels -> seed -> dev accuracy x100 of the finished runs."""
    return {row.name: {n: row.results(n, seeds_of(args, extra, row.name, n)) for n in row.arm.labels} for row in rows}


def widest(curves: dict[str, dict[int, list[float]]]) -> tuple[str, int] | None:
    """The (row, labels) whose 95% interval is widest (one seed: widest of all; none without a finished seed)."""
    widths = {(name, n): intervals.mean_interval(v)[1] for name, curve in curves.items() for n, v in curve.items() if v}
    return max(widths, key=lambda key: np.inf if np.isnan(widths[key]) else widths[key]) if widths else None


def spend_extra_seeds(rows: list[Row], args, extra: dict[str, list[int]], path: str) -> None:
    """--extra_seeds: rounds of --parallel more seeds for the cell whose interval is widest, until K are spent (a
    round is written to `path` before it runs, so that a stopped run resumes it and spends only the rest)."""
    chosen = {row.name: row for row in rows if row.rate is not None}

    def run(key: str, seeds: list[int]) -> None:
        name, _, labels = key.rpartition("@")
        if name in chosen:
            chosen[name].run([chosen[name].cell(int(labels), chosen[name].rate, seed) for seed in seeds])

    for key, seeds in extra.items():
        run(key, seeds)
    while (left := args.extra_seeds - sum(map(len, extra.values()))) > 0:
        cell = widest(transfer_report.lists(curves_of(list(chosen.values()), args, extra)))
        if cell is None:
            return
        key, first = f"{cell[0]}@{cell[1]}", max(seeds_of(args, extra, *cell)) + 1
        added = list(range(first, first + min(left, args.parallel)))
        extra[key] = extra.get(key, []) + added
        with open(path, "w") as f:
            json.dump(extra, f, indent=1)
        print(f"--extra_seeds: {cell[0]} at {cell[1]:,} labels (the widest interval), seeds {added}", flush=True)
        run(key, added)


def parse_args(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--general", nargs="+", required=True,
                        help="pretrain.train workdirs of independent general pretraining runs (2 or more); seed k "
                             "fine-tunes from the (k %% n)-th")
    parser.add_argument("--adapted", nargs="*", default=[],
                        help="python -m pretrain.adapt outputs on SST-2's training text, one per --general run, "
                             "in the same order")
    parser.add_argument("--supervised", action="store_true", help="the adapted_supervised arm, from --supervised_dir")
    parser.add_argument("--supervised_dir", default="runs/transfer/supervised",
                        help="DIR/<labels>/<k>: general run k adapted on the text of <labels> labelled examples")
    parser.add_argument("--no_ceiling", action="store_true", help="without all-MiniLM-L6-v2")
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--labels", nargs="+", type=int, default=[100, 300, 1000, 3000, 8000],
                        help="label counts, each with its carved validation split")
    parser.add_argument("--full_random", action="store_true", help=f"random weights at all {FULL:,} labels too")
    parser.add_argument("--random_labels", nargs="*", type=int, default=[],
                        help="label counts for random weights only (the control's 8,000 where the others run fewer)")
    parser.add_argument("--learning_rates", nargs="+", type=float, default=[3e-4, 1e-3, 3e-3],
                        help="each (arm, recipe) takes the best on the carved validation split at --select_labels")
    parser.add_argument("--select_labels", type=int, default=1000)
    parser.add_argument("--select_seeds", type=int, default=2, help="the first this many --seeds choose the rate")
    parser.add_argument("--extra_seeds", type=int, default=0,
                        help="K more runs, --parallel at a time, each round to the cell whose interval is widest")
    parser.add_argument("--report", action="store_true", help="the table and plot of the finished runs; runs none")
    glue_study.add_flags(parser, "runs/bench_transfer", seeds=(0, 1, 2, 3, 4), selection=False)
    args = parser.parse_args(argv)
    if min(args.labels + [args.select_labels]) < 20:
        parser.error("--labels and --select_labels: 20 or more (a tenth, at least 10, is held out for validation)")
    if not 1 <= args.select_seeds <= len(args.seeds):
        parser.error(f"--select_seeds={args.select_seeds}: between 1 and the {len(args.seeds)} --seeds")
    if len(args.seeds) < 5 or len(args.general) < 2:
        print(f"note: {len(args.seeds)} seeds and {len(args.general)} general runs: a learning claim wants 5 or more "
              "seeds and 2 or more pretraining runs")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.output = os.path.abspath(args.output)
    arms = build_arms(args)
    places = ledger_places(args, arms) if args.ledger else {}
    rows = [Row(arm, recipe, args, places) for arm in arms for recipe in args.recipes]
    for row in rows:
        row.rate = choose_rate(row, args, run=not args.report)
        if row.rate is not None and not args.report:
            row.run([row.cell(n, row.rate, seed) for n in row.arm.labels for seed in args.seeds])
    path = os.path.join(args.output, "extra_seeds.json")
    extra = {}
    if os.path.exists(path):
        with open(path) as f:
            extra = json.load(f)
    if not args.report:
        spend_extra_seeds(rows, args, extra, path)
    transfer_report.report(curves_of(rows, args, extra), {row.name: row.rate for row in rows},
                           {row.name: row.selection for row in rows}, len(args.seeds),
                           os.path.join(args.output, "sample_efficiency.png"),
                           os.path.join(args.output, "bench_transfer.json"))
    for row in (row for row in rows if row.study.harness.cells):
        print(f"{row.name}: {row.study.footer()}")


if __name__ == "__main__":
    main()
