"""Corpora from the Hugging Face Hub (pretrain/data/hub.py), offline: the demo corpus's documents written as a local
folder in a Hub repository's layout (data/train-0000k-of-00002.parquet with a `text` column and an `id`), which
`load_dataset` reads as it would the repository. Read directly or prepared into ArrayRecord shards, it gives the
documents of the text file it came from, and pretraining from it the same run."""
from __future__ import annotations

import functools
import json
import os

import pytest

from pretrain.data import documents as corpus_documents
from pretrain.data import hub, preparation, sources, tokenizers
from pretrain.data.prepared import PreparedCorpus
from pretrain.data.sources import CorpusError
from pretrain.tools import prepare_corpus
from tests.helpers.asserts import assert_one_line_error
from tests.helpers.commands import run_train
from tests.helpers.hub_layout import offline_hub, write_hub_folder
from tests.helpers.tiny_bert import tiny_config, tiny_overrides

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    offline_hub(monkeypatch, tmp_path / "hf_cache")


@pytest.fixture(scope="module")
def text_documents(corpus_and_tokenizer) -> list[list[str]]:
    return sources.read_text_corpus(corpus_and_tokenizer[0])


@pytest.mark.parametrize("streaming,fmt", [(False, "parquet"), (True, "parquet"), (False, "json")])
def test_hub_folder_gives_the_documents_of_the_text_corpus_it_holds(tmp_path, text_documents, streaming, fmt):
    folder = write_hub_folder(tmp_path / "corpus", text_documents + [[]], fmt=fmt)  # an empty row: skipped
    assert list(hub.iter_documents(folder, streaming=streaming)) == text_documents


def test_two_processes_read_disjoint_parts_that_together_are_the_corpus(tmp_path, text_documents):
    folder = write_hub_folder(tmp_path / "corpus", text_documents)
    parts = [list(hub.iter_documents(folder, streaming=True, shard=(k, 2))) for k in range(2)]
    assert parts[0] and parts[1]
    assert parts[0] + parts[1] == text_documents  # two files, one each: whole files in order


def test_prepared_from_a_hub_folder_holds_what_the_direct_source_reads(tmp_path, text_documents,
                                                                       corpus_and_tokenizer):
    folder = write_hub_folder(tmp_path / "corpus", text_documents)
    spm = {"kind": "sentencepiece", "path": corpus_and_tokenizer[1], "lowercase": True, "extra_ids": 0}
    preparation.prepare(functools.partial(hub.iter_documents, folder, streaming=True), spm, str(tmp_path / "out"),
                        num_shards=2, progress=False)
    prepared = list(PreparedCorpus.open(str(tmp_path / "out"), tokenizer=spm))
    config = _data_config(hf_path=folder)
    direct, _ = corpus_documents.load_documents(config, tokenizers.from_config(spm))
    assert len(prepared) == len(direct)
    assert all([s.tolist() for s in a] == [s.tolist() for s in b] for a, b in zip(prepared, direct))


@pytest.mark.slow
def test_pretraining_from_a_hub_folder_is_the_run_from_its_text_file(tmp_path, text_documents, corpus_and_tokenizer,
                                                                     tiny_bert_workdir):
    folder = write_hub_folder(tmp_path / "corpus", text_documents)
    workdir = tmp_path / "run"
    run_train(workdir, tiny_overrides(*corpus_and_tokenizer, **{"data.source": "hf", "data.hf_path": folder}))
    assert _losses(workdir) == _losses(tiny_bert_workdir)  # same documents, same batches, same steps


def _losses(workdir) -> list[float]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [record["loss"] for record in map(json.loads, f) if "loss" in record]


def _data_config(**fields):
    from configs import common
    import ml_collections
    return ml_collections.ConfigDict(common.corpus_fields(source="hf", **fields))


def test_bad_hub_sources_are_one_line_errors(tmp_path, text_documents):
    folder = write_hub_folder(tmp_path / "corpus", text_documents)
    with pytest.raises(CorpusError) as e:
        list(hub.iter_documents(folder, text_column="content"))
    assert_one_line_error(e, "no column 'content'", "['id', 'text']", "--config.data.text_column")
    with pytest.raises(CorpusError) as e:  # no network, nothing in the cache
        hub.load("wikimedia/wikipedia", name="20231101.en")
    assert_one_line_error(e, "wikimedia/wikipedia", "not in the cache", "local folder")
    with pytest.raises(CorpusError) as e:
        hub.load(folder, split="validation")
    assert_one_line_error(e, "validation", "--config.data.hf_split")
    with pytest.raises(CorpusError) as e:
        hub.load(str(tmp_path / "nowhere"))
    assert_one_line_error(e, "nowhere", "--config.data.hf_path")
    with pytest.raises(CorpusError) as e:  # a stream has no end to hold out
        corpus_documents.load_documents(_data_config(hf_path=folder, streaming=True, eval_documents=4), tokenizer=None)
    assert_one_line_error(e, "eval_documents=4", "--config.data.hf_eval_split")


def test_a_streamed_split_slice_is_refused_before_the_dataset_is_opened_naming_the_fix(tmp_path, text_documents):
    nowhere = str(tmp_path / "nowhere")  # opening it would fail otherwise: the check comes first
    config = _data_config(hf_path=nowhere, streaming=True, hf_split="train[:10%]")
    with pytest.raises(CorpusError) as e:
        corpus_documents.load_documents(config, tokenizer=None)
    assert_one_line_error(e, "train[:10%]", "a stream cannot slice", "--config.data.hf_split=train",
                          "--config.data.max_documents", "--config.data.streaming=False")
    assert "nowhere" not in str(e.value).replace(nowhere, "")
    with pytest.raises(CorpusError) as e:  # the tool's flags
        prepare_corpus.run(prepare_corpus.parse_args(["--hf", nowhere, "--hf_split", "train[:10%]", "--streaming",
                                                      "--tokenizer", "t", "--output", "o", "--num_shards", "1"]))
    assert_one_line_error(e, "a stream cannot slice", "--hf_split=train", "--max_documents")
    assert "--config." not in str(e.value)
    folder = write_hub_folder(tmp_path / "corpus", text_documents)  # read into memory a slice is fine (configs/common)
    assert list(hub.iter_documents(folder, split="train[:50%]")) == text_documents[:len(text_documents) // 2]


def test_a_refused_hub_run_leaves_no_workdir_it_created(tmp_path, text_documents, corpus_and_tokenizer):
    from pretrain.loops import pretraining
    folder = write_hub_folder(tmp_path / "corpus", text_documents)
    refused = [{"data.hf_path": folder, "data.text_column": "content"},  # a wrong column
               {"data.hf_path": str(tmp_path / "nowhere")}]  # a missing folder
    for k, overrides in enumerate(refused):
        config = tiny_config(*corpus_and_tokenizer, **{"data.source": "hf", **overrides})
        workdir = tmp_path / f"runs{k}" / "run"  # its parent is new too
        with pytest.raises(CorpusError):
            pretraining.train_and_evaluate(config, str(workdir))
        assert not (tmp_path / f"runs{k}").exists()
    mine = tmp_path / "mine"  # a folder the person made stays, empty or not
    mine.mkdir()
    with pytest.raises(CorpusError):
        pretraining.train_and_evaluate(tiny_config(*corpus_and_tokenizer, **{"data.source": "hf", **refused[1]}),
                                       str(mine))
    assert mine.is_dir()
