"""Fine-tuning BERT for extractive question answering (J&M 11.3.4): SQuAD v1.1 and v2.0.

  python -m pretrain.finetune --config=configs/qa.py:task=squad --workdir=runs/squad \
      --config.init=PATH --config.data.dir=DIR
  python -m pretrain.evaluate --workdir=runs/squad

DIR holds the official files: `train-v1.1.json` and `dev-v1.1.json` (task=squad) or `train-v2.0.json` and
`dev-v2.0.json` (task=squad_v2). PATH is a pretrain.train BERT workdir or a Hugging Face BERT directory.
Scores are the official script's exact match and F1 (x100); predictions/dev.json is its predictions file.
v2.0 also reports the no-answer threshold that gives the best dev F1 (best_f1, best_f1_threshold, as the
official v2.0 script does); give it to the next run as --config.data.null_threshold.

model=modernbert: the same with ModernBERT (configs/glue.py's model=modernbert).
model=t5 (size= as in configs/glue.py): "question: ... context: ..." -> the answer's text, T5's fine-tuning
recipe (configs/glue.py), inputs of 512 pieces truncated rather than windowed, scored by the same metric.

Recipe (Devlin et al. 2019, Section 4.2-4.3; Hugging Face's run_qa for the windows): learning rate 5e-5,
batch 32, 3 epochs (2 for v2.0), Adam with 10% warm-up and linear decay; 384-piece inputs, questions cut to
64 pieces, windows overlapping by 128 pieces, answers of at most 30 pieces from the 20 best starts and ends.
"""
import os

import ml_collections

from configs import common, glue


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, task="squad", model="bert", size="small", freeze="none", peft="none")
    if arg.task not in ("squad", "squad_v2") or arg.model not in ("bert", "modernbert", "t5"):
        raise ValueError(f"configs/qa.py: task={arg.task!r} must be 'squad' or 'squad_v2', model={arg.model!r} "
                         "'bert', 'modernbert' or 't5'")
    c = glue.get_config(f"task=mrpc,model={arg.model},size={arg.size},freeze={arg.freeze},peft={arg.peft}")
    c.unlock()
    c.task = arg.task
    c.num_epochs = 3 if arg.task == "squad" else 2
    if arg.peft == "none" and arg.model != "t5":
        c.optimizer.learning_rate = 5e-5
    c.data = ml_collections.ConfigDict(dict(
        source="dir",              # dir: the JSON files in `dir` | tfds: TFDS squad/v1.1, squad/v2.0 | hf: the Hub's
        dir=os.environ.get("SQUAD_DIR", ""),  # the official JSON files
        tfds_data_dir="",          # source=tfds: TFDS's data_dir ('' = ~/tensorflow_datasets)
        hf_path=f"rajpurkar/{arg.task}",  # source=hf: the Hugging Face Hub dataset, or a local copy in its layout
        max_seq_length=384,        # [CLS] question [SEP] window [SEP] (T5: the input, 512)
        max_answer_length=30,      # pieces (T5: of the written answer)
        max_train_examples=0,      # > 0: a fixed random subset of the train questions
        validation_examples=0,     # > 0: that many of those held out (not trained on) to pick the best epoch on, as in
                                   # configs/glue.py; dev is then only reported
        pad_to_multiple_of=8,
        length_buckets=4))
    if arg.model != "t5":  # an encoder's windows and span search: T5 writes its answer instead
        c.data.update(dict(
            max_query_length=64,   # question pieces kept
            doc_stride=128,        # pieces shared by consecutive windows of a long context
            n_best=20,             # starts and ends considered per window
            null_threshold=0.0))   # v2.0: answer '' where no-answer beats the best span by more than this
    else:
        c.data.max_seq_length = 512
    c.lock()
    return c
