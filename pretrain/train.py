"""Pretraining entry point.

  python -m pretrain.train --config=configs/bert.py:size=tiny --workdir=runs/bert_tiny \
      [--config.batch_size=64 --config.optimizer.learning_rate=5e-4 ...]

The workdir receives checkpoints/ (Orbax), tensorboard/, metrics.jsonl and config.json. Running
the same command again resumes from the latest checkpoint. Multi-host: the same command on every host
with --coordinator_address=HOST:PORT --num_processes=N --process_id=I (none on a Cloud TPU VM; see
pretrain/core/distributed.py).
"""
from __future__ import annotations

import sys

from absl import flags
from ml_collections import config_flags

from pretrain.core import cli, distributed, errors

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/bert.py:size=tiny.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and metrics.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    cli.begin(argv)
    from pretrain.loops import pretraining
    with errors.one_line_errors():
        distributed.initialize()  # before any JAX computation
        metrics = pretraining.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    if metrics:
        print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))


if __name__ == "__main__":
    sys.exit(cli.run(main))
