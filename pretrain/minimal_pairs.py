"""Minimal-pair accuracy (BLiMP-format JSON lines) of a masked LM by pseudo-log-likelihood, or of a GPT or a T5.

  python -m pretrain.minimal_pairs --workdir=runs/bert_base --data=blimp/anaphor_gender_agreement.jsonl,... \
      [--pll=original|within_word_l2r --batch_size=8 --output=results.json --tokenizer_path=PATH]

--data takes files and folders (every *.jsonl inside). The work is done by pretrain/lm/minimal_pairs.py, whose
docstring has the details; lm-eval's `blimp` tasks give the same comparison through python -m pretrain.lm_eval.
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import json
import os
import sys

from absl import flags

from pretrain.runtime import cli, errors

_WORKDIR = flags.DEFINE_string("workdir", None, "A pretrain.train workdir (BERT, ALBERT, ModernBERT, ELECTRA, GPT, T5) "
                               "or a Hugging Face BERT, ALBERT, ModernBERT, GPT-2 or T5 directory.")
_DATA = flags.DEFINE_list("data", None, "BLiMP-format JSON-lines files, or folders of them (*.jsonl).")
_PLL = flags.DEFINE_enum("pll", "original", ["original", "within_word_l2r"],
                         "A masked LM's PLL: Salazar et al.'s, or Kauf & Ivanova's word-l2r variant.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "A GPT's sentences per model call.")
_TOKENIZER_PATH = flags.DEFINE_string("tokenizer_path", "", "Replaces the tokenizer path the checkpoint names.")
_OUTPUT = flags.DEFINE_string("output", "", "A JSON file for the accuracies (overall, per phenomenon, per paradigm).")
flags.mark_flags_as_required(["workdir", "data"])


def data_files(entries: list[str]) -> list[str]:
    """Files as given; a folder -> its *.jsonl files, sorted."""
    files = []
    for entry in entries:
        if os.path.isdir(entry):
            files += sorted(os.path.join(entry, name) for name in os.listdir(entry) if name.endswith(".jsonl"))
        else:
            files.append(entry)
    return files


def main(argv: list[str]) -> None:
    cli.begin(argv)
    from pretrain.lm import minimal_pairs  # imported late so that --help and flag errors stay fast
    with errors.one_line_errors():
        pairs = minimal_pairs.read_pairs(data_files(_DATA.value))  # before the model: a bad file fails at once
        score = minimal_pairs.sentence_scorer(_WORKDIR.value, pll=_PLL.value, tokenizer_path=_TOKENIZER_PATH.value,
                                              batch_size=_BATCH_SIZE.value)
        scores = score([p.good for p in pairs] + [p.bad for p in pairs])  # one batch stream for both sides
        good, bad = scores[:len(pairs)], scores[len(pairs):]
        summary = minimal_pairs.accuracies(pairs, good, bad)
        if _OUTPUT.value:
            with open(_OUTPUT.value, "w") as f:
                json.dump(summary, f, indent=2)
    print(minimal_pairs.format_accuracies(summary))


if __name__ == "__main__":
    sys.exit(cli.run(main))
