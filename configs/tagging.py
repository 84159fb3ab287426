"""Fine-tuning BERT for sequence labelling (Jurafsky & Martin, SLP3 ch. 11, "J&M" below, Section 11.3.3):
CoNLL-2003 NER, or POS / chunking from the same files.

  python -m pretrain.finetune --config=configs/tagging.py:task=conll2003 --workdir=runs/ner \
      --config.init=PATH --config.data.dir=DIR
  python -m pretrain.evaluate --workdir=runs/ner --splits=dev,test

DIR holds CoNLL-2003's `train.txt`, `valid.txt` and `test.txt` (space-separated `word POS chunk NER`, a blank
line between sentences, `-DOCSTART-` lines between documents); `task=conll` reads any file set in that
layout. PATH is a pretrain.train BERT workdir or a Hugging Face BERT directory, as for configs/glue.py.

Config string: `task=conll2003|conll`, `tags=ner|chunk|pos|N` (the tag column: a name or a column number,
0 being the word), `head=bio|span`, `freeze=`, `peft=` as in configs/glue.py. BIO tag sets (ner, chunk) are
scored by entity-level F1 as conlleval counts it (seqeval); others by token accuracy. The tag set is the
train file's (O first), recorded in the run's config.json as `data.labels`.

head=span (J&M 11.3.4, pretrain/finetuners/bert_spans.py): every span of up to `span_head.max_width` words is
classified into an entity type or NULL from J&M's span representation (learned start and end
boundaries, a self-attention summary; `span_head.boundaries=token`, `span_head.summary=mean` give the plain
eqs. 11.15-11.16); the most probable non-overlapping spans become the BIO tags that are scored and written.

Recipe (Devlin et al. 2019, Section 5.3 and Appendix A.3; Hugging Face's run_ner defaults): the GLUE
recipe's Adam, warm-up and decay, learning rate 5e-5, batch 32, 3 epochs, max sequence length 128; the
word's tag on its first piece only (`data.label_all_subwords=true`: on every piece, J&M's variant),
decoded from the first piece.
"""
import os

import ml_collections

from configs import common, glue


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = common.parse_arg(arg, task="conll2003", tags="ner", head="bio", freeze="none", peft="none", model="bert")
    if arg.model not in ("bert", "modernbert"):
        raise ValueError(f"configs/tagging.py: model={arg.model!r} must be 'bert' or 'modernbert' (an encoder)")
    if arg.head not in ("bio", "span"):
        raise ValueError(f"configs/tagging.py: head={arg.head!r} must be 'bio' or 'span'")
    if arg.task not in ("conll2003", "conll"):
        raise ValueError(f"configs/tagging.py: task={arg.task!r} must be 'conll2003' or 'conll'")
    c = glue.get_config(f"task=mrpc,model={arg.model},freeze={arg.freeze},peft={arg.peft}")
    c.unlock()
    c.task = arg.task
    c.head = arg.head              # bio: a tag per word | span: every span of up to span_head.max_width words
    c.span_head = ml_collections.ConfigDict(dict(
        max_width=8,               # words
        boundaries="ffnn",         # ffnn: learned start / end (J&M eqs. 11.17-11.19) | token: h_i, h_j (11.16)
        summary="attention",       # attention: self-attention over the span (11.20) | mean: the average (11.15)
        threshold=0.0))            # a type is predicted only where its probability reaches this (0: argmax)
    if arg.head == "span":
        c.head_learning_rate = 3e-3  # the span classifier's two fresh layers learn too slowly at 5e-5
    if arg.peft == "none":
        c.optimizer.learning_rate = 5e-5
    c.data = ml_collections.ConfigDict(dict(
        source="dir",              # dir: the files in `dir` | tfds: TFDS conll2003 (prepared where there is network)
                                   # | hf: the Hugging Face Hub's
        dir=os.environ.get("CONLL_DIR", ""),  # train.txt, valid.txt, test.txt
        tfds_data_dir="",          # source=tfds: TFDS's data_dir ('' = ~/tensorflow_datasets)
        hf_path="eriktks/conll2003",  # source=hf: the Hub dataset, or a local copy in its layout
        tag_column=arg.tags,       # ner | chunk | pos | a column number
        bio=arg.tags in ("ner", "chunk"),  # check the tags as BIO and score entities (False: token accuracy)
        labels="",                 # the tag set, comma-separated in id order ('' = the train file's)
        label_all_subwords=False,  # True: every piece of a word carries its tag (J&M); False: the first only
        max_seq_length=128,
        max_train_examples=0,      # > 0: a fixed random subset of the train sentences
        validation_examples=0,     # > 0: that many of those held out (not trained on) to pick the best epoch on, as in
                                   # configs/glue.py; dev is then only reported
        pad_to_multiple_of=8,
        length_buckets=4))
    c.lock()
    return c
