"""Pretraining fitted to a wall-clock budget (`config.budget_minutes` > 0), as Cramming (Geiping & Goldstein 2022)
ties its schedule to a budget rather than to a step count.

Before the run, a short calibration run (CALIBRATION_STEPS steps in a temporary directory, left nowhere) times the
step on this machine. The steps that fit the rest of the budget become the run's StepPlan (a value of its own: the
config stays as the command gave it), every step count tied to the schedule stretched with them (the warm-up keeps
its share of the steps, the evaluations and checkpoints their number), so the learning rate reaches its end exactly
when the budget does. The loop reads its step counts from the plan, and passes it to the schedule. The plan is written to
WORKDIR/budget.json: the same command resumes a stopped run on the same schedule and finishes it, and
`--config.budget_steps=N` with the plan's `planned_steps` reproduces the run without a clock (bitwise). The calibration, the
set-up and the final checkpoint are inside the budget, the held-out evaluations along the run are not (they
measure, as a profiler would; pretrain/loops/pretraining.py moves the deadline past them); should the machine slow down, the run saves and stops at the
deadline as on preemption.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from typing import Callable

import ml_collections

from pretrain.workdir import storage

CALIBRATION_STEPS = 80  # timed from step TIMED_FROM on: the first windows hold the compilation and the batches built
TIMED_FROM = 30         # ahead during it, faster than the steady state where batch building shares the cores
SAFETY = 0.90           # of the remaining budget: the real loop's steps ran 7-8% slower than the calibration timed
#                         them (2 cores, recipe=best, 8 and 60 minutes), the rest is slack for noise
PLAN_FILE = "budget.json"


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """The step counts a pretraining run follows: its config's (`of`), or fitted to a budget (`stretched`).

    The counts laid over the schedule (warmup_steps, eval_every, checkpoint_every, long_seq_start_step) are
    stretched in proportion with num_train_steps; 0 (off, or unset) stays 0."""

    num_train_steps: int
    warmup_steps: int = 0
    eval_every: int = 0
    checkpoint_every: int = 0
    long_seq_start_step: int = 0

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> "StepPlan":
        """The counts config gives (a key it lacks: 0)."""
        optimizer, data = config.get("optimizer") or {}, config.get("data") or {}
        return cls(config.num_train_steps, optimizer.get("warmup_steps", 0), config.get("eval_every", 0),
                   config.get("checkpoint_every", 0), data.get("long_seq_start_step", 0))

    def stretched(self, steps: int) -> "StepPlan":
        """The same shape over `steps`: each count tied to the schedule (where > 0) scaled by the same factor, count x
        steps / num_train_steps in one division (a factor first rounds: 100 x 8,075 / 1,000 came out 807.49...)."""
        scaled = {field.name: max(1, round(getattr(self, field.name) * steps / self.num_train_steps))
                  for field in dataclasses.fields(self)[1:] if getattr(self, field.name) > 0}  # after the steps
        return dataclasses.replace(self, num_train_steps=steps, **scaled)

    def record(self, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        """A copy of `config` with the plan's counts: what WORKDIR/config.json records of the run as it went (the
        command that reproduces it), and what a resumed run is compared with. The loop never reads it."""
        config = ml_collections.ConfigDict(config.to_dict())
        config.num_train_steps = self.num_train_steps
        for key, value in (("optimizer.warmup_steps", self.warmup_steps), ("eval_every", self.eval_every),
                           ("checkpoint_every", self.checkpoint_every),
                           ("data.long_seq_start_step", self.long_seq_start_step)):
            *parents, last = key.split(".")
            node = config.get(parents[0]) if parents else config
            if node is not None and last in node:
                node[last] = value
        return config


def plan_steps(budget_left: float, step_time: float, setup: float) -> int:
    """The steps that fit: what is left of the budget, less one more set-up (the real run loads the corpus and
    compiles again, from the compilation cache where it can), with SAFETY's slack."""
    return max(1, int(SAFETY * (budget_left - setup) / step_time))


def stretch(config: ml_collections.ConfigDict, steps: int) -> ml_collections.ConfigDict:
    """A copy of `config` with the schedule's shape over `steps` (StepPlan.stretched, recorded): for a peer that
    follows our schedule (scripts/bench/bench_cram.py) and for a finished run's files."""
    return StepPlan.of(config).stretched(steps).record(config)


def time_steps(config: ml_collections.ConfigDict, train: Callable) -> tuple[float, float]:
    """(seconds per step, seconds of set-up and compilation) of `config` on this machine, from a short run of
    `train(config, workdir)` in a temporary directory."""
    calibration = ml_collections.ConfigDict(config.to_dict())
    calibration.budget_minutes, calibration.num_train_steps = 0.0, CALIBRATION_STEPS
    calibration.log_every, calibration.eval_every, calibration.data.eval_documents = 10, 0, 0
    calibration.checkpoint_every = CALIBRATION_STEPS
    directory = tempfile.mkdtemp(prefix="budget_calibration_")
    try:
        started = time.time()
        train(calibration, directory)
        wall = time.time() - started
        with open(os.path.join(directory, "metrics.jsonl")) as f:
            windows = [json.loads(line) for line in f]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    step_times = [w["step_time_sec"] for w in windows if w.get("step", 0) > TIMED_FROM and "step_time_sec" in w]
    step_time = sum(step_times) / len(step_times)
    return step_time, wall - CALIBRATION_STEPS * step_time


def read_plan(workdir: str) -> dict | None:
    path = os.path.join(workdir, PLAN_FILE)
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


def fit(config: ml_collections.ConfigDict, workdir: str, train: Callable) -> tuple[StepPlan, float | None]:
    """(the steps the run follows, the budget's deadline in seconds since the epoch or None). config.budget_steps
    > 0: the config's plan stretched to those steps, no deadline; config.budget_minutes > 0: the steps that fit the
    budget, timed by a calibration run of `train` (a workdir with a plan resumes it: the same steps, no deadline, the
    run finishes the schedule it began); neither: the config's own plan."""
    minutes, replayed = config.get("budget_minutes", 0.0), config.get("budget_steps", 0)
    own = StepPlan.of(config)
    if replayed:  # a budget run's plan without its clock: the same schedule, bitwise the same run
        return own.stretched(replayed), None
    if not minutes:
        return own, None
    plan = read_plan(workdir)
    if plan is not None:
        return own.stretched(plan["planned_steps"]), None
    deadline = time.time() + 60 * minutes
    step_time, setup = time_steps(config, train)
    calibration_sec = time.time() - (deadline - 60 * minutes)
    steps = plan_steps(deadline - time.time(), step_time, setup)
    print(f"Timed {step_time:.3f} s/step (set-up {setup:.0f} s): {steps:,} steps fit the {minutes:g}-minute budget",
          flush=True)
    storage.makedirs(workdir)
    storage.write_atomic(os.path.join(workdir, PLAN_FILE), json.dumps(dict(
        minutes=minutes, timed_step_sec=step_time, setup_sec=setup, calibration_sec=calibration_sec,
        planned_steps=steps, steps_in_config=config.num_train_steps), indent=1))
    return own.stretched(steps), deadline
