r"""Pretrains the best BERT this machine can in a fixed wall-clock budget ("Cramming", Geiping & Goldstein 2022,
at the scale of a few CPU cores).

  python -m scripts.reproduce.cram --minutes=60 --output=DIR  # corpus, tokenizer, then pretraining until the budget
  python -m scripts.reproduce.cram --steps=N --output=DIR2    # the same run, exactly N steps: bitwise, no clock
  python -m scripts.reproduce.cram --assets_only --output=DIR # the corpus and tokenizer only (configs/cram.py's sweeps)
  python -m scripts.reproduce.cram --minutes=20 --output=DIR3 --corpus=DIR/corpus.txt --tokenizer=DIR/spm.model \
      --config=configs/t5.py:size=tiny --set data.source=text   # another family or arm on the same assets

What it does, in order:
  1. DIR/corpus.txt: pretrain.tools.build_corpus with every source (its statistics in DIR/corpus.json), once
     (--corpus: an existing one instead).
  2. DIR/spm.model: a SentencePiece vocabulary of --vocab_size pieces on it, once (--tokenizer: an existing one).
  3. The recipe (--config, by default configs/cram.py:recipe=best, what the sweeps of docs/cram.md chose) runs for
     --minutes (config.budget_minutes): a few steps timed on this machine fix the steps that fit the rest of the
     budget, and the schedule (warm-up, decay to 0) is laid over exactly those steps (pretrain/loops/budget.py).
     Corpus and tokenizer are outside the budget, as in Cramming; the timing steps, the set-up and the final
     checkpoint are inside, the held-out evaluations along the run are not.
  4. DIR/<model> (DIR/bert, DIR/modernbert, DIR/t5, ...): an ordinary pretrain.train workdir (config.json,
     budget.json, checkpoints/, metrics.jsonl). Should the machine slow down, the run saves and stops at the
     budget anyway; the same command resumes it and finishes the schedule.
  5. DIR/cram.json: budget, step time, steps planned and reached, held-out losses, wall times, and the
     `--steps=N` command that reproduces the run.

`--set KEY=VALUE` (repeatable) overrides a key of the pretraining config, as --config.KEY=VALUE does for
pretrain.train: the recipe trials of docs/cram.md are such overrides.
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on a signal is one line and an exit status
    stops.answer_from_start()

import argparse
import json
import os
import sys
import time

from configs import common
from pretrain.tools import build_corpus, train_tokenizer

# docs/cram.md: the measurements that chose it. At 60 minutes the 4 x 256 model won (held-out 3.47 against
# 2 x 128's 3.90); make demo's 1,200 steps keep recipe=best's 2 x 128, the winner at 20 minutes.
CONFIG = "configs/cram.py:recipe=best,size=4x256"


def build_assets(output: str, args) -> tuple[str, str]:
    """DIR/corpus.txt and DIR/spm.model, built once (outside the budget), or --corpus and --tokenizer."""
    if args.corpus and args.tokenizer:
        return os.path.abspath(args.corpus), os.path.abspath(args.tokenizer)
    corpus, prefix = os.path.join(output, "corpus.txt"), os.path.join(output, "spm")
    if not os.path.exists(corpus):
        stats = build_corpus.build_corpus(corpus + ".partial", tuple(args.sources), glue_dir=args.glue_dir,
                                          cache=os.path.join(output, "sources"),
                                          repeats=build_corpus.parse_repeats(args.repeat))
        os.replace(corpus + ".partial", corpus)
        stats["path"] = corpus
        with open(os.path.join(output, "corpus.json"), "w") as f:
            json.dump(stats, f, indent=1)
        print(build_corpus.statistics_line(stats), flush=True)
    if not os.path.exists(prefix + ".model"):
        train_tokenizer.train_sentencepiece(corpus, prefix, vocab_size=args.vocab_size)
    return corpus, prefix + ".model"


def pretraining_config(args, corpus: str, spm: str):
    """The --config with the corpus, the tokenizer and --set's overrides, its steps fitted to --minutes
    (config.budget_minutes) or replayed at --steps (config.budget_steps): pretrain/loops/budget.py stretches the
    config's schedule to them."""
    try:
        config = common.load(args.config)
    except ValueError as e:
        raise SystemExit(f"error: --config: {e}") from None
    config.data.path, config.tokenizer.path = corpus, spm
    for item in args.set:
        try:
            common.apply_setting(config, item)
        except ValueError as e:
            raise SystemExit(f"error: --set {item}: {e} (write it as KEY=VALUE, the value of the key's type)") from None
        except (KeyError, AttributeError):
            raise SystemExit(f"error: --set {item}: the pretraining config has no key {item.partition('=')[0]!r} "
                             f"(python -m pretrain.train --config={args.config} --print_config lists them)")
    config.budget_minutes, config.budget_steps = float(args.minutes or 0.0), args.steps or 0
    return config


