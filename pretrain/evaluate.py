"""Scores a fine-tuned checkpoint without training.

  python -m pretrain.evaluate --workdir=runs/mrpc [--splits=dev,test] [--glue_dir=DIR]

Reads the workdir that pretrain.finetune wrote (config.json + checkpoints/), restores the best
checkpoint, prints the official metrics of the dev split(s), writes predictions/ (dev and, for
test splits, the GLUE submission files) and DIR/eval_results.json.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging

from pretrain import errors

_WORKDIR = flags.DEFINE_string("workdir", None, "A pretrain.finetune workdir.")
_SPLITS = flags.DEFINE_list("splits", ["dev"], "Splits to score: dev (MNLI: dev_matched, dev_mismatched), test.")
_GLUE_DIR = flags.DEFINE_string("glue_dir", None, "Overrides the GLUE directory recorded in config.json.")
flags.mark_flags_as_required(["workdir"])


def evaluate(workdir: str, splits: list[str], glue_dir: str | None = None) -> dict:
    import jax
    import ml_collections

    from pretrain import checkpoints, finetune_families, finetuner, partitioning
    from pretrain.data import glue

    config_path = os.path.join(workdir, "config.json")
    if not os.path.isfile(config_path):
        raise errors.UserError(f"{config_path} not found: --workdir must be a directory written by pretrain.finetune")
    with open(config_path) as f:
        config = ml_collections.ConfigDict(json.load(f))
    if glue_dir:
        config.data.glue_dir = glue_dir
    task = glue.get_task(config.task)
    wanted = []
    for split in splits:
        expanded = {"dev": task.dev_splits, "test": task.test_splits}.get(split, (split,))
        unknown = [s for s in expanded if s not in task.dev_splits + task.test_splits]
        if unknown:
            raise errors.UserError(f"--splits: {unknown[0]!r} is not a split of {task.name} "
                                   f"(use dev, test or one of {task.dev_splits + task.test_splits})")
        wanted += expanded
    family = finetune_families.for_config(config, task, finetuner.load_tokenizer(config))
    params, step = checkpoints.restore_params(os.path.join(workdir, "checkpoints"))
    mesh = partitioning.create_mesh(config.mesh_shape)
    jit_predict = jax.jit(family.predict_fn(family.build_model()))
    with mesh:
        results = finetuner.score_splits(config, family, jit_predict, params, mesh, wanted, workdir)
    out = {"task": task.name, "checkpoint_step": step, "metrics": results}
    with open(os.path.join(workdir, "eval_results.json"), "w") as f:
        json.dump(out, f, indent=2)
    return out


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    with errors.one_line_errors():
        out = evaluate(_WORKDIR.value, _SPLITS.value, _GLUE_DIR.value)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(errors.run_app(main))
