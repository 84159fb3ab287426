"""GLUE from the Hugging Face Hub (`nyu-mll/glue`), offline: the official files (the shared download and the crafted
rows of tests/helpers/glue_files.py) written as a local copy of the Hub repository (README.md's configs, one folder per task,
<split>-00000-of-00001.parquet with the Hub's columns), which load_dataset reads as it reads the repository. Every
split gives the examples of the official file, so fine-tuning and its dev metrics are those of the official files."""
from __future__ import annotations

import json
import os

import pytest

from pretrain.tasks.glue.data import GlueDataError, get_task, load_split, read_glue_dir, read_glue_hub
from tests.helpers.asserts import assert_one_line_error
from tests.helpers.commands import run_module
from tests.helpers.glue_files import GLUE, write_crafted
from tests.helpers.hub_layout import offline_hub, write_hub_repo

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")

# The Hub's columns per task (its dataset card), besides label and idx; its split names.
HUB_TEXT_COLUMNS = {"cola": ("sentence",), "sst2": ("sentence",), "mrpc": ("sentence1", "sentence2"),
                    "stsb": ("sentence1", "sentence2"), "qqp": ("question1", "question2"),
                    "mnli": ("premise", "hypothesis"), "qnli": ("question", "sentence"),
                    "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2")}
HUB_SPLITS = {"dev": "validation", "dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched"}


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    offline_hub(monkeypatch, tmp_path / "hf_cache")


@pytest.fixture(scope="module")
def crafted(tmp_path_factory) -> str:
    return write_crafted(str(tmp_path_factory.mktemp("glue_crafted")))


def official_splits(crafted_dir: str) -> dict[tuple[str, str], str]:
    """(task, split) -> the folder of its official file: the shared download where it has the task, else crafted."""
    found = {}
    for name in HUB_TEXT_COLUMNS:
        task = get_task(name)
        for split in task.splits:
            for root in (GLUE, crafted_dir):
                if os.path.isfile(os.path.join(root, task.directory, f"{split}.tsv")):
                    found[name, split] = root
                    break
    return found


def write_hub_copy(folder, official: dict[tuple[str, str], str]) -> str:
    """The official splits as the Hub repository lays them out: parquet per config and split, README.md's configs."""
    configs: dict[str, dict] = {}
    for (name, split), root in official.items():
        task = get_task(name)
        examples = read_glue_dir(task, split, root)
        columns = {column: [e.text_a if k == 0 else e.text_b for e in examples]
                   for k, column in enumerate(HUB_TEXT_COLUMNS[name])}
        label_type = pa.float32() if task.is_regression else pa.int64()
        configs.setdefault(name, {})[HUB_SPLITS.get(split, split)] = pa.table({
            **columns, "label": pa.array([e.label for e in examples], label_type),
            "idx": pa.array([e.idx for e in examples], pa.int32())})
    return write_hub_repo(str(folder), configs)


def test_hub_copy_gives_the_examples_of_the_official_files(tmp_path, crafted):
    official = official_splits(crafted)
    folder = write_hub_copy(tmp_path / "glue", official)
    for (name, split), root in official.items():
        task = get_task(name)
        assert read_glue_hub(task, split, folder) == read_glue_dir(task, split, root), (name, split)
    assert {name for name, _ in official} == set(HUB_TEXT_COLUMNS)  # every task, MNLI's four extra splits too
    assert load_split(get_task("sst2"), "dev", source="hf", data_dir=folder)[0].text_a.startswith("it 's a charming")


def test_hub_without_network_or_cache_is_a_one_line_error():
    with pytest.raises(GlueDataError) as e:
        read_glue_hub(get_task("rte"), "dev")  # nyu-mll/glue, offline
    assert_one_line_error(e, "nyu-mll/glue", "local folder", "--config.data.hf_path")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(GLUE), reason=f"no GLUE download at {GLUE}")
def test_finetuning_from_the_hub_copy_scores_the_dev_metrics_of_the_official_files(tmp_path, tiny_bert_workdir):
    folder = write_hub_copy(tmp_path / "glue", {("mrpc", split): GLUE for split in ("train", "dev", "test")})
    flags = ["--config=configs/glue.py:task=mrpc", f"--config.init={tiny_bert_workdir}", "--config.num_epochs=1",
             "--config.data.max_train_examples=64", "--config.data.max_seq_length=32",
             "--config.write_test_predictions=false"]
    run_module("pretrain.finetune", flags + [f"--workdir={tmp_path / 'files'}", f"--config.data.glue_dir={GLUE}"])
    run_module("pretrain.finetune", flags + [f"--workdir={tmp_path / 'hub'}", "--config.data.source=hf",
                                             f"--config.data.hf_path={folder}",
                                             f"--config.data.glue_dir={tmp_path / 'nowhere'}"])  # the Hub copy only
    files, hub = (json.loads((tmp_path / name / "results.json").read_text())["metrics"]["dev"]
                  for name in ("files", "hub"))
    assert hub == files and set(files) >= {"f1", "accuracy"}
