"""Pretraining from a Hub dataset read as it streams (pretrain/data/streamed.py), offline on a local folder in the
Hub's layout: the batches are the streaming pipeline's (a function of seed, step and streams), each process reads
only its own streams' parts of the dataset, a stored position resumes bitwise, and the command trains, stops and
resumes to the run it would have made without stopping."""
from __future__ import annotations

import json

import numpy as np
import pytest
from absl import flags

from pretrain.data import hub
from pretrain.data.streamed import StreamedData
from pretrain.runtime.errors import ConfigError
from tests.helpers.commands import run_train
from tests.helpers.data import FAKE_VOCAB, bert_objective, random_documents
from tests.helpers.hub_layout import offline_hub, write_hub_folder
from tests.helpers.tiny_bert import tiny_overrides

datasets = pytest.importorskip("datasets")
flags.FLAGS.mark_as_parsed()  # Grain reads absl flags; pytest does not parse them


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    offline_hub(monkeypatch, tmp_path / "hf_cache")


class WordIds:
    """A tokenizer for text written as 'w<id> w<id> ...': each word back to its id."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[int(word[1:]) for word in text.split()] for text in texts]


@pytest.fixture
def corpus(tmp_path) -> hub.StreamedCorpus:
    documents = [[" ".join(f"w{i}" for i in sentence) for sentence in document]
                 for document in random_documents(n=60)]
    assert max(int(w[1:]) for d in documents for s in d for w in s.split()) < FAKE_VOCAB
    return hub.StreamedCorpus(write_hub_folder(tmp_path / "corpus", documents, files=4), WordIds())


def make(corpus, **kw) -> StreamedData:
    args = dict(batch_size=8, seed=3, max_seq_length=32, window_documents=5, streams=4)
    return StreamedData(corpus, bert_objective(), **{**args, **kw})


def take(data: StreamedData, steps: int, start: int = 0, position=None) -> list:
    iterator = data.iterate(start, position)
    out = [next(iterator) for _ in range(steps)]
    data.close()
    return out


def test_each_process_reads_its_own_parts_and_the_global_batch_does_not_depend_on_the_processes(corpus, monkeypatch):
    reference = take(make(corpus), 6)
    read_parts = {0: set(), 1: set()}
    windows = hub.StreamedCorpus.windows
    for p in (0, 1):
        def recording(self, index, count, size, start=0, p=p):
            read_parts[p].add((index, count))
            return windows(self, index, count, size, start)
        monkeypatch.setattr(hub.StreamedCorpus, "windows", recording)
        part = take(make(corpus, process_count=2, process_index=p), 6)
        for step in range(6):
            for key, rows in part[step][1].items():
                np.testing.assert_array_equal(rows, reference[step][1][key][4 * p:4 * (p + 1)], err_msg=key)
    assert read_parts == {0: {(0, 4), (1, 4)}, 1: {(2, 4), (3, 4)}}  # four files: a part is one file


def test_resume_from_a_stored_position_gives_the_uninterrupted_batches(corpus):
    data = make(corpus)
    run = take(data, 10)  # past the end of the parts: they start over
    for stop in (1, 4, 9):
        resumed = take(make(corpus), 10 - stop, start=stop, position=data.position(stop, run[stop - 1][2]))
        for (_, rows, position), (_, expected, expected_position) in zip(resumed, run[stop:]):
            assert position == expected_position
            for key in rows:
                np.testing.assert_array_equal(rows[key], expected[key], err_msg=key)


def test_a_position_from_another_corpus_or_workers_is_refused(corpus, tmp_path):
    position = make(corpus).start_position(0)
    other = hub.StreamedCorpus(write_hub_folder(tmp_path / "other", [["w5 w6"]] * 8, files=4), WordIds())
    with pytest.raises(ConfigError, match="another data order .*documents: hf:"):
        make(other).check_position(position)
    with pytest.raises(ConfigError, match="data.workers=2: a streamed corpus"):
        make(corpus, workers=2)


@pytest.mark.slow
def test_pretraining_from_a_streamed_hub_dataset_stops_and_resumes_to_the_uninterrupted_run(
        tmp_path, corpus_and_tokenizer):
    from pretrain.data import sources
    folder = write_hub_folder(tmp_path / "corpus", sources.read_text_corpus(corpus_and_tokenizer[0]))
    flags_ = tiny_overrides(*corpus_and_tokenizer, **{
        "data.source": "hf", "data.hf_path": folder, "data.streaming": True, "data.hf_eval_split": "train",
        "eval_every": 3})
    run_train(tmp_path / "whole", flags_)
    run_train(tmp_path / "stopped", flags_ + ["--config.num_train_steps=3"])
    run_train(tmp_path / "stopped", flags_)  # resumes from the checkpoint at step 3
    whole, resumed = (_records(tmp_path / name) for name in ("whole", "stopped"))
    assert len(whole) == 6 + 2 and resumed == whole  # losses, held-out losses and gradient norms, bitwise


def _records(workdir) -> list[dict]:
    keep = ("step", "loss", "grad_norm", "eval_loss")
    with open(workdir / "metrics.jsonl") as f:
        return [{k: r[k] for k in keep if k in r} for r in map(json.loads, f)]
