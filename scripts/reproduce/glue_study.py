"""GLUE dev scores of several inits of one architecture under one fine-tuning recipe: the pretrained-vs-random
and equal-budget tables (scripts/bench/bench_cram.py, scripts/reproduce/demo_finetune.py), and the cells of
scripts/bench/bench_transfer.py (which chooses its rates on a validation split carved from the labels instead).

Every init is fine-tuned by pretrain.finetune on every task, learning rate and seed with the same flags, so the
rows differ only in the weights they start from. With several learning rates each (init, task) takes the one with
the best mean dev score over seeds, as the BERT paper selects on dev (Section 4.1): a pretrained model and random
weights need not train best at the same rate. `--rate_selection=first_seed` chooses it on the first seed alone and
runs the other seeds at that rate only (5 runs in place of 9 for 3 rates and 3 seeds). The runs are cells of a
reproduction.py sweep: resumable, `--parallel`, and a directory that holds another recipe is refused.

The tasks (a row name -> the GLUE task and how many training examples):
  sst2-1k  SST-2 with 1,000 training examples (a fixed random subset, the same for every seed and init), for 10
           epochs rather than --epochs: 3 epochs of 1,000 examples are 96 steps, too few for any init to leave
           the majority class (few-sample fine-tuning needs more steps: Mosbach et al. 2021, Zhang et al. 2021)
  sst2-100, sst2-300, sst2-3k  the same with 100, 300 and 3,000 examples, each for about 300 steps or more
           (100, 33 and 4 epochs): the sample-efficiency curve of scripts/bench/bench_cram.py. The best epoch is
           chosen on dev every 5 epochs at 100 examples and every 3 at 300 (about 20 and 11 dev passes of 872
           sentences, which every epoch would make most of the run's time)
  sst2-8k  SST-2 with 8,000
  sst2-N   (any other N; sst2-Nk: N thousand) by the same rule (task_spec): epochs for 300 steps of 32 or more
           (--epochs where 3 epochs make them), dev scored about 20 times
  mrpc, cola, wnli: the whole training sets. WNLI is reported and, as in the BERT paper, not counted in the
           average (its dev set is adversarial to the training set: the majority class is the best score).
"""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable

import numpy as np

from pretrain.tasks.glue import data as glue
from scripts.reproduce import reproduction as rp

TASKS = {  # row name: (GLUE task, training examples (0: all), epochs (0: --epochs), dev scored every this many epochs)
    "sst2-100": ("sst2", 100, 100, 5), "sst2-300": ("sst2", 300, 33, 3), "sst2-1k": ("sst2", 1000, 10, 1),
    "sst2-3k": ("sst2", 3000, 4, 1), "sst2-8k": ("sst2", 8000, 0, 1), "mrpc": ("mrpc", 0, 0, 1),
    "cola": ("cola", 0, 0, 1), "wnli": ("wnli", 0, 0, 1)}
NOT_COUNTED = ("wnli",)
MIN_STEPS, STEPS_BATCH = 300, 32  # the few-label rows' floor of optimizer steps, at the batch their epochs assume


def task_spec(row: str) -> tuple[str, int, int, int]:
    """TASKS[row], or for an SST-2 row not there ('sst2-N', 'sst2-Nk': N thousand) the rule of the rows that are:
    epochs for MIN_STEPS steps or more (0, --epochs, where 3 already make them), dev scored about 20 times."""
    if row in TASKS:
        return TASKS[row]
    match = re.fullmatch(r"sst2-(\d+)(k?)", row)
    if not match:
        raise ValueError(f"no GLUE study row {row!r}: one of {', '.join(TASKS)}, or sst2-N (N training examples)")
    examples = int(match[1]) * (1000 if match[2] else 1)
    epochs = math.ceil(MIN_STEPS / math.ceil(examples / STEPS_BATCH))
    epochs = epochs if epochs > 3 else 0
    return "sst2", examples, epochs, max(1, round(epochs / 20))


def sst2_row(labels: int) -> str:
    """The row of SST-2 with `labels` training examples: 'sst2-1k' for 1,000, 'sst2-300' for 300."""
    return f"sst2-{labels // 1000}k" if labels >= 1000 and labels % 1000 == 0 else f"sst2-{labels}"


