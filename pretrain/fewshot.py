"""Few-shot prompting: in-context classification of GLUE tasks with a decoder-only language model.

  python -m pretrain.fewshot --init=PATH --task=sst2 --k=4 --seed=0 \
      [--glue_dir=$GLUE_DIR --max_examples=200 --normalize=false --balanced=false --output=DIR]

The work is done by pretrain/lm/fewshot.py, whose docstring has the details.
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import os
import sys

from absl import flags

from pretrain.runtime import cli, errors
from pretrain.tasks.glue.prompts import FORMATS

_INIT = flags.DEFINE_string("init", None, "A pretrain.train GPT workdir or a Hugging Face GPT-2 directory.")
_TASK = flags.DEFINE_string("task", None, "GLUE classification task: " + ", ".join(FORMATS) + ".")
_K = flags.DEFINE_integer("k", 4, "Demonstrations per prompt (0 = zero-shot).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the demonstration draws.")
# $GLUE_DIR as configs/glue.py reads it for pretrain.finetune
_GLUE_DIR = flags.DEFINE_string("glue_dir", os.environ.get("GLUE_DIR", "../shared/data/glue"),
                                "Folder of the official GLUE files (default: $GLUE_DIR, else ../shared/data/glue).")
_GLUE_SOURCE = flags.DEFINE_enum("glue_source", "dir", ["dir", "tfds", "hf"],
                                 "GLUE files (dir), TFDS glue/<task>, or the Hugging Face Hub's nyu-mll/glue (hf; "
                                 "--glue_dir then names another Hub dataset or a local copy of the repository).")
_SPLIT = flags.DEFINE_string("split", "dev", "Split to evaluate: dev (MNLI: dev_matched) or dev_mismatched.")
_MAX_EXAMPLES = flags.DEFINE_integer("max_examples", 0, "Evaluate a fixed random subset of this many (0 = all).")
_NORMALIZE = flags.DEFINE_boolean("normalize", False, "Score label words by mean log-prob per token, not the sum.")
_BALANCED = flags.DEFINE_boolean("balanced", False, "Draw the same number of demonstrations from each class.")
_LABEL_WORDS = flags.DEFINE_list("label_words", [], "Replace the label words (one per class, GLUE label order).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Prompts per model call.")
_TOKENIZER_PATH = flags.DEFINE_string("tokenizer_path", "", "Replaces the tokenizer file the checkpoint names.")
_OUTPUT = flags.DEFINE_string("output", "", "Directory for results.json and predictions.tsv.")
flags.mark_flags_as_required(["init", "task"])



def _glue_location() -> str:
    """--glue_dir, except that the Hub source without it reads nyu-mll/glue (its default names the official files)."""
    return "" if _GLUE_SOURCE.value == "hf" and not _GLUE_DIR.present else _GLUE_DIR.value


def main(argv: list[str]) -> None:
    cli.begin(argv)
    from pretrain.lm import (
        fewshot,  # imported late so that --help and flag errors stay fast
    )
    with errors.one_line_errors():
        result, summary = fewshot.run(
            _INIT.value, _TASK.value, k=_K.value, seed=_SEED.value, glue_dir=_glue_location(),
            glue_source=_GLUE_SOURCE.value, split=_SPLIT.value, max_examples=_MAX_EXAMPLES.value,
            normalize=_NORMALIZE.value, balanced=_BALANCED.value, label_words=_LABEL_WORDS.value,
            batch_size=_BATCH_SIZE.value, tokenizer_path=_TOKENIZER_PATH.value, output_dir=_OUTPUT.value)
    print(fewshot.report(result, summary))


if __name__ == "__main__":
    sys.exit(cli.run(main))
