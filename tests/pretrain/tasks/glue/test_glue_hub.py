"""GLUE from the Hugging Face Hub (`nyu-mll/glue`), offline: the official files (the shared download and the crafted
rows of tests/helpers/glue_files.py) written as a local copy of the Hub repository (README.md's configs, one folder per
task, <split>-00000-of-00001.parquet with the Hub's columns), which load_dataset reads as it reads the repository. Every
split gives the examples of the official file, so fine-tuning and its dev metrics are those of the official files."""
from __future__ import annotations

import json
import os
import re

import pytest

from configs import glue as glue_config
from pretrain.loops import finetuning
from pretrain.tasks import registry as task_registry
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


def write_hub_copy(folder, official: dict[tuple[str, str], str], card: bool = True) -> str:
    """The official splits as the Hub repository lays them out: parquet per config and split, README.md's configs
    (card=False: without README.md)."""
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
    return write_hub_repo(str(folder), configs, card=card)


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


@pytest.mark.parametrize("layout", ["a folder per task", "files named by split"])
def test_a_hub_copy_without_a_card_reads_the_task_folder_or_the_files_named_by_split(tmp_path, crafted, layout):
    official = {key: root for key, root in official_splits(crafted).items() if key[0] in ("mnli", "wnli")}
    folder = write_hub_copy(tmp_path / "glue", official, card=False)
    for (name, split), root in official.items():
        path = folder if layout == "a folder per task" else os.path.join(folder, name)
        task = get_task(name)
        assert read_glue_hub(task, split, path) == read_glue_dir(task, split, root), (name, split)


def test_the_hub_source_given_official_tsvs_names_the_tsv_source_and_only_keys_the_config_has(tmp_path, crafted,
                                                                                              corpus_and_tokenizer):
    config = glue_config.get_config("task=wnli")
    config.data.update(dict(source="hf", hf_path=crafted))
    config.tokenizer.update(dict(kind="sentencepiece", path=corpus_and_tokenizer[1]))
    with pytest.raises(GlueDataError) as e:
        task_registry.task_for_config(config).load(config, "train")
    assert_one_line_error(e, crafted, "official GLUE", "--config.data.source=dir", f"--config.data.glue_dir={crafted}")
    _assert_names_only_keys_of(config, str(e.value))
    with pytest.raises(GlueDataError):  # the same refused by the loop, which leaves no workdir behind
        finetuning.finetune(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    config.data.hf_path = write_hub_copy(tmp_path / "glue", {("mrpc", "train"): GLUE})  # a copy without WNLI
    with pytest.raises(GlueDataError) as e:
        task_registry.task_for_config(config).load(config, "train")
    assert_one_line_error(e, "wnli", "--config.data.hf_path")
    _assert_names_only_keys_of(config, str(e.value))


def _assert_names_only_keys_of(config, message: str) -> None:
    named = re.findall(r"--config\.(\w+)\.(\w+)", message)
    assert named and all(leaf in config[section] for section, leaf in named), (named, message)


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
