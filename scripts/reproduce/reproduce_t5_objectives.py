"""T5's comparison of pretraining objectives (Raffel et al. 2020, Section 3.3) in miniature: the same tiny T5,
corpus and number of steps for each objective, then the same text-to-text fine-tuning; the ranking of ours
beside the paper's.

The paper's numbers (GLUE average on dev, T5-Base pretrained 2^35 tokens on C4, fine-tuned on each task):
  BERT-style (15% of tokens: 90% -> mask, 10% -> random; target = the original text)   82.96  Table 4
  prefix language modeling (a random split: prefix -> rest)                            80.69  Table 4
  i.i.d. denoising, replace corrupted spans (15% of tokens, each noise run -> sentinel) 83.28  Tables 5, 7
  span corruption (15% of tokens in spans of mean length 3)                            83.49  Table 7
Here: configs/t5.py:size=tiny with objective.mode = bert_style | prefix_lm | iid_denoising | span_corruption
(objectives/denoising.py) on `make demo`'s corpus, the same steps and seed for each; then SST-2 as text to
text (configs/glue.py:task=sst2,model=t5; Adafactor, constant lr 1e-3) over seeds, dev accuracy. Kendall's
tau-b compares the two rankings (1: the same order; tied scores share their mean rank).

  python -m scripts.reproduce.reproduce_t5_objectives            # 4 objectives x 3 seeds
  python -m scripts.reproduce.reproduce_t5_objectives --quick --parallel 2
      # seed 0, fewer steps (10.9 min, 2 idle cores)
  python -m scripts.reproduce.reproduce_t5_objectives --minutes 20 --parallel 2
      # each objective pretrains for 20 minutes
"""
from __future__ import annotations

import argparse
import os

import numpy as np
from scipy import stats

from scripts.reproduce import reproduction as rp

OBJECTIVES = {  # arm -> (label, objective flags, paper GLUE average, paper table)
    "bert_style": ("BERT-style MLM", ["--config.objective.mode=bert_style"], 82.96, "Table 4"),
    "prefix_lm": ("prefix LM", ["--config.objective.mode=prefix_lm"], 80.69, "Table 4"),
    "iid": ("i.i.d. denoising (replace spans)", ["--config.objective.mode=iid_denoising",
                                                 "--config.objective.corruption=replace_spans"], 83.28, "Table 5"),
    "span": ("span corruption (mean length 3)", ["--config.objective.mode=span_corruption"], 83.49, "Table 7"),
}


def ranks(values: list[float]) -> list[float]:
    """1 = the highest; tied values share their mean rank (scipy's rankdata)."""
    return [float(r) for r in stats.rankdata([-v for v in values], method="average")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_common_flags(parser, "runs/reproduce_t5_objectives")
    args = parser.parse_args()
    # --quick: 64-token inputs; BERT-style and prefix LM decode the whole text (64 targets, not span
    # corruption's 17), which makes their steps several times dearer than span corruption's.
    steps, length, examples, epochs, seeds = ((200, 64, 4000, 2, [0]) if args.quick else
                                              (600, 128, 8000, 3, [0, 1, 2]))
    corpus, spm = rp.demo_assets(args)
    run = rp.Reproduction(args, [f"steps={steps}", f"length={length}", f"examples={examples}", f"epochs={epochs}",
                                 corpus, spm])

    assets = ["--config.data.source=text", f"--config.data.path={corpus}", f"--config.tokenizer.path={spm}",
              f"--config.num_train_steps={steps}", f"--config.data.max_seq_length={length}"]
    pretraining = {arm: run.pretrain_cell(arm, "configs/t5.py:size=tiny", assets + flags)
                   for arm, (_, flags, _, _) in OBJECTIVES.items()}
    run.run_pretraining(list(pretraining.values()))

    shared = [f"--config.data.glue_dir={os.path.abspath(args.glue_dir)}",
              f"--config.data.max_train_examples={examples}", f"--config.num_epochs={epochs}",
              "--config.data.max_seq_length=64", "--config.write_test_predictions=False"]
    cells = {arm: [run.finetune_cell(arm, "sst2", seed, "configs/glue.py:task=sst2,model=t5",
                                     shared + [f"--config.init={run.pretrained(pre)}"]) for seed in seeds]
             for arm, pre in pretraining.items()}
    run.run([cell for group in cells.values() for cell in group])

    ours = {arm: [run.results(c)["metrics"]["dev"]["accuracy"] for c in group] for arm, group in cells.items()}
    means = [float(np.mean(ours[arm])) for arm in OBJECTIVES]
    paper = [OBJECTIVES[arm][2] for arm in OBJECTIVES]
    our_rank, paper_rank = ranks(means), ranks(paper)
    rows = [[OBJECTIVES[arm][0], rp.mean_std(ours[arm]), f"{our_rank[i]:g}",
             f"{run.last_metric(pretraining[arm], 'eval_loss'):.3f}", f"{paper[i]:.2f} ({OBJECTIVES[arm][3]})",
             f"{paper_rank[i]:g}"] for i, arm in enumerate(OBJECTIVES)]
    print(f"\nOurs: SST-2 dev accuracy x100 as text to text, mean ± std over seeds {seeds} ({examples} training "
          f"examples, {epochs} epochs) after {run.pretraining_text(steps)} ({length}-token inputs) of the tiny T5 on "
          f"{os.path.basename(corpus)}. Paper: GLUE average, T5-Base.\n")
    print(rp.markdown(["objective", "ours SST-2", "ours rank", "ours held-out pretraining loss",
                       "paper GLUE", "paper rank"], rows))
    tau = stats.kendalltau(our_rank, paper_rank).statistic
    print(f"\nKendall's tau between the rankings: {tau:+.2f} (the pretraining losses are of different tasks: "
          "not comparable across objectives)")
    print("\n" + run.footer())


if __name__ == "__main__":
    main()
