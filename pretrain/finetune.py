"""Fine-tuning entry point.

  python -m pretrain.finetune --config=configs/glue.py:task=mrpc --workdir=runs/mrpc \
      --config.init=PATH [--config.optimizer.learning_rate=3e-5 --config.seed=1 ...]

PATH: a pretrain.train workdir (Orbax) or a Hugging Face BERT directory. The workdir receives
results.json (task, metrics of the best epoch, best epoch, wall time), predictions/ (dev with
labels, test in the GLUE submission format), checkpoints/ (the best epoch only), metrics.jsonl,
tensorboard/ and config.json (with the architecture and tokenizer taken from the init; a --config.model.KEY=VALUE
flag, such as model.classifier_pooling=mean or model.dropout_rate=0.1, overrides the init's value).
Multi-host: the flags of pretrain/runtime/distributed.py, as for pretrain.train. --print_config prints the
resolved config (the init's architecture and tokenizer included) and exits.
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import json
import sys

from absl import flags

from pretrain.runtime import cli, distributed, errors

_CONFIG, _WORKDIR, _PRINT_CONFIG = cli.define_config_flags(
    "configs/glue.py:task=mrpc", "Directory for results, predictions and the best checkpoint.")
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    cli.begin(argv)
    from pretrain.loops import finetuning
    from pretrain.training import pretrained
    if _PRINT_CONFIG.value:  # with the architecture and tokenizer of --config.init, as config.json gets them
        with errors.one_line_errors():
            print(pretrained.resolve_config(_CONFIG.value, cli.model_flags())[0].to_json_best_effort(indent=2))
        return
    workdir = cli.require_workdir(_WORKDIR)
    with errors.one_line_errors():
        distributed.initialize()  # before any JAX computation
        results = finetuning.finetune(_CONFIG.value, workdir, cli.model_flags())
    print(json.dumps({k: results[k] for k in ("task", "best_epoch", "metrics", "wall_time_sec")}, indent=1))


if __name__ == "__main__":
    sys.exit(cli.run(main))
