"""The fine-tuning half of `make demo`: the demo model and random weights of its architecture, side by side, on the
GLUE tasks in --glue_dir; then the table with both rows and their difference.

  python -m scripts.reproduce.demo_finetune --init demo_out/pretrained --glue_dir ../shared/data/glue \
      --output demo_out/glue

Each task is fine-tuned twice with the same recipe (scripts/reproduce/glue_study.py), once from the checkpoint and once
from `--config.init_weights=random` (the same architecture and tokenizer, fresh weights): the second row is
what the pretraining has to beat. Without GLUE data it says in one line what it skipped and exits 0, so that
the rest of the demo stands.
"""
from __future__ import annotations

import argparse
import os
import sys

from scripts.reproduce import glue_study


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init", required=True, help="the pretrain.train workdir to fine-tune")
    glue_study.add_flags(parser, "demo_out/glue", seeds=(0,))
    parser.set_defaults(tasks=["sst2-1k", "cola", "mrpc", "wnli"], learning_rates=[1e-4])
    args = parser.parse_args()
    found = [t for t in args.tasks
             if os.path.isdir(os.path.join(args.glue_dir, glue_study.glue.get_task(glue_study.TASKS[t][0]).directory))]
    if not found:
        print(f"Skipped GLUE fine-tuning: no GLUE data in --glue_dir={args.glue_dir or '(unset)'}; give a folder in "
              "the official GLUE layout to fine-tune the demo model.")
        return 0
    args.tasks = found
    init = os.path.abspath(args.init)
    model = glue_study.model_of(init)
    study = glue_study.GlueStudy(args, {"pretrained": [f"--config.init={init}"],
                                        "random": [f"--config.init={init}", "--config.init_weights=random"]},
                                 settings=[init], models={"pretrained": model, "random": model})
    print(f"Fine-tuning the demo model and random weights of its architecture on {', '.join(found)} "
          f"(seeds {args.seeds}), into {os.path.abspath(args.output)}", flush=True)
    print("\n" + study.table(study.run()))
    print("\n" + study.footer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
