"""Scores a fine-tuned checkpoint without training.

  python -m pretrain.evaluate --workdir=runs/mrpc [--splits=dev,test] [--glue_dir=DIR]

Reads the workdir that pretrain.finetune wrote (config.json + checkpoints/), restores the best
checkpoint, prints the official metrics of the dev split(s), writes predictions/ (dev and, for
test splits, the GLUE submission files) and DIR/eval_results.json. Multi-host: the flags of
pretrain/runtime/distributed.py, as for pretrain.train.
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import json
import sys

from absl import flags

from pretrain.runtime import cli, distributed, errors

_WORKDIR = flags.DEFINE_string("workdir", None, "A pretrain.finetune workdir.")
_SPLITS = flags.DEFINE_list("splits", ["dev"], "Splits to score: dev (MNLI: dev_matched, dev_mismatched), test.")
_GLUE_DIR = flags.DEFINE_string("glue_dir", None, "Overrides the GLUE directory recorded in config.json.")
flags.mark_flags_as_required(["workdir"])


def main(argv: list[str]) -> None:
    cli.begin(argv)
    from pretrain.loops import (
        evaluation,  # imported late so that --help and flag errors stay fast
    )
    with errors.one_line_errors():
        distributed.initialize()  # before any JAX computation
        out = evaluation.evaluate_workdir(_WORKDIR.value, _SPLITS.value, _GLUE_DIR.value)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(cli.run(main))
