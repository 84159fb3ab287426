"""Domain adaptation entry point: continue a checkpoint's own pretraining on a task's unlabelled text (ULMFiT's second
stage), then fine-tune the result.

  python -m pretrain.adapt --init=runs/modernbert_tiny --workdir=runs/adapted_sst2 --task=sst2 \
      [--glue_dir=../shared/data/glue] [--labelled_only=N] [--steps=500] [--config.KEY=VALUE ...]
  python -m pretrain.adapt --init=runs/gpt2_tiny --workdir=runs/adapted --text=reviews.txt
  python -m pretrain.finetune --config=configs/glue.py:task=sst2,model=modernbert --config.init=runs/adapted_sst2

--init: a pretrain.train workdir (its config.json is the recipe: objective, model, tokenizer, batch, data
pipeline) or a Hugging Face directory (its family's config file, adaptation.FAMILY_CONFIGS, with the checkpoint's
architecture and tokenizer). The model and vocabulary are always the checkpoint's. The run: --steps steps, 10%
warm-up then linear decay, the peak at half the init recipe's peak, at most 256 sequences a batch
(pretrain/loops/adaptation.py says why); every --config.KEY=VALUE applies on top, typed as in pretrain.train
(--print_config shows the result).

--task: the sentences of the GLUE task's training split only (never dev or test), written to
WORKDIR/adaptation_text.txt; --labelled_only=N: only those of the N examples --config.data.max_train_examples=N
fine-tunes on. --text=FILE: any text file (one sentence per line, blank lines between documents) instead; a GLUE dev
or test file is refused. Neither: the --config.data.* settings (a prepared or Hub corpus).

The workdir is a pretrain.train workdir (the same command resumes) plus WORKDIR/adaptation.json: the held-out loss
on the task's text before (the init's weights, step 0) and after, and on the init's own held-out text (how much the
adaptation forgets), where its corpus can be read.
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import os
import sys

from absl import flags

from pretrain.runtime import cli, distributed, errors

CONFIG_PREFIX = "--config."

_INIT = flags.DEFINE_string("init", None, "The checkpoint to adapt: a pretrain.train workdir or a Hugging Face "
                            "directory (BERT, ModernBERT, GPT-2, T5).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the adaptation run (an existing one resumes).")
_TASK = flags.DEFINE_string("task", "", "GLUE task whose training text to adapt on (sst2, mrpc, ...).")
_GLUE_DIR = flags.DEFINE_string("glue_dir", os.environ.get("GLUE_DIR", "../shared/data/glue"),
                                "GLUE folder in the official layout (download_glue_data.py).")
_LABELLED_ONLY = flags.DEFINE_integer("labelled_only", 0, "> 0: only the text of the N training examples "
                                      "--config.data.max_train_examples=N fine-tunes on (0: the whole split).")
_TEXT = flags.DEFINE_string("text", "", "A text file to adapt on instead of --task (sentence per line, blank lines "
                            "between documents; comma-separated files or globs).")
_STEPS = flags.DEFINE_integer("steps", 500, "Training steps (the warm-up is 10% of them).")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print the resolved config and exit; nothing is written.")
flags.mark_flags_as_required(["init"])


def _set_aside(argv: list[str]) -> list[str]:
    """Takes the --config.KEY=VALUE flags out of `argv` (in place) and returns them: they apply over a config built
    from --init, which is known only once the other flags are parsed (main)."""
    kept, overrides, i = [argv[0]], [], 1
    while i < len(argv):
        arg = argv[i]
        if arg.startswith(CONFIG_PREFIX):
            overrides.append(arg)
            if "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("-"):  # --config.x VALUE
                overrides.append(argv[i + 1])
                i += 1
        else:
            kept.append(arg)
        i += 1
    argv[:] = kept
    return overrides


_OVERRIDES: list[str] = _set_aside(sys.argv) if __name__ == "__main__" else []


def _family_config(family: str):
    """A Hugging Face init's recipe: the family's config file (adaptation.FAMILY_CONFIGS), from configs/ beside
    pretrain/, as --config loads one."""
    from ml_collections import config_flags

    from pretrain.loops import adaptation
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = os.path.join(repository, adaptation.FAMILY_CONFIGS.get(family))
    own = flags.FlagValues()  # a --config of its own, loaded from `spec` as its default
    config = config_flags.DEFINE_config_file("config", spec, flag_values=own, lock_config=False, sys_argv=[""])
    own([""])
    return config.value


def _with_overrides(config, overrides: list[str]):
    """config with the --config.KEY=VALUE flags applied as pretrain.train applies them (typed by the key; an unknown
    key is one line) -> (config, the keys set)."""
    from ml_collections import config_flags
    argv = [sys.argv[0], *overrides]
    try:
        config_flags.DEFINE_config_dict("config", config, "The adaptation's config.", sys_argv=argv)
    except (AttributeError, KeyError) as e:
        name = str(e).strip("\"'")
        flag = next((a.split("=")[0] for a in overrides if name in a.split("=")[0].split(".")), "--config.?")
        print(f"error: unknown config key {flag} (no key {name!r} in the adaptation's config; --print_config lists "
              "them)", file=sys.stderr)
        sys.exit(2)
    cli.parse_flags(argv)
    given = config_flags.get_override_values(flags.FLAGS["config"])
    return flags.FLAGS["config"].value, set(given)


def main(argv: list[str]) -> None:
    cli.begin(argv)
    from pretrain.loops import adaptation
    with errors.one_line_errors():
        distributed.initialize()  # before any JAX computation (the base config evaluates the init's schedule)
        base = adaptation.base_config(_INIT.value, _STEPS.value, _family_config)
    config, overridden = _with_overrides(base, _OVERRIDES)
    if _PRINT_CONFIG.value:
        print(config.to_json_best_effort(indent=2))
        return
    workdir = cli.require_workdir(_WORKDIR)
    text = adaptation.Text(task=_TASK.value, glue_dir=_GLUE_DIR.value, labelled_only=_LABELLED_ONLY.value,
                           text=_TEXT.value)
    with errors.one_line_errors():
        report = adaptation.adapt(config, workdir, text, overridden)
    print(adaptation.summary(report) + f" ({os.path.join(workdir, adaptation.REPORT_FILE)})")


if __name__ == "__main__":
    sys.exit(cli.run(main))
