"""GLUE dev scores of several inits of one architecture under one fine-tuning recipe: the pretrained-vs-random
and equal-budget tables (scripts/bench/bench_cram.py, scripts/reproduce/demo_finetune.py).

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
  mrpc, cola, wnli: the whole training sets. WNLI is reported and, as in the BERT paper, not counted in the
           average (its dev set is adversarial to the training set: the majority class is the best score).
"""
from __future__ import annotations

import json
import os

import numpy as np

from pretrain.tasks.glue import data as glue
from scripts.reproduce import reproduction as rp

TASKS = {  # row name: (GLUE task, training examples (0: all), epochs (0: --epochs), dev scored every this many epochs)
    "sst2-100": ("sst2", 100, 100, 5), "sst2-300": ("sst2", 300, 33, 3), "sst2-1k": ("sst2", 1000, 10, 1),
    "sst2-3k": ("sst2", 3000, 4, 1), "sst2-8k": ("sst2", 8000, 0, 1), "mrpc": ("mrpc", 0, 0, 1),
    "cola": ("cola", 0, 0, 1), "wnli": ("wnli", 0, 0, 1)}
NOT_COUNTED = ("wnli",)


def add_flags(parser, output: str, seeds: tuple[int, ...] = (0, 1, 2)) -> None:
    parser.add_argument("--output", default=output, help="the study's directory (resumable)")
    parser.add_argument("--glue_dir", default=rp.GLUE_DIR, help="GLUE in the official layout")
    parser.add_argument("--parallel", type=int, default=1, help="fine-tuning runs at once")
    parser.add_argument("--ledger", default="",
                        help="JSON lines of finished runs kept apart from --output (scripts/bench/bench_ledger.py): "
                             "a run it holds is not run again, on any machine")
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(seeds))
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
    places: a name -> a path among the inits' flags, as --ledger keys the runs (reproduction.Reproduction)."""

    def __init__(self, args, inits: dict[str, list[str]], settings: list[str], models: dict[str, str] | None = None,
                 rates: dict[str, list[float]] | None = None, places: dict[str, str] | None = None):
        self.inits, self.tasks, self.seeds = inits, args.tasks, args.seeds
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
        name, examples, epochs, eval_every = TASKS[task]
        flags = [*self.recipe, f"--config.num_epochs={epochs or self.epochs}",
                 *([f"--config.eval_every_epochs={eval_every}"] if eval_every > 1 else []),
                 f"--config.optimizer.learning_rate={rate}", f"--config.data.max_train_examples={examples}",
                 *self.inits[init]]
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

    def score(self, cell) -> float:
        """A finished cell's main dev metric x100."""
        metric = glue.get_task(TASKS[cell.values["task"]][0]).main_metric
        return 100 * self.harness.results(cell)["metrics"]["dev"][metric]

    def counted(self) -> list[str]:
        return [t for t in self.tasks if t not in NOT_COUNTED]

    def table(self, scores: dict[tuple[str, str], list[float]]) -> str:
        """Markdown: a row per init (mean ± std over seeds per task, the counted tasks' average), then the gain of
        each init over `random` where there is one."""
        header = ["init"] + [f"{t} ({glue.get_task(TASKS[t][0]).main_metric})" for t in self.tasks] + ["average"]
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
