"""Perplexity of a GPT on held-out text, with sliding windows.

  python -m pretrain.perplexity --init=runs/shakespeare --data=../shared/data/tinyshakespeare/input.txt \
      --raw_text [--eval_fraction=0.1 --stride=32 --batch_size=8 --tokenizer_path=PATH]

The work is done by pretrain/lm/perplexity.py, whose docstring has the details.
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import sys

from absl import flags

from pretrain.runtime import cli, errors

_INIT = flags.DEFINE_string("init", None, "A pretrain.train GPT workdir or a Hugging Face GPT-2 directory.")
_DATA = flags.DEFINE_string("data", None, "The text file to score.")
_RAW_TEXT = flags.DEFINE_bool("raw_text", False, "Read --data verbatim as one stream (as data.source=raw_text); "
                              "default: blank lines separate documents.")
_EVAL_FRACTION = flags.DEFINE_float("eval_fraction", 0.1,
                                    "Score only the file's last fraction (nanoGPT's val split); 1 = all.")
_STRIDE = flags.DEFINE_integer("stride", 0, "Tokens between window starts, <= the context; 0 = half the context.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Windows per forward pass.")
_TOKENIZER_PATH = flags.DEFINE_string("tokenizer_path", "", "Replaces the tokenizer path the checkpoint names.")
flags.mark_flags_as_required(["init", "data"])


def main(argv: list[str]) -> None:
    cli.begin(argv)
    from pretrain.lm import (  # imported late so that --help and flag errors stay fast
        language_model,
        perplexity,
    )
    with errors.one_line_errors():
        lm = language_model.load_language_model(_INIT.value, tokenizer_path=_TOKENIZER_PATH.value)
        result = perplexity.perplexity(lm, _DATA.value, raw_text=_RAW_TEXT.value, eval_fraction=_EVAL_FRACTION.value,
                                       stride=_STRIDE.value, batch_size=_BATCH_SIZE.value)
    print(perplexity.format_result(result))


if __name__ == "__main__":
    sys.exit(cli.run(main))
