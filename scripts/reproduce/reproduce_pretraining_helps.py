"""Does pretraining help? One task fine-tuned from our pretrained checkpoint and from random weights of the
same architecture, for each family (BERT, T5, GPT), over seeds; the papers' rows beside ours.

The papers' versions of this comparison (dev sets; the numbers are GLUE averages, not one task):
  GPT   Radford et al. 2018, Table 5: "Transformer w/ aux LM (full)" average 74.7, "Transformer w/o
        pre-training" 59.9 (the text: "a 14.8% decrease").
  T5    Raffel et al. 2020, Table 1: baseline GLUE average 83.28, "No pre-training" 66.22.
  BERT  Devlin et al. 2019 have no from-scratch row.
Here each family's tiny config pretrains on `make demo`'s corpus with its own objective (MLM + NSP, span
corruption, causal LM), then SST-2 (8,000 training examples; dev accuracy) is fine-tuned with each
family's recipe from configs/glue.py (BERT at lr 1e-4, the tiny model's rate in make demo) from
that checkpoint and from random weights (the same architecture and tokenizer, `--config.init_weights=random`).

  python -m scripts.reproduce.reproduce_pretraining_helps    # 3 families x 2 inits x 3 seeds (about an hour)
  python -m scripts.reproduce.reproduce_pretraining_helps --quick --parallel 2
      # seed 0, fewer steps (12.1 min, 2 idle cores)
  python -m scripts.reproduce.reproduce_pretraining_helps --minutes 20 --parallel 2
      # each family pretrains for 20 minutes (cram.py: BERT with make cram's recipe), one at a time; then the same
      # fine-tuning, 2 at a time
"""
from __future__ import annotations

import argparse
import os

from scripts.reproduce import reproduction as rp

FAMILIES = {  # family -> (pretraining config, its flags besides the assets, fine-tuning flags)
    "bert": ("configs/bert.py:size=tiny", [], ["--config.optimizer.learning_rate=1e-4"]),
    "t5": ("configs/t5.py:size=tiny", ["--config.data.source=text"], []),
    "gpt": ("configs/gpt2.py:size=tiny", [], []),
}
PAPER = {"bert": ("—", "—", "Devlin et al. 2019: no such row"),
         "t5": ("83.28", "66.22", "Raffel et al. 2020, Table 1, GLUE average"),
         "gpt": ("74.7", "59.9", "Radford et al. 2018, Table 5, average score")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_common_flags(parser, "runs/reproduce_pretraining_helps")
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    args = parser.parse_args()
    steps, examples, epochs, seeds = (300, 4000, 2, [0]) if args.quick else (600, 8000, 3, [0, 1, 2])
    corpus, spm = rp.demo_assets(args)
    run = rp.Reproduction(args, [f"steps={steps}", f"examples={examples}", f"epochs={epochs}", corpus, spm])

    assets = [f"--config.data.path={corpus}", f"--config.tokenizer.path={spm}", f"--config.num_train_steps={steps}"]
    recipe = {"bert": ",recipe=cram,nsp=False"} if args.minutes else {}  # a budget run: make cram's BERT recipe
    pretraining = {f: run.pretrain_cell(f, config + recipe.get(f, ""), assets + flags)
                   for f, (config, flags, _) in FAMILIES.items() if f in args.families}
    run.run_pretraining(list(pretraining.values()))

    finetuning: dict[tuple[str, str], list] = {}
    for family, pre in pretraining.items():
        config = f"configs/glue.py:task=sst2,model={family}"
        shared = [f"--config.data.glue_dir={os.path.abspath(args.glue_dir)}",
                  f"--config.data.max_train_examples={examples}", f"--config.num_epochs={epochs}",
                  "--config.data.max_seq_length=64", "--config.write_test_predictions=False", *FAMILIES[family][2]]
        inits = {"pretrained": [f"--config.init={run.pretrained(pre)}"],
                 "random": [f"--config.init={run.pretrained(pre)}", "--config.init_weights=random"]}
        for init, flags in inits.items():
            finetuning[family, init] = [run.finetune_cell(f"{family}_{init}", "sst2", seed, config, shared + flags)
                                        for seed in seeds]
    run.run([cell for cells in finetuning.values() for cell in cells])

    rows = []
    for family in pretraining:
        scores = {init: [run.results(c)["metrics"]["dev"]["accuracy"] for c in finetuning[family, init]]
                  for init in ("pretrained", "random")}
        gain = 100 * (sum(scores["pretrained"]) / len(seeds) - sum(scores["random"]) / len(seeds))
        paper = PAPER[family]
        rows.append([family, rp.mean_std(scores["pretrained"]), rp.mean_std(scores["random"]), f"{gain:+.1f}",
                     paper[0], paper[1], paper[2]])
    print(f"\nSST-2 dev accuracy x100 (mean ± std over seeds {seeds}; {examples} training examples, {epochs} epochs; "
          f"{run.pretraining_text(steps)} on {os.path.basename(corpus)}):\n")
    print(rp.markdown(["family", "ours: pretrained", "ours: random init", "gain", "paper: pretrained",
                       "paper: no pretraining", "paper source"], rows))
    print("\n" + run.footer())


if __name__ == "__main__":
    main()
