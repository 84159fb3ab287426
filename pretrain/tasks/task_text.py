"""A GLUE task's unlabelled text for continued pretraining (pretrain.adapt; ULMFiT's second stage, Howard & Ruder
2018): the sentence columns of its training split and of nothing else, as a text corpus.

The dev and test splits are what fine-tuning reports: text of theirs seen in pretraining would leak into the scores,
so only `train.tsv` is read (`training_examples`), and a text file given instead (`check_training_text`) is refused
when it is a GLUE dev or test file. With `labelled_only=N` the text is that of the N training examples
`--config.data.max_train_examples=N` fine-tunes on (the same `finetune_data.subset_indices`), ULMFiT's variant that
adapts on the labelled examples' text alone.

The corpus format is the text source's (pretrain/data/sources.py): one sentence per line, a blank line between
documents. A task's examples are short (SST-2's are phrases of ~10 tokens), so consecutive examples are grouped into
documents of about one row of tokens (`group_documents`): a masked-LM row is then filled with text rather than
padding, and a causal LM's or T5's stream is unchanged (they concatenate a document's lines anyway).
"""
from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from pretrain.data import finetune_data
from pretrain.runtime.errors import UserError
from pretrain.tasks.glue import data as glue

# How pretrain.adapt names its GLUE options in glue's errors.
OPTIONS = glue.DataOptions(glue_dir="--glue_dir", tfds=None, skip_malformed=None)
# The file names of the splits fine-tuning scores on (dev.tsv, dev_matched.tsv, test.tsv, ...) and the tasks' folders.
EVALUATION_FILES = frozenset(f"{split}.tsv" for task in glue.TASKS.values()
                             for split in (*task.dev_splits, *task.test_splits))
TASK_DIRECTORIES = frozenset(task.directory for task in glue.TASKS.values())


def training_examples(task_name: str, glue_dir: str, labelled_only: int = 0) -> list[list[str]]:
    """The sentences of each training example of the GLUE task (sentence1 and sentence2 of a pair task), in file
    order; `labelled_only` > 0: only those of the examples max_train_examples=labelled_only fine-tunes on. Blank
    sentences are left out (a blank line would end a document)."""
    task = glue.get_task(task_name)
    examples = glue.load_split(task, "train", source="dir", data_dir=glue_dir, options=OPTIONS)
    examples = [examples[i] for i in finetune_data.subset_indices(len(examples), labelled_only)]
    return [[" ".join(text.split()) for text in (e.text_a, e.text_b) if text is not None and text.strip()]
            for e in examples]


def group_documents(examples: Sequence[list[str]], tokens: Sequence[int], budget: int) -> list[list[str]]:
    """Consecutive examples' sentences as documents of at most `budget` tokens (`tokens`: each example's count; an
    example longer than the budget is a document of its own): each document about one row of the pretraining data."""
    documents, current, size = [], [], 0
    for sentences, count in zip(examples, tokens):
        if current and size + count > budget:
            documents.append(current)
            current, size = [], 0
        current.extend(sentences)
        size += count
    if current:
        documents.append(current)
    return documents


def corpus_text(documents: Sequence[list[str]]) -> str:
    """Documents in the text source's format: a sentence per line, a blank line after each document."""
    return "".join("".join(line + "\n" for line in document) + "\n" for document in documents)


def check_training_text(paths: str, flag: str = "--text") -> None:
    """Refuses a GLUE dev or test file (dev.tsv, test_matched.tsv, ... or any file of a GLUE task's folder but
    train.tsv) among `paths` (comma-separated, globs), links followed: adaptation reads training text only."""
    for pattern in filter(None, (p.strip() for p in paths.split(","))):
        pattern = os.path.expanduser(pattern)
        for path in (sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]):
            for seen in {path, os.path.realpath(path)}:
                name, folder = os.path.basename(seen), os.path.basename(os.path.dirname(os.path.abspath(seen)))
                if name in EVALUATION_FILES or (folder in TASK_DIRECTORIES and name != "train.tsv"):
                    raise UserError(f"{flag}={path} is GLUE evaluation data ({folder}/{name}): text of a dev or test "
                                    "split seen in pretraining leaks into the scores fine-tuning reports; adapt on a "
                                    "task's training text with --task=NAME (it reads train.tsv only)")