def validation_size(examples: int) -> int:
    """The validation split carved from `examples` labels (GlueStudy's carve_validation): a tenth, at least 10."""
    return max(10, examples // 10)


def add_flags(parser, output: str, seeds: tuple[int, ...] = (0, 1, 2), selection: bool = True) -> None:
    """The study's flags; selection=False leaves out --tasks, --learning_rates and --rate_selection, for a caller that
    chooses its rows and rates its own way (scripts/bench/bench_transfer.py)."""
    parser.add_argument("--output", default=output, help="the study's directory (resumable)")
    parser.add_argument("--glue_dir", default=rp.GLUE_DIR, help="GLUE in the official layout")
    parser.add_argument("--parallel", type=int, default=1, help="fine-tuning runs at once")
    parser.add_argument("--ledger", default="",
                        help="JSON lines of finished runs kept apart from --output (scripts/bench/bench_ledger.py): "
                             "a run it holds is not run again, on any machine")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(seeds))
    if selection:
        parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
        parser.add_argument("--learning_rates", nargs="+", type=float, default=[1e-4, 3e-4],
                            help="each (init, task) takes the best on dev (small BERTs: 1e-4 and up, Turc et al. 2019)")
        parser.add_argument("--rate_selection", choices=["mean", "first_seed"], default="mean",
                            help="each (init, task)'s rate: the best mean over seeds, or the best on the first seed "
                                 "(the other seeds then run at that rate only)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.set_defaults(minutes=0.0)  # the harness's pretraining budget: a study only fine-tunes


def model_of(workdir: str) -> str:
    """configs/glue.py's model= for a pretrain.train workdir (the family in its config.json: bert, modernbert, ...)."""
    with open(os.path.join(workdir, "config.json")) as f:
        return json.load(f)["model"]["name"]


class GlueStudy:
    """inits: row name -> the pretrain.finetune flags that choose its weights (--config.init=..., ...).
    models: row name -> configs/glue.py's model= (model_of: bert, the default, or modernbert, ...).
    rates: row name -> its own learning rates where they are not --learning_rates (a reference model at its one
    standard rate).
    places: a name -> a path among the inits' flags, as --ledger keys the runs (reproduction.Reproduction).
    per_cell: row name -> (task, seed) -> more of its flags that depend on the cell (seed k fine-tuning from the
    k % n-th of n pretraining runs); `settings` should then name what they draw on.
    carve_validation: every run holds validation_size(N) of its N training examples out to select its best epoch on
    (results.json's metrics.validation), leaving dev a test; every task needs a number of examples (sst2-N)."""

    def __init__(self, args, inits: dict[str, list[str]], settings: list[str], models: dict[str, str] | None = None,
                 rates: dict[str, list[float]] | None = None, places: dict[str, str] | None = None,
                 per_cell: dict[str, Callable[[str, int], list[str]]] | None = None, carve_validation: bool = False):
        self.inits, self.tasks, self.seeds = inits, args.tasks, args.seeds
        self.per_cell, self.carve_validation = per_cell or {}, carve_validation
        self.models = models or {}
        self.rates_of = {init: (rates or {}).get(init, args.learning_rates) for init in inits}
        self.rates = args.learning_rates
        self.rate_selection = getattr(args, "rate_selection", "mean")
        self.epochs = args.epochs
        self.recipe = [f"--config.batch_size={args.batch_size}", "--config.write_test_predictions=false",
                       f"--config.data.glue_dir={os.path.abspath(args.glue_dir)}"]
        inits_flags = [f"{name}={' '.join(flags)}" for name, flags in inits.items()]
        self.harness = rp.Reproduction(args, settings + self.recipe + [f"epochs={self.epochs}"] + inits_flags,
                                       places={"<glue_dir>": os.path.abspath(args.glue_dir), **(places or {})})
        self.cells = {(init, task, rate): [self.cell(init, task, rate, seed) for seed in self.seeds]
                      for init in inits for task in self.tasks for rate in self.rates_of[init]}
        self.chosen: dict[tuple[str, str], float] = {}  # (init, task) -> the learning rate selected on dev

    def cell(self, init: str, task: str, rate: float, seed: int):
        name, examples, epochs, eval_every = task_spec(task)
        if self.carve_validation and not examples:
            raise ValueError(f"{task} trains on its whole set: carve_validation needs a number of examples (sst2-N)")
        carve = [f"--config.data.validation_examples={validation_size(examples)}"] if self.carve_validation else []
        flags = [*self.recipe, f"--config.num_epochs={epochs or self.epochs}",
                 *([f"--config.eval_every_epochs={eval_every}"] if eval_every > 1 else []),
                 f"--config.optimizer.learning_rate={rate}", f"--config.data.max_train_examples={examples}", *carve,
                 *self.inits[init], *(self.per_cell[init](task, seed) if init in self.per_cell else [])]
        model = f",model={self.models[init]}" if self.models.get(init, "bert") != "bert" else ""
        return self.harness.finetune_cell(f"{init}_lr{rate:g}", task, seed, f"configs/glue.py:task={name}{model}",
                                          flags)

    def run(self) -> dict[tuple[str, str], list[float]]:
        """Runs what is not done; -> (init, task) -> the main dev metric of each seed x100, at the learning rate
        chosen by --rate_selection (self.chosen)."""
        pairs = [(init, task) for init in self.inits for task in self.tasks]
        if self.rate_selection == "first_seed":
            # seed 0 of every rate, and every seed of an init with one rate (nothing to choose: no idle worker)
            one_rate = {init for init in self.inits if len(self.rates_of[init]) == 1}
            self.harness.run([cell for (init, _, _), cells in self.cells.items()
                              for cell in (cells if init in one_rate else cells[:1])])
            for init, task in pairs:
                self.chosen[init, task] = max(self.rates_of[init],
                                              key=lambda rate: self.score(self.cells[init, task, rate][0]))
            self.harness.run([cell for (init, task, rate), cells in self.cells.items()
                              if rate == self.chosen[init, task] and init not in one_rate
                              for cell in cells[1:]])
        else:
            self.harness.run([cell for cells in self.cells.values() for cell in cells])
            for init, task in pairs:
                self.chosen[init, task] = max(self.rates_of[init], key=lambda rate: np.mean(
                    [self.score(c) for c in self.cells[init, task, rate]]))
        return {(init, task): [self.score(c) for c in self.cells[init, task, self.chosen[init, task]]]
                for init, task in pairs}

    def score(self, cell, split: str = "dev") -> float:
        """A finished cell's main metric x100 on dev (or on the carved "validation" split)."""
        metric = glue.get_task(task_spec(cell.values["task"])[0]).main_metric
        return 100 * self.harness.results(cell)["metrics"][split][metric]

    def counted(self) -> list[str]:
        return [t for t in self.tasks if t not in NOT_COUNTED]

    def table(self, scores: dict[tuple[str, str], list[float]]) -> str:
        """Markdown: a row per init (mean ± std over seeds per task, the counted tasks' average), then the gain of
        each init over `random` where there is one."""
        header = ["init"] + [f"{t} ({glue.get_task(task_spec(t)[0]).main_metric})" for t in self.tasks] + ["average"]
        rows = [[init] + [_mean_std(scores[init, t]) + self._rate(init, t) for t in self.tasks]
                + [_mean_std(self.average(scores, init))] for init in self.inits]
        if "random" in self.inits:
            for init in (i for i in self.inits if i != "random"):
                gains = {t: np.mean(scores[init, t]) - np.mean(scores["random", t]) for t in self.tasks}
                average = (f"{np.mean(self.average(scores, init)) - np.mean(self.average(scores, 'random')):+.1f}"
                           if self.counted() else "—")
                rows.append([f"{init} - random"] + [f"{gains[t]:+.1f}" for t in self.tasks] + [average])
        counted = ", ".join(self.counted())
        rates = (f"; learning rate {self.rates[0]:g}" if len(self.rates) == 1 else
                 f"; in brackets the learning rate of {', '.join(f'{r:g}' for r in self.rates)} best on dev"
                 + (f" for seed {self.seeds[0]}" if self.rate_selection == "first_seed" else ""))
        return (f"GLUE dev x100, mean ± std over seeds {self.seeds} (average over {counted}{rates}):\n\n"
                + rp.markdown(header, rows))

    def _rate(self, init: str, task: str) -> str:
        return f" ({self.chosen[init, task]:g})" if len(self.rates) > 1 or len(self.rates_of[init]) > 1 else ""

    def average(self, scores, init: str) -> list[float]:
        """Per seed, the mean over the counted tasks ([] when no counted task ran)."""
        counted = [scores[init, t] for t in self.counted()]
        return list(np.mean(counted, axis=0)) if counted else []

    def footer(self) -> str:
        return self.harness.footer()


def _mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    return f"{np.mean(values):.1f} ± {np.std(values, ddof=1) if len(values) > 1 else 0.0:.1f}"
