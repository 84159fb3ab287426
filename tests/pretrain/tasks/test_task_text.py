"""pretrain/tasks/task_text.py: a GLUE task's text for continued pretraining is its training split's and nothing
else's (dev and test sentences never appear, and their files are refused as --text); --labelled_only=N is the text
of exactly the N examples fine-tuning takes; examples group into documents of about one row."""
from __future__ import annotations

import os
import types

import pytest

from configs import glue as glue_config
from pretrain.data import sources
from pretrain.loops import scoring
from pretrain.runtime.errors import UserError
from pretrain.tasks import task_text
from pretrain.tasks.glue.task import GlueFineTuningTask
from tests.helpers.asserts import assert_one_line_error
from tests.helpers.glue_files import tsv, write_lines

POISON = "poisoned evaluation sentence"


def write_glue(root) -> str:
    """SST-2 (single sentences) and MRPC (pairs, a byte-order mark as the original) with their dev and test files
    holding the POISON sentence."""
    write_lines(root, "SST-2/train.tsv", [tsv("sentence", "label")]
                + [tsv(f"train phrase number {i} ", i % 2) for i in range(40)] + [tsv("   ", 1)])  # a blank one
    write_lines(root, "SST-2/dev.tsv", [tsv("sentence", "label"), tsv(POISON, 1)])
    write_lines(root, "SST-2/test.tsv", [tsv("index", "sentence"), tsv(0, POISON)])
    header = "\ufeff" + tsv("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")
    write_lines(root, "MRPC/train.tsv", [header] + [tsv(i % 2, i, i + 1, f"first {i} .", f"second {i} .")
                                                      for i in range(6)])
    write_lines(root, "MRPC/dev.tsv", [header, tsv(1, 0, 1, POISON, POISON)])
    write_lines(root, "MRPC/test.tsv", [tsv("index", "#1 ID", "#2 ID", "#1 String", "#2 String"),
                                        tsv(0, 0, 1, POISON, POISON)])
    return str(root)


def test_only_the_training_split_is_read(tmp_path):
    glue_dir = write_glue(tmp_path)
    single = task_text.training_examples("sst2", glue_dir)
    assert single[:2] == [["train phrase number 0"], ["train phrase number 1"]] and len(single) == 41
    assert single[-1] == []  # the blank sentence is left out, its example kept (it counts for --labelled_only)
    pairs = task_text.training_examples("mrpc", glue_dir)
    assert pairs[0] == ["first 0 .", "second 0 ."] and len(pairs) == 6  # both sentences of a pair task
    text = task_text.corpus_text(task_text.group_documents(single + pairs, [4] * 47, 20))
    assert POISON not in text and "train phrase number 39" in text and "second 5 ." in text


def test_labelled_only_is_the_text_of_the_examples_fine_tuning_takes(tmp_path):
    glue_dir = write_glue(tmp_path)
    config = glue_config.get_config("task=sst2")
    config.data.glue_dir, config.data.max_train_examples = glue_dir, 7
    finetuner = types.SimpleNamespace(task=GlueFineTuningTask.named("sst2"), encode=lambda examples, batch: None)
    (_, train), validation = scoring.load_training(config, finetuner)  # what pretrain.finetune trains (and selects) on
    seen = train + (validation[1] if validation else [])
    chosen = task_text.training_examples("sst2", glue_dir, labelled_only=7)
    assert sorted(chosen) == sorted([" ".join(e.text_a.split())] if e.text_a.strip() else [] for e in seen)
    assert chosen != task_text.training_examples("sst2", glue_dir)[:7]  # a random subset, not the first lines


def test_examples_group_into_documents_of_about_one_row_in_the_text_format(tmp_path):
    examples = [["a b"], ["c d", "e f"], ["g"], ["a very long one"], ["h"]]
    documents = task_text.group_documents(examples, [2, 4, 1, 30, 1], budget=6)
    assert documents == [["a b", "c d", "e f"], ["g"], ["a very long one"], ["h"]]  # the long one alone
    path = tmp_path / "corpus.txt"
    path.write_text(task_text.corpus_text(documents))
    assert sources.read_text_corpus(str(path)) == documents  # the text source reads back the same documents


def test_glue_dev_and_test_files_are_refused_as_text_in_one_line(tmp_path):
    glue_dir = write_glue(tmp_path / "glue")
    for path in ("SST-2/dev.tsv", "SST-2/test.tsv", "MRPC/dev.tsv", "SST-2/notes.txt"):
        with pytest.raises(UserError) as info:
            task_text.check_training_text(os.path.join(glue_dir, path))
        assert_one_line_error(info, "--text=", "GLUE evaluation data", "--task")
    elsewhere = tmp_path / "copies" / "dev_matched.tsv"  # MNLI's name, outside any task folder
    write_lines(tmp_path, "copies/dev_matched.tsv", ["x"])
    linked = tmp_path / "reviews.txt"
    os.symlink(os.path.join(glue_dir, "SST-2", "dev.tsv"), linked)  # a link's target counts
    for path in (str(elsewhere), str(linked), f"{tmp_path}/corpus.txt,{tmp_path}/copies/*.tsv"):
        with pytest.raises(UserError):
            task_text.check_training_text(path)
    (tmp_path / "corpus.txt").write_text("some text\n")
    task_text.check_training_text(f"{tmp_path}/corpus.txt,{glue_dir}/SST-2/train.tsv")  # training text passes
