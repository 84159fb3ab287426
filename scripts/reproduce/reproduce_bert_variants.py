"""BERT's variants at equal budget, in miniature: masked LM (BERT), replaced-token detection (ELECTRA) and shared
layers with factorised embeddings (ALBERT), each pretrained for the same wall-clock minutes on this machine, then
fine-tuned on GLUE over seeds with one recipe; random weights are the control. Beside them, distillation: a
1-layer student distilled from the MLM arm (its teacher: every other layer, soft targets, DistilBERT's loss) and
the same 1-layer BERT pretrained from scratch, each for the same minutes.

The papers' versions (GLUE dev):
  ELECTRA  Clark et al. 2020, Table 1: at equal pretraining compute (1.4e18 FLOPs, one GPU for four days),
           ELECTRA-Small 79.9 against BERT-Small 75.1; Table 8: ELECTRA-Base 85.1 against BERT-Base 82.2.
  ALBERT   Lan et al. 2020, Table 2: ALBERT-base (12M parameters) averages 80.1 over its five tasks against
           BERT-base (108M) 82.3, at the same steps: sharing trades accuracy for parameters, not compute.
  DistilBERT  Sanh et al. 2019, Table 1: the 6-layer student 77.0 against its teacher BERT-Base 79.5 (GLUE
           macro-score); no from-scratch student row (their ablation, Table 4: random init costs 3.7 points).
Here: the tiny configs (2 layers, hidden 128) on `make demo`'s corpus. Each arm pretrains for --minutes of wall
clock (config.budget_minutes plans its steps from its own measured step time, so an ELECTRA step, which
runs a generator too, buys fewer steps); each arm keeps its paper's masking (BERT: make cram's 40%, ELECTRA 15%
with 85% [MASK], ALBERT 15% in n-grams of up to 3 words + sentence order), and all share batch 32 x 128, lr 1e-3
and no dropout. The fine-tuning is scripts/reproduce/glue_study.py's: the same flags for every init, the learning
rate chosen on dev.

  python -m scripts.reproduce.reproduce_bert_variants --minutes 10 --parallel 2 --seeds 0 1 2 --tasks sst2-1k mrpc cola
  python -m scripts.reproduce.reproduce_bert_variants --minutes 1 --quick       # the pipeline, minutes in all
"""
from __future__ import annotations

import argparse
import json
import os

from scripts.reproduce import glue_study
from scripts.reproduce import reproduction as rp

BUDGET = ["--config.batch_size=32", "--config.optimizer.learning_rate=0.001", "--config.model.dropout_rate=0.0",
          "--config.model.attention_dropout_rate=0.0", "--config.data.max_seq_length=128",
          "--config.model.vocab_size=8000"]
ARMS = {  # arm -> (config, its flags besides the budget's; {mlm}: the mlm arm's workdir, the students' teacher)
    "mlm": ("configs/bert.py:size=tiny,recipe=cram,nsp=False", []),
    "electra": ("configs/electra.py:size=tiny", []),
    "albert": ("configs/albert.py:size=tiny", []),
    "distilled": ("configs/distil.py:size=tiny", ["--config.distillation.teacher={mlm}"]),
    "student_scratch": ("configs/bert.py:size=tiny,recipe=cram,nsp=False", ["--config.model.num_layers=1"]),
}
PAPER = ("ELECTRA-Small 79.9 vs BERT-Small 75.1 at equal compute (Clark et al. 2020, Table 1); ALBERT-base 80.1 vs "
         "BERT-base 82.3 at equal steps (Lan et al. 2020, Table 2); DistilBERT 77.0 vs its teacher BERT-Base 79.5 "
         "(Sanh et al. 2019, Table 1)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    glue_study.add_flags(parser, "runs/reproduce_bert_variants")
    parser.add_argument("--minutes", type=float, default=10.0, help="each arm's pretraining budget (wall clock)")
    parser.add_argument("--steps", type=int, default=0, help="instead of --minutes: this many steps per arm")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--corpus", default="", help="pretraining text (default: make demo's, built in --output)")
    parser.add_argument("--tokenizer", default="", help="SentencePiece model (default: make demo's, built too)")
    parser.add_argument("--quick", action="store_true", help="seed 0, SST-2 1k only, 40 pretraining steps")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.seeds, args.tasks, args.learning_rates = args.steps or 40, [0], ["sst2-1k"], [3e-4]
    args.minutes = 0.0 if args.steps else args.minutes
    return args


def pretrained_workdir(args, arm: str) -> str:
    """Where an arm's pretrain.train workdir will be (rp.Reproduction.pretrained, known before the run)."""
    return os.path.join(os.path.abspath(args.output), f"pretrain_{arm}")


def arm_flags(args, arm: str) -> list[str]:
    if arm in ("distilled",) and "mlm" not in args.arms:
        raise SystemExit("error: --arms distilled needs the mlm arm, its teacher")
    return [flag.format(mlm=pretrained_workdir(args, "mlm")) for flag in ARMS[arm][1]]


def steps_reached(workdir: str) -> int:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return max(json.loads(line).get("step", 0) for line in f if line.strip())


def main() -> None:
    args = parse_args()
    corpus, spm = rp.demo_assets(args)
    budget = f"steps={args.steps}" if args.steps else f"minutes={args.minutes:g}"
    inits = {arm: [f"--config.init={pretrained_workdir(args, arm)}"] for arm in args.arms}
    inits["random"] = [f"--config.init={pretrained_workdir(args, args.arms[0])}", "--config.init_weights=random"]
    study = glue_study.GlueStudy(args, inits, [budget, corpus, spm, *BUDGET])
    run = study.harness  # one sweep directory: pretraining cells, then the study's fine-tuning cells

    assets = [f"--config.data.path={corpus}", f"--config.tokenizer.path={spm}", *BUDGET]
    steps = [f"--config.num_train_steps={args.steps}", f"--config.optimizer.warmup_steps={max(1, args.steps // 10)}"]
    pretraining = {arm: run.pretrain_cell(arm, ARMS[arm][0], assets + arm_flags(args, arm) + (steps if args.steps else []))
                   for arm in args.arms}
    assert all(run.pretrained(cell) == pretrained_workdir(args, arm) for arm, cell in pretraining.items())
    students = [cell for arm, cell in pretraining.items() if arm == "distilled"]  # after their teacher
    run.run_pretraining([cell for cell in pretraining.values() if cell not in students])
    run.run_pretraining(students)
    scores = study.run()

    rows = [[arm, str(steps_reached(run.pretrained(cell))), _loss(run, cell)] for arm, cell in pretraining.items()]
    print(f"\nPretraining: {run.pretraining_text(args.steps)} on {os.path.basename(corpus)}\n")
    print(rp.markdown(["arm", "steps", "held-out loss (its own task: not comparable across arms)"], rows))
    print("\n" + study.table(scores))
    print(f"\nPaper: {PAPER}.")
    print("\n" + study.footer())


def _loss(run: rp.Reproduction, cell) -> str:
    value = run.last_metric(cell, "eval_loss")
    return f"{value:.3f}" if value == value else "—"


if __name__ == "__main__":
    main()
