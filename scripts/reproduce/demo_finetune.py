"""The fine-tuning half of `make demo`: ULMFiT's three stages against their control, on SST-2 with 1,000 labels.

  python -m scripts.reproduce.demo_finetune --init demo_out/pretrained --adapted demo_out/adapted \
      --glue_dir ../shared/data/glue --output demo_out/glue --parallel 2

Rows, each fine-tuned with the same recipe on 1,000 labels (900 trained on, 100 held out to pick the best epoch;
dev is only the test) (scripts/reproduce/glue_study.py) over --seeds:
  random      random weights of the demo model's architecture and tokenizer: the control, what pretraining must beat
  pretrained  the general pretraining (stage 1)
  adapted     the same checkpoint after domain adaptation on SST-2's unlabelled training sentences (stage 2,
              python -m pretrain.adapt), when --adapted is given

Each row is the mean over seeds with its 95% interval (Student's t), and each pretrained row's difference from random
with the interval of the difference (Welch): a difference whose interval holds 0 is no evidence either way. Without
GLUE data it says in one line what it skipped and exits 0, so that the rest of the demo stands.
"""
from __future__ import annotations

import argparse
import os
import sys

from scripts.bench import intervals
from scripts.reproduce import glue_study

# The fine-tuning recipe of every row: mean pooling (MLM never trains the [CLS] position's output: docs/transfer.md's
# probe; new checkpoints say mean themselves, the flag keeps older ones on the same recipe), ULMFiT's discriminative
# rates (each layer 2.6 times slower than the one above) and slanted triangular schedule at 3e-3, the rate the
# pretrained and adapted checkpoints chose on the carved validation split (random weights tied 1e-3 and 3e-3 there).
# Each run's best epoch is chosen on a tenth of its 1,000 labels held out (glue_study.validation_size).
RECIPE = ["--config.model.classifier_pooling=mean", "--config.discriminative_factor=2.6",
          "--config.optimizer.schedule=slanted_triangular"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init", required=True, help="the pretrain.train workdir to fine-tune")
    parser.add_argument("--adapted", default="", help="its domain-adapted workdir (python -m pretrain.adapt)")
    glue_study.add_flags(parser, "demo_out/glue", seeds=(0, 1, 2))
    parser.set_defaults(tasks=["sst2-1k"], learning_rates=[3e-3])
    args = parser.parse_args()
    found = [t for t in args.tasks
             if os.path.isdir(os.path.join(args.glue_dir, glue_study.glue.get_task(glue_study.TASKS[t][0]).directory))]
    if not found:
        print(f"Skipped GLUE fine-tuning: no {', '.join(args.tasks)} data in --glue_dir={args.glue_dir or '(unset)'}; "
              "give a folder in the official GLUE layout to fine-tune the demo model.")
        return 0
    args.tasks = found
    init = os.path.abspath(args.init)
    rows = {"random": [f"--config.init={init}", "--config.init_weights=random"],
            "pretrained": [f"--config.init={init}"]}
    if args.adapted:
        rows["adapted"] = [f"--config.init={os.path.abspath(args.adapted)}"]
    model = glue_study.model_of(init)
    study = glue_study.GlueStudy(args, {name: flags + RECIPE for name, flags in rows.items()},
                                 settings=[init, args.adapted], models={name: model for name in rows},
                                 carve_validation=True)
    print(f"Fine-tuning {', '.join(rows)} on {', '.join(found)} (seeds {args.seeds}), into "
          f"{os.path.abspath(args.output)}", flush=True)
    scores = study.run()
    print("\n" + report(scores, list(rows), found, args.seeds))
    print("\n" + study.footer())
    return 0


def report(scores: dict[tuple[str, str], list[float]], rows: list[str], tasks: list[str], seeds: list[int]) -> str:
    """A line per row and task (mean, 95% interval), then each pretrained row against random in a sentence."""
    lines = [f"Dev accuracy x100, mean ± the 95% interval's half-width over seeds {seeds}:"]
    for task in tasks:
        for row in rows:
            values = ", ".join(f"{v:.1f}" for v in scores[row, task])
            lines.append(f"  {task:8} {row:11} {intervals.format_interval(scores[row, task]):>14}   ({values})")
        for row in rows[1:]:
            lines.append("  " + intervals.verdict(row, "random", scores[row, task], scores["random", task]))
    lines.append("Random weights are the control: a checkpoint has helped only where its interval lies above 0. A few "
                 "minutes of pretraining a 1.3M-parameter model teach it little that 900 labels do not teach random "
                 "weights as fast; docs/transfer.md measures it with 5 seeds over 2 pretraining runs.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