def check_arguments(args) -> None:
    """A bad --config, --set or --repeat stops here with one line."""
    pretraining_config(args, "", "")
    try:
        build_corpus.parse_repeats(args.repeat)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def last_metrics(workdir: str) -> tuple[int, dict, dict]:
    """(last step logged, its training window's metrics, the last held-out evaluation's) from metrics.jsonl; the
    training metrics' step_time_sec is the mean over every window but the first (which holds the compilation)."""
    train, held_out, step_times = {}, {}, []
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for record in map(json.loads, filter(str.strip, f)):
            is_eval = any(k.startswith("eval_") for k in record)
            (held_out if is_eval else train).update(record)
            step_times += [record["step_time_sec"]] if "step_time_sec" in record else []
    train["step_time_sec"] = sum(step_times[1:]) / max(len(step_times) - 1, 1)
    return int(train.get("step", 0)), train, held_out


def reproduce_command(parser, args, steps: int) -> str:
    """The command that runs the same steps again: --steps=N and every option given a non-default value."""
    words = ["python -m scripts.reproduce.cram", f"--steps={steps}", "--output=DIR"]
    for name, value in vars(args).items():
        if name in ("minutes", "steps", "output") or value == parser.get_default(name):
            continue
        if name in ("set", "repeat"):  # repeatable options
            words += [f"--{name} {item}" for item in value]
        else:
            words.append(f"--{name} " + " ".join(map(str, value)) if isinstance(value, list) else f"--{name}={value}")
    return " ".join(words)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="directory of the corpus, tokenizer, bert/ and cram.json")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--minutes", type=float, help="wall-clock budget of the pretraining")
    budget.add_argument("--steps", type=int, help="exactly this many steps, no budget (reproduces a budget run)")
    budget.add_argument("--assets_only", action="store_true",
                        help="the corpus and the tokenizer only (what configs/cram.py's sweeps read)")
    parser.add_argument("--config", default=CONFIG, help="a config file and its arguments, as pretrain.train's")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--sources", nargs="+", choices=build_corpus.SOURCES, default=list(build_corpus.SOURCES))
    parser.add_argument("--glue_dir", default=build_corpus.GLUE_DIR)
    parser.add_argument("--repeat", action="append", default=[], metavar="SOURCE=N",
                        help="write that corpus source N times (pretrain.tools.build_corpus)")
    parser.add_argument("--corpus", default="", help="an existing corpus (with --tokenizer): no corpus is built")
    parser.add_argument("--tokenizer", default="", help="an existing SentencePiece model (with --corpus)")
    return parser


def main(argv=None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    output = os.path.abspath(args.output)
    os.makedirs(output, exist_ok=True)

    from pretrain.loops import budget, pretraining
    from pretrain.runtime import cli, compilation_cache
    from pretrain.runtime.errors import (
        EXIT_PREEMPTED,
        Preempted,
        StoppedAfterLastStep,
        StoppedBeforeFirstStep,
        UserError,
    )
    compilation_cache.enable()

    check_arguments(args)  # before minutes of corpus building
    started = time.time()
    corpus, spm = build_assets(output, args)
    assets_sec = time.time() - started
    if args.assets_only:
        print(f"Corpus {corpus}, tokenizer {spm} ({assets_sec:.0f} s)")
        return 0
    record_path = os.path.join(output, "cram.json")
    record = {}
    if os.path.exists(record_path):
        with open(record_path) as f:
            record = json.load(f)
    config = pretraining_config(args, corpus, spm)
    workdir = os.path.join(output, config.model.name)
    budget_start = time.time()
    stopped_by, budget_step = "schedule", None
    try:
        pretraining.train_and_evaluate(config, workdir)  # a budget run resumes its plan (pretrain/loops/budget.py)
    except StoppedBeforeFirstStep as e:  # SIGTERM while setting up: one line and 75, as pretrain.train
        cli.exit_now(str(e), EXIT_PREEMPTED)
    except StoppedAfterLastStep as e:  # a SIGTERM after the last step: the run finished its saves first
        print(e, file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    except Preempted as e:
        if e.reason != "time budget reached":  # a SIGTERM's checkpoint: the same command resumes it
            print(e, file=sys.stderr, flush=True)
            return EXIT_PREEMPTED
        stopped_by = "time budget (the same command finishes the schedule)"
        budget_step = e.step
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plan = budget.read_plan(workdir) or {}
    steps = plan.get("planned_steps", args.steps)
    record.update(config=args.config, overrides=args.set, vocab_size=args.vocab_size, minutes=args.minutes,
                  planned_steps=steps, assets_sec=assets_sec, workdir=workdir,
                  **{k: plan[k] for k in ("timed_step_sec", "setup_sec", "calibration_sec") if k in plan})
    reached, train, held_out = last_metrics(workdir)
    reached = budget_step or reached  # the last window logged may end before the step the budget stopped at
    record.update(reached_steps=reached, stopped_by=stopped_by, pretraining_sec=time.time() - budget_start,
                  step_time_sec=train["step_time_sec"], train=train, eval=held_out,
                  reproduce=reproduce_command(parser, args, steps))
    with open(record_path, "w") as f:
        json.dump(record, f, indent=1)
    print(f"Pretrained {record['reached_steps']:,} of {steps:,} steps in {record['pretraining_sec'] / 60:.1f} min "
          f"(stopped by the {stopped_by}); held-out: " +
          ", ".join(f"{k}={v:.4g}" for k, v in record["eval"].items() if isinstance(v, float)) +
          f"; {workdir}; reproduce: {record['reproduce']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
