"""Fine-tuning entry point.

  python -m pretrain.finetune --config=configs/glue.py:task=mrpc --workdir=runs/mrpc \
      --config.init=PATH [--config.optimizer.learning_rate=3e-5 --config.seed=1 ...]

PATH: a pretrain.train workdir (Orbax) or a Hugging Face BERT directory. The workdir receives
results.json (task, metrics of the best epoch, best epoch, wall time), predictions/ (dev with
labels, test in the GLUE submission format), checkpoints/ (the best epoch only), metrics.jsonl,
tensorboard/ and config.json (with the architecture and tokenizer taken from the init).
Multi-host: the flags of pretrain/core/distributed.py, as for pretrain.train.
"""
from __future__ import annotations

import json
import sys

from absl import flags
from ml_collections import config_flags

from pretrain.core import cli, distributed, errors

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/glue.py:task=mrpc.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for results, predictions and the best checkpoint.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    cli.begin(argv)
    from pretrain.loops import finetuning
    with errors.one_line_errors():
        distributed.initialize()  # before any JAX computation
        results = finetuning.finetune(_CONFIG.value, _WORKDIR.value)
    print(json.dumps({k: results[k] for k in ("task", "best_epoch", "metrics", "wall_time_sec")}, indent=1))


if __name__ == "__main__":
    sys.exit(cli.run(main))
