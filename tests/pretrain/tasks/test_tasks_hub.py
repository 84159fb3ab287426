"""CoNLL-2003 and SQuAD from the Hugging Face Hub (`eriktks/conll2003`, `rajpurkar/squad`), offline: generated task
files (pretrain.tools.make_task_files) written as local copies of the Hub repositories, with the Hub's columns and,
for CoNLL, its tag ids and the ClassLabel names that map them (NER in the Hub's own order, not the files'). Each
split gives the sentences and questions of the files, so fine-tuning and its dev metrics are those of the files."""
from __future__ import annotations

import pytest

from configs import qa as qa_config
from configs import tagging as tagging_config
from pretrain.tasks import conll, squad
from pretrain.tasks import registry as task_registry
from pretrain.tools.make_task_files import write_files
from tests.helpers.asserts import assert_one_line_error
from tests.helpers.hub_layout import offline_hub, write_hub_repo

datasets = pytest.importorskip("datasets")

HUB_NER_NAMES = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]  # its card's order
SPLITS = {"train": "train", "dev": "validation", "test": "test"}


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    offline_hub(monkeypatch, tmp_path / "hf_cache")


def conll_hub_copy(files: str, folder) -> str:
    """CoNLL files as eriktks/conll2003 holds them: tokens and tag ids, the ids' names in the features."""
    read = {split: conll.read_conll(f"{files}/{conll.SPLIT_FILES[split]}", "ner") for split in SPLITS}
    rows = [row for f in read.values() for s in f.sentences for row in s.rows]
    pos, chunks = (sorted({row[k] for row in rows}) for k in (1, 2))
    features = datasets.Features({
        "id": datasets.Value("string"), "tokens": datasets.Sequence(datasets.Value("string")),
        **{key: datasets.Sequence(datasets.ClassLabel(names=names))
           for key, names in (("pos_tags", pos), ("chunk_tags", chunks), ("ner_tags", HUB_NER_NAMES))}})
    splits = {}
    for split, f in read.items():
        columns = {"id": [str(k) for k in range(len(f.sentences))], "tokens": [list(s.words) for s in f.sentences]}
        for key, column, names in (("pos_tags", 1, pos), ("chunk_tags", 2, chunks), ("ner_tags", 3, HUB_NER_NAMES)):
            columns[key] = [[names.index(row[column]) for row in s.rows] for s in f.sentences]
        splits[SPLITS[split]] = datasets.Dataset.from_dict(columns, features=features)
    return write_hub_repo(str(folder), {"conll2003": splits})


def test_conll_from_a_hub_copy_reads_the_sentences_and_tag_set_of_the_files(tmp_path):
    write_files("ner", str(tmp_path / "ner"), train=30, dev=12, test=12)
    folder = conll_hub_copy(str(tmp_path / "ner"), tmp_path / "hub")
    from_files = task_registry.task_for_config(_conll_config(dir=str(tmp_path / "ner")))
    from_hub = task_registry.task_for_config(_conll_config(source="hf", hf_path=folder))
    assert from_hub.labels == from_files.labels
    for split in SPLITS:
        hub, files = from_hub.load(None, split), from_files.load(None, split)
        assert [(s.words, s.tags, s.rows) for s in hub] == [(s.words, s.tags, s.rows) for s in files], split


def test_squad_from_a_hub_copy_reads_the_questions_of_the_files(tmp_path):
    write_files("squad", str(tmp_path / "squad"), train=30, dev=12)
    splits = {}
    for split, name in (("train", "train"), ("dev", "validation")):
        examples = squad.read_squad(f"{tmp_path}/squad/{squad.SPLIT_FILES['squad'][split]}")
        splits[name] = datasets.Dataset.from_dict({
            "id": [e.id for e in examples], "title": ["t"] * len(examples), "context": [e.context for e in examples],
            "question": [e.question for e in examples],
            "answers": [{"text": [a.text for a in e.answers], "answer_start": [a.start for a in e.answers]}
                        for e in examples]})
    folder = write_hub_repo(str(tmp_path / "hub"), {"plain_text": splits})
    config = qa_config.get_config()
    config.data.update(dict(source="hf", hf_path=folder))
    from_hub = task_registry.task_for_config(config)
    from_files = squad.SquadTask("squad", str(tmp_path / "squad"))
    for split in ("train", "dev"):
        assert from_hub.load(config, split) == from_files.load(config, split), split


def test_hub_tasks_without_their_columns_or_the_network_are_one_line_errors(tmp_path):
    folder = write_hub_repo(str(tmp_path / "hub"), {"conll2003": {"train": datasets.Dataset.from_dict(
        {"tokens": [["a"]], "tags": [[0]]})}})
    with pytest.raises(conll.ConllDataError) as e:
        conll.read_conll_hub("train", "ner", folder)
    assert_one_line_error(e, "no column 'pos_tags'", "['tokens', 'tags']")
    with pytest.raises(squad.SquadDataError) as e:
        squad.read_squad_hub("dev", "rajpurkar/squad")  # offline, not cached
    assert_one_line_error(e, "rajpurkar/squad", "local folder")


def _conll_config(**data):
    config = tagging_config.get_config()
    config.data.update(data)
    return config
