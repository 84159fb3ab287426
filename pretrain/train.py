"""Pretraining entry point.

  python -m pretrain.train --config=configs/bert.py:size=tiny --workdir=runs/bert_tiny \
      [--config.batch_size=64 --config.optimizer.learning_rate=5e-4 ...]

The workdir receives checkpoints/ (Orbax), tensorboard/, metrics.jsonl and config.json. Running
the same command again resumes from the latest checkpoint. Multi-host: the same command on every host
with --coordinator_address=HOST:PORT --num_processes=N --process_id=I (none on a Cloud TPU VM; see
pretrain/runtime/distributed.py). --print_config prints the resolved config and exits.
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import sys
import time

from absl import flags

from pretrain.runtime import cli, distributed, errors

_CONFIG, _WORKDIR, _PRINT_CONFIG = cli.define_config_flags(
    "configs/bert.py:size=tiny", "Directory for checkpoints, logs and metrics (an existing one resumes).")
_TIME_BUDGET = flags.DEFINE_float(
    "time_budget_minutes", 0.0, "Save and stop at the first step boundary this many minutes after the start, as "
    "on preemption (exit 75; the same command resumes). 0: no budget. The schedule still spans "
    "config.num_train_steps (--config.budget_minutes fits the steps to a budget instead: docs/training.md).")
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    cli.begin(argv)
    if _PRINT_CONFIG.value:
        print(_CONFIG.value.to_json_best_effort(indent=2))
        return
    workdir = cli.require_workdir(_WORKDIR)
    deadline = time.time() + 60 * _TIME_BUDGET.value if _TIME_BUDGET.value > 0 else None
    from pretrain.loops import pretraining
    with errors.one_line_errors():
        distributed.initialize()  # before any JAX computation
        metrics = pretraining.train_and_evaluate(_CONFIG.value, workdir, deadline)
    if metrics:
        print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))


if __name__ == "__main__":
    sys.exit(cli.run(main))
