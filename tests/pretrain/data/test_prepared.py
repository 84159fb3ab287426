"""Prepared corpora (pretrain/data/prepared.py, pretrain/tools/prepare_corpus.py): text or TFDS -> tokenized ArrayRecord
shards -> documents again, equal to tokenizing the text directly."""
from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
import sys

import ml_collections
import numpy as np
import pytest

from configs import common
from pretrain.data import documents as corpus_documents
from pretrain.data import preparation, prepared, sources, tokenizers
from pretrain.data.prepared import PreparedCorpus
from pretrain.data.sources import CorpusError
from pretrain.tools import prepare_corpus, train_tokenizer
from tests.helpers.asserts import assert_one_line_error
from tests.helpers.data import WORDPIECE_VOCAB, tfds_builder_class
from tests.helpers.paths import REPO


@pytest.fixture(scope="module")
def spm(corpus_and_tokenizer) -> dict:
    return {"kind": "sentencepiece", "path": corpus_and_tokenizer[1], "lowercase": True, "extra_ids": 0}


@pytest.fixture(scope="module")
def corpus(corpus_and_tokenizer) -> str:
    return corpus_and_tokenizer[0]


def _prepare(corpus, spm, output, **kwargs):
    kwargs = {"num_shards": 3, "progress": False, **kwargs}
    return preparation.prepare(functools.partial(sources.iter_text_documents, corpus), spm, str(output), **kwargs)


def _assert_same(documents, expected):
    assert len(documents) == len(expected)
    for got, want in zip(documents, expected):
        assert len(got) == len(want)  # sentence by sentence
        for a, b in zip(got, want):
            assert a.dtype == np.int32 and a.tolist() == b.tolist()


def test_iter_text_documents_streams_what_read_text_corpus_reads(tmp_path):
    (tmp_path / "a.txt").write_text("  one. \ntwo.\n\n\n\nthree.\n  \n")
    (tmp_path / "b.txt").write_text("\nfour.")
    documents = sources.iter_text_documents(str(tmp_path / "*.txt"))
    assert not isinstance(documents, list) and next(documents) == ["one.", "two."]
    assert list(documents) == [["three."], ["four."]]
    pattern = str(tmp_path / "*.txt")
    assert list(sources.iter_text_documents(pattern)) == sources.read_text_corpus(pattern)
    with pytest.raises(CorpusError) as e:  # checked when called, before anything is read
        sources.iter_text_documents(str(tmp_path / "nope.txt"), flag="--input")
    assert_one_line_error(e, "nope.txt", "--input")


