"""BERT's ablation of its pretraining tasks (Devlin et al. 2019, Table 5) in miniature: the same tiny BERT
pretrained with MLM + next sentence prediction and with MLM alone, then fine-tuned the same way.

Table 5 (dev sets, BERT-Base; the paper's numbers):
                   MNLI-m (acc)  QNLI (acc)  MRPC (acc)  SST-2 (acc)  SQuAD (F1)
  BERT-Base            84.4         88.4        86.7        92.7         88.5
  No NSP               83.9         84.9        86.5        92.6         87.9
Of these tasks MRPC and SST-2 are on this machine (../shared/data/glue); the others are printed from the
paper only. Here: configs/bert.py:size=tiny with nsp=True and nsp=False on `make demo`'s corpus, the same
steps, batch and seed; then MRPC and SST-2 (8,000 training examples) fine-tuned from each, lr 1e-4 (the
tiny model's rate in the README's demo), 3 epochs, over seeds.

  python -m scripts.reproduce.reproduce_bert_nsp            # 2 pretrainings x 2 tasks x 3 seeds
  python -m scripts.reproduce.reproduce_bert_nsp --quick --parallel 2
      # fewer steps and examples, seed 0 (8.6 min, 2 idle cores)
  python -m scripts.reproduce.reproduce_bert_nsp --minutes 20 --parallel 2
      # each arm: 20 minutes of make cram's recipe
"""
from __future__ import annotations

import argparse
import os

from scripts.reproduce import reproduction as rp

ARMS = {"nsp": "configs/bert.py:size=tiny,nsp=True", "no_nsp": "configs/bert.py:size=tiny,nsp=False"}
PAPER = {"nsp": {"mnli": 84.4, "qnli": 88.4, "mrpc": 86.7, "sst2": 92.7, "squad": 88.5},
         "no_nsp": {"mnli": 83.9, "qnli": 84.9, "mrpc": 86.5, "sst2": 92.6, "squad": 87.9}}
TASKS = ("mrpc", "sst2")  # the Table 5 tasks with data here; accuracy is the paper's metric for both


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_common_flags(parser, "runs/reproduce_bert_nsp")
    args = parser.parse_args()
    steps, examples, epochs, seeds = (300, 4000, 2, [0]) if args.quick else (1200, 8000, 3, [0, 1, 2])
    corpus, spm = rp.demo_assets(args)
    run = rp.Reproduction(args, [f"steps={steps}", f"examples={examples}", f"epochs={epochs}", corpus, spm])

    assets = [f"--config.data.path={corpus}", f"--config.tokenizer.path={spm}", f"--config.num_train_steps={steps}"]
    recipe = ",recipe=cram" if args.minutes else ""  # a budget run pretrains with make cram's recipe
    pretraining = {arm: run.pretrain_cell(arm, config + recipe, assets) for arm, config in ARMS.items()}
    run.run_pretraining(list(pretraining.values()))

    shared = [f"--config.data.glue_dir={os.path.abspath(args.glue_dir)}", f"--config.num_epochs={epochs}",
              "--config.optimizer.learning_rate=1e-4", "--config.write_test_predictions=False"]
    cells = {(arm, task): [run.finetune_cell(arm, task, seed, f"configs/glue.py:task={task}",
                                             shared + [f"--config.init={run.pretrained(pre)}",
                                                       f"--config.data.max_train_examples={examples}"])
                           for seed in seeds]
             for arm, pre in pretraining.items() for task in TASKS}
    run.run([cell for group in cells.values() for cell in group])

    rows = []
    for arm, pre in pretraining.items():
        ours = {task: [run.results(c)["metrics"]["dev"]["accuracy"] for c in cells[arm, task]] for task in TASKS}
        paper = PAPER[arm]
        rows.append([{"nsp": "MLM + NSP", "no_nsp": "MLM only (No NSP)"}[arm],
                     *(rp.mean_std(ours[t]) for t in TASKS), f"{run.last_metric(pre, 'eval_mlm_accuracy'):.3f}",
                     *(f"{paper[t]:.1f}" for t in ("mnli", "qnli", "mrpc", "sst2", "squad"))])
    print(f"\nDev accuracy x100, ours: mean ± std over seeds {seeds} (SST-2: {examples} training examples; "
          f"{epochs} epochs), after {run.pretraining_text(steps)} on {os.path.basename(corpus)}; "
          "paper: BERT-Base, Table 5.\n")
    print(rp.markdown(["pretraining", "ours MRPC", "ours SST-2", "ours held-out MLM acc", "paper MNLI-m",
                       "paper QNLI", "paper MRPC", "paper SST-2", "paper SQuAD F1"], rows))
    nsp = {t: sum(run.results(c)["metrics"]["dev"]["accuracy"] for c in cells["nsp", t]) for t in TASKS}
    no = {t: sum(run.results(c)["metrics"]["dev"]["accuracy"] for c in cells["no_nsp", t]) for t in TASKS}
    print("\nNSP - no NSP, ours: " + ", ".join(f"{t} {100 * (nsp[t] - no[t]) / len(seeds):+.1f}" for t in TASKS)
          + "; paper: " + ", ".join(f"{t} {PAPER['nsp'][t] - PAPER['no_nsp'][t]:+.1f}" for t in TASKS))
    print("\n" + run.footer())


if __name__ == "__main__":
    main()
