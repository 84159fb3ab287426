"""The harness of the reproduce_* scripts: pretrain a few arms the same way, fine-tune each over seeds, and
print the paper's rows beside ours with the wall time and the machine.

A reproduction is a sweep whose cells are whole runs (pretrain/jobs: resumable, `--parallel` at once, a
killed script resumed by the same command): `<output>/pretrain_<arm>/` workdirs of `pretrain.train` (with
`--minutes=M` each arm pretrains for M minutes of wall clock, config.budget_minutes: its steps planned from its
own measured step time, one arm at a time so that each has the machine), then
`<output>/<arm>_<task>_seed<k>/` workdirs of `pretrain.finetune` from them (or from random weights of the
same architecture: `--config.init_weights=random`). The corpus and tokenizer are `make demo`'s (built here into
`<output>/assets` when not given), so the numbers are small at CPU scale; a config and its overrides are
all that changes at another scale.

With `--ledger` (scripts/bench/bench_ledger.py) every finished fine-tuning run is also kept there, keyed by its
command line with the paths that differ between machines named (`places`), so a study that takes several sessions
survives losing the machine its run directories lived on: a cell the ledger holds is not run again.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time

import numpy as np

from pretrain.jobs import sweep_report, sweep_runner
from pretrain.jobs.sweep_cells import Cell
from pretrain.jobs.sweep_dir import SweepDir
from pretrain.runtime.errors import EXIT_PREEMPTED, UserError
from scripts.bench import bench_ledger

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLUE_DIR = os.path.join(REPO, "..", "shared", "data", "glue")


def add_common_flags(parser, output: str) -> None:
    parser.add_argument("--output", default=output, help="the reproduction's directory (resumable)")
    parser.add_argument("--quick", action="store_true", help="fewer steps, examples and seeds (minutes)")
    parser.add_argument("--corpus", default="", help="pretraining text (default: make demo's, built in --output)")
    parser.add_argument("--tokenizer", default="", help="SentencePiece model (default: make demo's, built too)")
    parser.add_argument("--glue_dir", default=GLUE_DIR, help="official GLUE layout")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (fine-tuning only with --minutes)")
    parser.add_argument("--minutes", type=float, default=0.0,
                        help="pretrain each arm for this wall-clock budget (config.budget_minutes) instead of a step "
                             "count")


def demo_assets(args) -> tuple[str, str]:
    """(corpus, tokenizer): the given ones, or `make demo`'s recipe into <output>/assets (4 MB of CPython's
    docs and an 8,000-piece SentencePiece model, as the tiny configs expect)."""
    if args.corpus and args.tokenizer:
        return os.path.abspath(args.corpus), os.path.abspath(args.tokenizer)
    from pretrain.tools import train_tokenizer
    from pretrain.tools.build_corpus import build_corpus
    assets = os.path.join(os.path.abspath(args.output), "assets")
    corpus, model = os.path.join(assets, "corpus.txt"), os.path.join(assets, "spm.model")
    if not os.path.exists(model):
        os.makedirs(assets, exist_ok=True)
        build_corpus(corpus, max_mb=4.0)
        train_tokenizer.train_sentencepiece(corpus, os.path.join(assets, "spm"), vocab_size=8000)
    return corpus, model


def machine() -> str:
    """'<CPU model>, N cores, <OS>' (and the JAX platform the runs use)."""
    model = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
        model = names[0] if names else model
    platforms = os.environ.get("JAX_PLATFORMS") or "unset (the runs use JAX's default backend)"
    return f"{model}, {os.cpu_count()} cores, {platform.system()}; JAX_PLATFORMS={platforms}"


class Reproduction:
    """The runs of one reproduction in one sweep directory."""

    def __init__(self, args, settings: list[str], places: dict[str, str] | None = None):
        """places: a name (<pretrained: ...>) -> a path the runs' commands hold, as --ledger keys them."""
        self.output = os.path.abspath(args.output)
        self.parallel, self.minutes = args.parallel, args.minutes
        settings = settings + ([f"minutes={self.minutes:g}"] if self.minutes else [])
        self.sweep = SweepDir(self.output)
        # Another --quick, corpus or step count in the same directory would mix two experiments: refused.
        try:
            self.sweep.claim({"config": os.path.basename(sys.argv[0]), "entry_point": "reproduction",
                              "shared_flags": settings, "run_root": self.output, "launch": None, "cells": []})
        except UserError as e:
            sys.exit(f"error: {e}")
        self.started = time.perf_counter()
        self.cells: list[Cell] = []
        self.ledger = os.path.abspath(args.ledger) if getattr(args, "ledger", "") else ""
        self.places = {"<output>": self.output, "<repo>": REPO, **(places or {})}
        self.recorded: dict[str, dict] = {}  # cell name -> its --ledger record (a run whose directory is not here)

    def workdir(self, name: str) -> str:
        return os.path.join(self.output, name)

    def pretrain_cell(self, arm: str, config: str, flags: list[str]) -> Cell:
        """`pretrain.train` with `flags` (--config.KEY=VALUE); with --minutes, for that budget
        (config.budget_minutes: the step count among the flags is the schedule's shape, stretched to the steps that
        fit, pretrain/loops/budget.py)."""
        name = f"pretrain_{arm}"
        budget = [f"--config.budget_minutes={self.minutes:g}"] if self.minutes else []
        return Cell(name, {"arm": arm}, config, (sys.executable, "-m", "pretrain.train", f"--config={config}",
                                                 f"--workdir={self.workdir(name)}", *flags, *budget))

    def pretrained(self, cell: Cell) -> str:
        """The pretrain.train workdir of a pretraining cell."""
        return self.workdir(cell.name)

    def pretraining_text(self, steps: int) -> str:
        """What each arm's pretraining was, for the tables' captions."""
        return f"{self.minutes:g} minutes of pretraining per arm" if self.minutes else f"{steps} pretraining steps"

    def finetune_cell(self, arm: str, task: str, seed: int, config: str, flags: list[str]) -> Cell:
        name = f"{arm}_{task}_seed{seed}"
        return Cell(name, {"arm": arm, "task": task, "seed": seed}, config,
                    (sys.executable, "-m", "pretrain.finetune", f"--config={config}",
                     f"--workdir={self.workdir(name)}", f"--config.seed={seed}", *flags))

    def run_pretraining(self, cells: list[Cell]) -> None:
        """The pretraining cells: one at a time with --minutes, so that each budget has the machine."""
        self.run(cells, parallel=1 if self.minutes else self.parallel)

    def run(self, cells: list[Cell], parallel: int | None = None) -> None:
        """The cells not done before, here or in --ledger (`parallel` at once, default --parallel); exits 1 naming
        a failed one (its log has why)."""
        self.cells += cells
        todo = [cell for cell in cells if not self.in_ledger(cell)]
        try:
            statuses = sweep_runner.run_cells(self.sweep, todo, parallel or self.parallel,
                                              say=lambda line: print(line, flush=True))
        except sweep_runner.SweepStopped as e:
            print(e, file=sys.stderr)
            sys.exit(EXIT_PREEMPTED)
        finally:
            for cell in todo:
                self.record(cell)
        failed = [name for name, code in statuses.items() if code != 0]
        if failed:
            sys.exit(f"error: runs failed: {', '.join(failed)} (logs in {self.output}/logs)")

    def ledger_key(self, cell: Cell) -> list[str]:
        return bench_ledger.portable_command(list(cell.command), self.places)

    def in_ledger(self, cell: Cell, say: bool = True) -> bool:
        """Whether --ledger holds this cell's run while this directory does not (then its record stands in); `say`:
        with a line that it is skipped."""
        if not self.ledger or self.sweep.outcome(cell) is not None:
            return False
        record = bench_ledger.find(self.ledger, self.ledger_key(cell))
        if record is not None:
            self.recorded[cell.name] = record
            if say:
                print(f"  {cell.name}: in {self.ledger} ({record['recorded']}), skipped", flush=True)
        return record is not None

    def record(self, cell: Cell) -> None:
        """A finished fine-tuning run's results.json and wall time into --ledger, its paths named as in the key
        (once; a pretraining run, with no results.json, stays out)."""
        outcome = self.sweep.outcome(cell)
        path = os.path.join(self.workdir(cell.name), "results.json")
        if self.ledger and outcome is not None and os.path.exists(path):
            with open(path) as f:
                results = _portable(json.load(f), self.places)
            bench_ledger.record(self.ledger, self.ledger_key(cell), dict(results, wall_sec=outcome["wall_sec"]))

    def results(self, cell: Cell) -> dict:
        if cell.name in self.recorded:
            return self.recorded[cell.name]
        with open(os.path.join(self.workdir(cell.name), "results.json")) as f:
            return json.load(f)

    def last_metric(self, cell: Cell, key: str) -> float:
        """The last logged value of `key` in a pretraining cell's metrics.jsonl."""
        return sweep_report.run_metrics(self.pretrained(cell), "train").get(key, float("nan"))

    def footer(self) -> str:
        """How long: this invocation, and the runs' own wall times summed (over earlier invocations too)."""
        minutes = (time.perf_counter() - self.started) / 60
        runs = sum((self.recorded.get(c.name) or self.sweep.outcome(c))["wall_sec"] for c in self.cells) / 60
        return (f"Ran in {minutes:.1f} min (this invocation); its {len(self.cells)} runs took {runs:.1f} min in all, "
                f"one after another unless --parallel; on {machine()}.")


def _portable(value, places: dict[str, str]):
    """A results.json's values with the paths of `places` named (bench_ledger.portable), at any depth."""
    if isinstance(value, dict):
        return {k: _portable(v, places) for k, v in value.items()}
    if isinstance(value, list):
        return [_portable(v, places) for v in value]
    return bench_ledger.portable(value, places) if isinstance(value, str) else value


def mean_std(values: list[float]) -> str:
    return f"{100 * np.mean(values):.1f} ± {100 * np.std(values, ddof=1) if len(values) > 1 else 0.0:.1f}"


@contextlib.contextmanager
def figure(path: str, xlabel: str, ylabel: str, legend_size: int = 8):
    """Axes to draw on, written to `path` (PNG) on leaving, with the labels, a grid and the legend."""
    import matplotlib
    matplotlib.use("Agg")  # no display on a TPU VM or in CI
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    yield ax
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