def test_round_trip(tmp_path, corpus, spm):
    index = _prepare(corpus, spm, tmp_path / "out", command="python -m pretrain.tools.prepare_corpus ...")
    tok = tokenizers.from_config(spm)
    expected = sources.tokenize_documents(sources.read_text_corpus(corpus), tok)
    docs = PreparedCorpus.open(str(tmp_path / "out"), tokenizer=tok)
    _assert_same(list(docs), expected)  # in the input's order, over 3 shards
    _assert_same([docs[7], docs[-1]], [expected[7], expected[-1]])
    _assert_same(docs.__getitems__([5, 0, 5]) + docs[2:8:3], [expected[i] for i in (5, 0, 5, 2, 5)])
    with pytest.raises(IndexError):
        docs[len(expected)]
    n_tokens = sum(len(s) for d in expected for s in d)
    assert (len(docs), docs.num_tokens, docs.num_shards) == (len(expected), n_tokens, 3)
    train = index["splits"]["train"]
    assert sorted(index["splits"]) == ["train"] and (index["documents"], index["tokens"]) == (len(expected), n_tokens)
    assert [s["file"] for s in train["shards"]] == [f"train-0000{i}-of-00003.array_record" for i in range(3)]
    block = -(-len(expected) // 3)  # contiguous blocks of ceil(documents / shards)
    blocks = [expected[i * block:(i + 1) * block] for i in range(3)]
    assert [s["documents"] for s in train["shards"]] == [len(b) for b in blocks]
    assert [s["tokens"] for s in train["shards"]] == [sum(len(s) for d in b for s in d) for b in blocks]
    assert index["tokenizer"]["fingerprint"] == tokenizers.fingerprint(tok)
    assert index["tokenizer"]["path"] == os.path.abspath(spm["path"]) and index["command"].startswith("python")
    assert json.loads((tmp_path / "out" / "index.json").read_text()) == index
    assert sorted(os.listdir(tmp_path / "out")) == ["index.json"] + [s["file"] for s in train["shards"]]

    # A grain data source: picklable, reopened lazily in the process that unpickles it.
    again = pickle.loads(pickle.dumps(docs))
    assert again._source is None and len(pickle.dumps(docs)) < 5000
    _assert_same([again[3]], [expected[3]])
    grain = pytest.importorskip("grain")
    lengths = grain.MapDataset.source(docs).map(lambda d: sum(map(len, d)))
    assert [lengths[i] for i in range(4)] == [sum(map(len, d)) for d in expected[:4]]


def test_record_layout():
    sentences = [np.array([5, 6, 7], np.int32), np.array([8], np.int32)]
    record = prepared.encode_record(sentences)
    assert np.frombuffer(record, "<i4").tolist() == [2, 3, 1, 5, 6, 7, 8]
    assert [s.tolist() for s in prepared.decode_record(record)] == [[5, 6, 7], [8]]
    for document in ([], [np.array([], np.int32)], [np.array([1], np.int32), np.array([], np.int32), np.arange(4)]):
        decoded = prepared.decode_record(prepared.encode_record(document))
        assert [s.tolist() for s in decoded] == [s.tolist() for s in document]
        assert all(s.dtype == np.int32 for s in decoded)


def test_output_does_not_depend_on_workers(tmp_path, corpus, spm, monkeypatch):
    monkeypatch.setattr(preparation, "_CHUNK_DOCUMENTS", 16)  # many chunks: several in flight at once
    one = _prepare(corpus, spm, tmp_path / "one", workers=1, eval_documents=5)
    two = _prepare(corpus, spm, tmp_path / "two", workers=2, eval_documents=5)
    assert {k: v for k, v in one.items() if k != "created"} == {k: v for k, v in two.items() if k != "created"}
    files = sorted(os.listdir(tmp_path / "one"))
    assert files == sorted(os.listdir(tmp_path / "two")) and len(files) == 5
    for name in files:
        if name != "index.json":
            assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_in_flight_chunks_are_bounded(spm):
    pulled = []

    def chunks():
        for i in range(12):
            pulled.append(i)
            yield [[f"chunk {i} sentence."]]

    tok = tokenizers.from_config(spm)
    results = []
    for records in preparation._encoded(chunks(), tok, workers=2):
        results.append(records)
        assert len(pulled) - len(results) <= preparation._IN_FLIGHT_PER_WORKER * 2
    assert [(len(records), read) for records, read in results] == [(1, 1)] * 12
    assert results[4][0][0][0] == prepared.encode_record(sources.encode_documents([["chunk 4 sentence."]], tok)[0])


def test_eval_holds_out_the_last_documents(tmp_path, corpus, spm):
    index = _prepare(corpus, spm, tmp_path / "out", num_shards=2, eval_documents=4, max_documents=30)
    expected = sources.tokenize_documents(sources.read_text_corpus(corpus)[:30], tokenizers.from_config(spm))
    train = PreparedCorpus.open(str(tmp_path / "out"), "train", tokenizer=spm)
    held_out = PreparedCorpus.open(str(tmp_path / "out"), "eval", tokenizer=spm)
    _assert_same(list(train), expected[:-4])
    _assert_same(list(held_out), expected[-4:])
    assert index["splits"]["eval"]["shards"][0]["file"] == "eval-00000-of-00001.array_record"
    assert (index["splits"]["train"]["documents"], index["splits"]["eval"]["documents"]) == (26, 4)
    assert index["tokens"] == train.num_tokens + held_out.num_tokens

    with pytest.raises(CorpusError) as e:
        _prepare(corpus, spm, tmp_path / "few", eval_documents=5, max_documents=6)
    assert_one_line_error(e, "6 documents", "--eval_documents=5")
    assert not (tmp_path / "few" / "index.json").exists()  # a failed preparation is never a corpus


def test_a_corpus_prepared_without_eval_holds_out_its_last_documents_for_eval_documents(tmp_path, corpus, spm):
    _prepare(corpus, spm, tmp_path / "out", max_documents=30)
    config = ml_collections.ConfigDict(common.corpus_fields(source="prepared", path=str(tmp_path / "out"),
                                                            eval_documents=4))
    train, held_out = corpus_documents.load_documents(config, tokenizers.from_config(spm))
    expected = sources.tokenize_documents(sources.read_text_corpus(corpus)[:30], tokenizers.from_config(spm))
    _assert_same(list(train), expected[:-4])
    _assert_same(list(pickle.loads(pickle.dumps(held_out))) + [held_out[-1]], expected[-4:] + expected[-1:])
    assert (train.num_tokens, held_out.num_tokens) == tuple(sum(len(s) for d in part for s in d)
                                                            for part in (expected[:-4], expected[-4:]))
    config.eval_documents = 29
    with pytest.raises(CorpusError) as e:
        corpus_documents.load_documents(config, tokenizers.from_config(spm))
    assert_one_line_error(e, "30 train documents", "eval_documents=29")


def test_documents_without_tokens_are_dropped(tmp_path, spm):
    """As in tokenize_documents; the blocks were sized by the count, so the last shard comes out short (here empty)."""
    documents = [[f"document {i}."] if i % 4 else [""] for i in range(10)]  # 0, 4, 8 encode to nothing
    index = preparation.prepare(lambda: iter(documents), spm, str(tmp_path / "out"), num_shards=3, progress=False)
    assert [s["documents"] for s in index["splits"]["train"]["shards"]] == [4, 3, 0]
    docs = PreparedCorpus.open(str(tmp_path / "out"), tokenizer=spm)
    expected = sources.tokenize_documents(documents, tokenizers.from_config(spm))
    assert len(expected) == 7
    _assert_same(list(docs), expected)

    changing = iter([documents, documents[:6]])  # a second reading that differs from the first
    with pytest.raises(CorpusError) as e:
        preparation.prepare(lambda: iter(next(changing)), spm, str(tmp_path / "out"), num_shards=3, progress=False)
    assert_one_line_error(e, "10 documents counted, then 6 read")
    assert not (tmp_path / "out" / "index.json").exists()


def test_prepared_from_tfds(tmp_path, spm):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.core.registered.skip_registration():
        builder = tfds_builder_class(tfds)(data_dir=str(tmp_path / "tfds"), file_format="array_record")
    builder.download_and_prepare()
    read = dict(name="pretrain_test_corpus", data_dir=str(tmp_path / "tfds"))
    preparation.prepare(functools.partial(sources.iter_tfds_documents, **read), spm, str(tmp_path / "out"),
                        num_shards=2, progress=False)
    expected = sources.tokenize_documents(sources.read_tfds_corpus(**read), tokenizers.from_config(spm))
    _assert_same(list(PreparedCorpus.open(str(tmp_path / "out"), tokenizer=spm)), expected)


def test_errors_are_one_line(tmp_path, corpus, spm):
    out = str(tmp_path / "out")
    _prepare(corpus, spm, out, max_documents=20)

    tool = "python -m pretrain.tools.prepare_corpus"
    for directory, needles in [(str(tmp_path / "none"), ("none", "not found", tool)),
                               (str(tmp_path), (str(tmp_path), "index.json", tool))]:
        with pytest.raises(CorpusError) as e:
            PreparedCorpus.open(directory)
        assert_one_line_error(e, *needles)
    with pytest.raises(CorpusError) as e:
        PreparedCorpus.open(out, "eval")
    assert_one_line_error(e, "'eval'", "--eval_documents")

    shard = os.path.join(out, "train-00002-of-00003.array_record")  # 6 of the 20 documents
    shutil.move(shard, shard + ".away")
    with pytest.raises(CorpusError) as e:
        PreparedCorpus.open(out)
    assert_one_line_error(e, out, "train-00002-of-00003.array_record", "python -m pretrain.tools.prepare_corpus")
    shutil.copy(os.path.join(out, "train-00000-of-00003.array_record"), shard)  # one record more than listed
    with pytest.raises(CorpusError) as e:
        PreparedCorpus.open(out)
    assert_one_line_error(e, shard, "7 documents", "says 6")
    shutil.move(shard + ".away", shard)

    # Another tokenizer: its ids mean other pieces. A copy of the same one elsewhere is fine.
    other = train_tokenizer.train_sentencepiece(corpus, str(tmp_path / "other"), vocab_size=500)
    with pytest.raises(CorpusError) as e:
        PreparedCorpus.open(out, tokenizer={**spm, "path": other})
    assert_one_line_error(e, out, spm["path"], other, "prepare it again", "--config.tokenizer.path")
    shutil.copy(spm["path"], tmp_path / "copy.model")
    assert len(PreparedCorpus.open(out, tokenizer={**spm, "path": str(tmp_path / "copy.model")})) == 20
    with pytest.raises(CorpusError) as e:
        PreparedCorpus.open(out, tokenizer={**spm, "extra_ids": 100})
    assert_one_line_error(e, "extra_ids=100", "extra_ids=0")

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("not ours")
    with pytest.raises(CorpusError) as e:
        _prepare(corpus, spm, tmp_path / "busy")
    assert_one_line_error(e, tmp_path / "busy", "mine.txt", "--output")
    assert os.listdir(tmp_path / "busy") == ["mine.txt"]
    with pytest.raises(CorpusError):  # an input error leaves an earlier preparation as it was
        preparation.prepare(functools.partial(sources.iter_text_documents, str(tmp_path / "gone.txt")), spm, out,
                            num_shards=1)
    assert len(PreparedCorpus.open(out)) == 20
    index = _prepare(corpus, spm, out, num_shards=1, max_documents=5)  # over an earlier preparation: replaced
    assert sorted(os.listdir(out)) == ["index.json", "train-00000-of-00001.array_record"]
    assert len(PreparedCorpus.open(out)) == index["documents"] == 5


def test_a_text_file_given_as_the_prepared_directory_is_named_a_file_and_the_fix_keeps_it(tmp_path, corpus):
    text = tmp_path / "corpus.txt"
    shutil.copy(corpus, text)
    with pytest.raises(CorpusError) as e:
        PreparedCorpus.open(str(text))
    assert_one_line_error(e, text, "is a file", "--config.data.source=text", "--output=")
    assert f"--output={text} " not in str(e.value) and not str(e.value).endswith(f"--output={text}")
    with open(corpus, "rb") as f:
        assert text.read_bytes() == f.read()


def test_fingerprint(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(WORDPIECE_VOCAB) + "\n")
    base = {"kind": "wordpiece", "path": str(vocab)}
    print_ = tokenizers.fingerprint
    assert print_(base) == print_(tokenizers.load_tokenizer("wordpiece", str(tmp_path)))  # directory or file
    assert print_(base) != print_({**base, "lowercase": False}) != print_({**base, "extra_ids": 100})
    before = print_(base)
    shutil.copy(vocab, tmp_path / "copy.txt")
    assert print_({**base, "path": str(tmp_path / "copy.txt")}) == before  # the content decides, not the path
    vocab.write_text("\n".join(WORDPIECE_VOCAB + ["extra"]) + "\n")
    assert print_(base) != before
    text = tmp_path / "chars.txt"
    text.write_text("abc")
    char = {"kind": "char", "path": str(text)}
    assert print_(char) == print_({**char, "lowercase": False})  # the char kind ignores lowercase
    with pytest.raises(TypeError):
        print_(tokenizers.CharTokenizer(str(text)))  # not from load_tokenizer: its options are unknown


@pytest.mark.slow
def test_the_command(tmp_path, corpus, spm):
    import subprocess

    out = tmp_path / "out"
    args = ["--input", corpus, "--tokenizer", spm["path"], "--output", str(out), "--num_shards", "2",
            "--eval_documents", "3", "--workers", "2"]
    proc = subprocess.run([sys.executable, "-m", "pretrain.tools.prepare_corpus", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "docs/s" in proc.stderr and f"wrote {out}/index.json" in proc.stdout
    index = json.loads((out / "index.json").read_text())
    assert index["command"] == "python -m pretrain.tools.prepare_corpus " + " ".join(args)
    expected = sources.tokenize_documents(sources.read_text_corpus(corpus), tokenizers.from_config(spm))
    _assert_same(list(PreparedCorpus.open(str(out), tokenizer=spm)) + list(PreparedCorpus.open(str(out), "eval")),
                 expected)

    proc = subprocess.run([sys.executable, "-m", "pretrain.tools.prepare_corpus", *args[2:],
                           "--input", str(tmp_path / "x*")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: no corpus file matches {tmp_path}/x* (check --input)"]
    assert prepare_corpus.parse_args(args).workers == 2
