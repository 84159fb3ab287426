"""EleutherAI's lm-evaluation-harness on this project's checkpoints: lm-eval's own command line, with the model type
`lmpretrain` registered (lm-eval's CLI finds only the types it ships).

  python -m pretrain.lm_eval --model lmpretrain --model_args workdir=runs/gpt_small \
      --tasks hellaswag,arc_easy,lambada_openai --num_fewshot 0 --output_path results/
  python -m pretrain.lm_eval --model lmpretrain --model_args workdir=runs/bert_base,pll=within_word_l2r \
      --tasks blimp
  python -m pretrain.lm_eval --model lmpretrain --model_args workdir=runs/gpt_small \
      --include_path my_tasks/ --tasks my_local_task        # a task YAML over local files: nothing downloaded

Every lm-eval option works as documented for `lm_eval`; pretrain/lm/harness.py says what each family scores.
Needs the `lmeval` extra (pip install -e .[lmeval]).
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import logging
import sys

from pretrain.runtime import compilation_cache, errors


def main() -> int:
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        print("error: lm-evaluation-harness is not installed: pip install -e .[lmeval]", file=sys.stderr)
        return 2
    import pretrain.lm.harness  # noqa: F401 - registers --model lmpretrain

    compilation_cache.enable()
    with errors.one_line_errors(), TaskErrorsInOneLine():
        cli_evaluate()
    return 0


class TaskErrorsInOneLine(logging.Handler):
    """lm-eval reports a task it cannot find with a ValueError, and datasets a data file it cannot read with an
    ERROR log line and then a DatasetGenerationError, each with a traceback: one line and exit status 2 instead."""
    READER_LOGS = ("datasets.packaged_modules.json.json", "datasets.packaged_modules.csv.csv")

    def __init__(self):
        super().__init__(logging.ERROR)
        self.logged = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.logged = record.getMessage()  # "Failed to load JSON from file '...' with error ...: ... in row N"

    def __enter__(self):
        for name in self.READER_LOGS:
            logging.getLogger(name).addHandler(self)
            logging.getLogger(name).propagate = False
        return self

    def __exit__(self, kind, error, traceback):
        if error is None:
            return False
        if type(error).__name__ == "DatasetGenerationError":
            cause = error
            while cause.__cause__ is not None:
                cause = cause.__cause__
            print(f"error: a task's data cannot be read: {self.logged or cause} (fix the file: JSON lines are one "
                  "object a line)", file=sys.stderr)
            sys.exit(2)
        if isinstance(error, (ValueError, KeyError)) and "task" in str(error).lower():
            print(f"error: {str(error).strip()} (lm-eval ls tasks lists the known ones; --include_path DIR adds a "
                  "folder of task YAMLs)", file=sys.stderr)
            sys.exit(2)
        return False


if __name__ == "__main__":
    sys.exit(main())
