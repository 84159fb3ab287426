r"""Pretrains the best BERT this machine can in a fixed wall-clock budget ("Cramming", Geiping & Goldstein 2022,
at the scale of a few CPU cores).

  python -m scripts.reproduce.cram --minutes=60 --output=DIR  # corpus, tokenizer, then pretraining until the budget
  python -m scripts.reproduce.cram --steps=N --output=DIR2    # the same run, exactly N steps: bitwise, no clock
  python -m scripts.reproduce.cram --minutes=20 --output=DIR3 --corpus=DIR/corpus.txt --tokenizer=DIR/spm.model \
      --config=configs/t5.py:size=tiny --set data.source=text   # another family or arm on the same assets

What it does, in order:
  1. DIR/corpus.txt: pretrain.tools.build_corpus with every source (its statistics in DIR/corpus.json), once
     (--corpus: an existing one instead).
  2. DIR/spm.model: a SentencePiece vocabulary of --vocab_size pieces on it, once (--tokenizer: an existing one).
  3. The recipe (--config, by default configs/bert.py:size=tiny,recipe=cram,nsp=False) is timed for a few
     steps on this machine; from that step time the number of steps that fit the rest of the budget is fixed,
     and the schedule (warm-up, decay to 0) is laid over exactly those steps. Corpus and tokenizer are outside
     the budget, as in Cramming; the timing steps, the set-up, the evaluation and the final checkpoint are inside.
  4. DIR/bert (DIR/t5, DIR/gpt for those configs): an ordinary pretrain.train workdir (config.json,
     checkpoints/, metrics.jsonl). Should the machine slow down, the run saves and stops at the budget anyway;
     the same command resumes it.
  5. DIR/cram.json: budget, step time, steps planned and reached, held-out losses, wall times, and the
     `--steps=N` command that reproduces the run.

`--set KEY=VALUE` (repeatable) overrides a key of the pretraining config, as --config.KEY=VALUE does for
pretrain.train: the recipe trials of docs/cram.md are such overrides.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from configs import common
from pretrain.tools import build_corpus, train_tokenizer

CONFIG = "configs/bert.py:size=tiny,recipe=cram,nsp=False"  # docs/cram.md: the measurements that chose it
CALIBRATION_STEPS = 80       # timed from step 30 on: the first windows hold the compilation and batches built
                             # ahead during it, faster than the steady state where batch building shares the cores
SAFETY = 0.97                # of the remaining budget: the steps planned leave this much slack for noise


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


def pretraining_config(args, corpus: str, spm: str, steps: int):
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
    config.num_train_steps = steps
    config.optimizer.warmup_steps = max(1, round(args.warmup_fraction * steps))
    config.checkpoint_every = steps  # the final checkpoint (a budget stop saves its own)
    return config


def check_arguments(args) -> None:
    """A bad --config, --set or --repeat stops here with one line."""
    pretraining_config(args, "", "", 1)
    try:
        build_corpus.parse_repeats(args.repeat)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def time_steps(args, corpus: str, spm: str, directory: str) -> tuple[float, float]:
    """(seconds per step, seconds of set-up and compilation) of the recipe on this machine, from a short run."""
    from pretrain.loops import pretraining
    shutil.rmtree(directory, ignore_errors=True)
    config = pretraining_config(args, corpus, spm, CALIBRATION_STEPS)
    config.log_every, config.data.eval_documents = 10, 0
    started = time.time()
    pretraining.train_and_evaluate(config, directory)
    wall = time.time() - started
    with open(os.path.join(directory, "metrics.jsonl")) as f:
        windows = [json.loads(line) for line in f]
    step_times = [w["step_time_sec"] for w in windows if w.get("step", 0) > 30 and "step_time_sec" in w]
    step_time = sum(step_times) / len(step_times)
    shutil.rmtree(directory, ignore_errors=True)
    return step_time, wall - CALIBRATION_STEPS * step_time


def plan_steps(budget_left: float, step_time: float, setup: float) -> int:
    """The steps that fit: what is left of the budget, less one more set-up (the real run loads the corpus and
    compiles again, from the compilation cache where it can), with SAFETY's slack."""
    return max(1, int(SAFETY * (budget_left - setup) / step_time))


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
    parser.add_argument("--config", default=CONFIG, help="a config file and its arguments, as pretrain.train's")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--warmup_fraction", type=float, default=0.1, help="of the steps, linear warm-up")
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

    from pretrain.loops import pretraining
    from pretrain.runtime import cli, compilation_cache
    from pretrain.runtime.errors import EXIT_PREEMPTED, Preempted, StoppedBeforeFirstStep, UserError
    compilation_cache.enable()

    check_arguments(args)  # before minutes of corpus building
    started = time.time()
    corpus, spm = build_assets(output, args)
    assets_sec = time.time() - started
    record_path = os.path.join(output, "cram.json")
    record = json.load(open(record_path)) if os.path.exists(record_path) else {}
    budget_start = time.time()
    deadline = None
    if args.steps:
        steps = args.steps
    elif record.get("planned_steps"):  # a resumed budget run keeps its schedule
        steps, deadline = record["planned_steps"], budget_start + 60 * args.minutes
    else:
        deadline = budget_start + 60 * args.minutes
        step_time, setup = time_steps(args, corpus, spm, os.path.join(output, "timing"))
        steps = plan_steps(deadline - time.time(), step_time, setup)
        record.update(timed_step_sec=step_time, setup_sec=setup)
        print(f"Timed {step_time:.3f} s/step (set-up {setup:.0f} s): {steps:,} steps fit the "
              f"{args.minutes:g}-minute budget", flush=True)
    record.update(config=args.config, overrides=args.set, warmup_fraction=args.warmup_fraction,
                  vocab_size=args.vocab_size, minutes=args.minutes, planned_steps=steps, assets_sec=assets_sec)
    with open(record_path, "w") as f:
        json.dump(record, f, indent=1)

    config = pretraining_config(args, corpus, spm, steps)
    workdir = os.path.join(output, config.model.name)
    stopped_by, budget_step = "schedule", None
    try:
        pretraining.train_and_evaluate(config, workdir, deadline)
    except StoppedBeforeFirstStep as e:  # SIGTERM while setting up: one line and 75, as pretrain.train
        cli.exit_now(str(e), EXIT_PREEMPTED)
    except Preempted as e:
        if e.reason != "time budget reached":  # a SIGTERM's checkpoint: the same command resumes it
            print(e, file=sys.stderr, flush=True)
            return EXIT_PREEMPTED
        stopped_by = "time budget (the same command finishes the schedule)"
        budget_step = e.step
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
