"""Sweep entry point: every cell of a config file's get_sweep(arg), each a run in its own workdir.

  python -m pretrain.sweep --config=configs/glue.py:task=mrpc --sweep=lr_seed --workdir=runs/mrpc_sweep \
      --config.init=PATH [--parallel=2] [--metric=f1]
  python -m pretrain.sweep --config=configs/glue.py --sweep=table:mrpc,cola --workdir=runs/table --config.init=PATH
  python -m pretrain.sweep --config=configs/bert.py:size=base --sweep=NAME --workdir=runs/sweep \
      --launch=tpu:my-v4-32 --launch_flags="--zone=us-central2-b" --remote_workdir=/gcs/BUCKET/sweep

Each cell runs `python -m pretrain.finetune` (a config with a task) or `pretrain.train` with the cell's
values as --config.KEY=VALUE (or config-string arguments, `arg.NAME`) after the --config.* flags given
here, which every cell shares. Locally --parallel cells run at once; with --launch=tpu:NAME one at a time
on every worker of that TPU VM (python -m pretrain.launch run), their workdirs under --remote_workdir.
Resumable: the same command skips finished cells and resumes cut-short ones (pretrain/jobs/sweep_dir.py).
WORKDIR receives sweep.json, logs/, results.csv, results.md and a plot of --metric over the swept values.
Exit status: 0 when every cell finished, 1 when one failed, 75 when stopped (SIGTERM / Ctrl-C).
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import sys

from absl import flags
from ml_collections import config_flags

from pretrain.runtime import cli, errors

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file with a get_sweep(arg), e.g. "
                                          "configs/glue.py:task=mrpc.", lock_config=True)
flags.mark_flags_as_required(["config"])
_WORKDIR = flags.DEFINE_string("workdir", None, "The sweep's directory (a new one, or a sweep's to resume it).")
_SWEEP = flags.DEFINE_string("sweep", None, "The argument of the config file's get_sweep(arg), e.g. lr_seed.",
                             required=True)
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Cells run at once (locally).", lower_bound=1)
_LAUNCH = flags.DEFINE_string("launch", "", "tpu:NAME: run each cell on that TPU VM through pretrain.launch.")
_LAUNCH_FLAGS = flags.DEFINE_string("launch_flags", "", "Flags for `pretrain.launch run` (e.g. --zone=...).")
_REMOTE_WORKDIR = flags.DEFINE_string("remote_workdir", "", "With --launch: where the cells' workdirs go, a "
                                      "path the workers and this machine share (a bucket mounted with gcsfuse "
                                      "at the same path, e.g. /gcs/BUCKET/sweep).")
_METRIC = flags.DEFINE_string("metric", "", "What the table and plot show (default: best_score for fine-tuning, "
                              "eval_loss for pretraining; a results.json or metrics.jsonl key, or its last part).")
_COMMAND = flags.DEFINE_enum("command", "auto", ["auto", "finetune", "train"],
                             "The entry point of each cell (auto: finetune for a config with a task).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print each cell's command and run nothing.")


def shared_config_flags() -> list[str]:
    """The --config.KEY=VALUE flags given here, passed on to every cell as they were written."""
    flags_given = [arg for arg in sys.argv[1:] if arg.startswith("--config.")]
    if bad := [arg for arg in flags_given if "=" not in arg]:
        raise errors.UserError(f"{bad[0]}: write config overrides as --config.KEY=VALUE")
    return flags_given


def main(argv: list[str]) -> None:
    cli.begin(argv)
    from pretrain.jobs import sweep_cells, sweep_report, sweep_runner
    from pretrain.jobs.sweep_dir import SweepDir
    workdir = cli.require_workdir(_WORKDIR)
    with errors.one_line_errors():
        config_string = config_flags.get_config_filename(flags.FLAGS["config"])
        entry = sweep_cells.entry_point(_CONFIG.value) if _COMMAND.value == "auto" else _COMMAND.value
        if _LAUNCH.value and not _REMOTE_WORKDIR.value:
            raise errors.UserError("--launch needs --remote_workdir for the cells' workdirs (a path the workers "
                                   "share with this machine, e.g. a bucket mounted with gcsfuse at /gcs/BUCKET)")
        launch = sweep_cells.launch_prefix(_LAUNCH.value, _LAUNCH_FLAGS.value) if _LAUNCH.value else None
        run_root = _REMOTE_WORKDIR.value or workdir
        shared = shared_config_flags()
        cells = sweep_cells.build_cells(config_string, sweep_cells.load_cells(config_string, _SWEEP.value), entry,
                                        shared, run_root, launch)
        if _DRY_RUN.value:
            for cell in cells:
                print(f"{cell.name}:\n  {' '.join(cell.command)}")
            return
        sweep = SweepDir(workdir)
        sweep.claim({"config": config_string, "sweep": _SWEEP.value, "entry_point": entry, "shared_flags": shared,
                     "run_root": run_root, "launch": launch, "cells": [c.values for c in cells]})
        print(f"{len(cells)} cells of {config_string} --sweep={_SWEEP.value}, {entry}, in {workdir}", flush=True)
        try:
            statuses = sweep_runner.run_cells(sweep, cells, 1 if launch else _PARALLEL.value,
                                              say=lambda line: print(line, flush=True))
        except sweep_runner.SweepStopped as e:
            print(e, file=sys.stderr)
            sys.exit(errors.EXIT_PREEMPTED)
        rows, key = sweep_report.collect(sweep, cells, run_root, entry, _METRIC.value or
                                         sweep_report.DEFAULT_METRICS[entry])
        paths = sweep_report.write_report(sweep, rows, sweep_report.swept_keys(cells), key,
                                          f"{config_string} --sweep={_SWEEP.value}")
    print("\n" + sweep_report.markdown(rows, sweep_report.swept_keys(cells), key))
    print("wrote " + ", ".join(paths.values()))
    failed = [name for name, code in statuses.items() if code != 0]
    if failed:
        print(f"error: {len(failed)} cells failed: {', '.join(failed)} (logs in {workdir}/logs)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(cli.run(main))
