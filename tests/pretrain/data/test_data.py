"""Data input layer: corpora (text files, TFDS), tokenizers, tokenizer training, demo corpus."""

import functools
import importlib.util
import json
import os
import re
import shutil

import numpy as np
import pytest

from pretrain.data.sources import CorpusError, read_text_corpus, read_tfds_corpus, tokenize_documents
from pretrain.data.tokenizers import TokenizerError, load_tokenizer
from pretrain.tools import train_tokenizer
from pretrain.tools.build_corpus import build_corpus
from pretrain.tools.corpus_sources import sentences_of
from tests.helpers.asserts import assert_one_line_error
from tests.helpers.data import WORDPIECE_VOCAB, tfds_builder_class

# ------------------------------------------------------------------------------------- text files


def test_read_text_corpus_documents_files_and_globs(tmp_path):
    for name in "cab":  # created out of order: a glob must still read them sorted
        (tmp_path / f"{name}.txt").write_text(f"  {name} one. \n{name} two.\n\n\n\n{name} doc2.\n  \n")
    (tmp_path / "d.txt").write_text("\nD doc line.")  # no trailing newline
    a, d = str(tmp_path / "a.txt"), str(tmp_path / "d.txt")
    assert read_text_corpus(a) == [["a one.", "a two."], ["a doc2."]]
    assert (
        read_text_corpus([a, d])
        == read_text_corpus(f"{a},{d}")
        == [["a one.", "a two."], ["a doc2."], ["D doc line."]]
    )
    assert [doc[0][0] for doc in read_text_corpus(str(tmp_path / "*.txt"))] == list("aabbccD")


def test_read_text_corpus_errors_are_one_line(tmp_path):
    (tmp_path / "empty.txt").write_text("\n   \n\t\n")
    for name, needle in [("nope.txt", "not found"), ("*.none", "matches"), ("empty.txt", "empty")]:
        with pytest.raises(CorpusError) as e:
            read_text_corpus(str(tmp_path / name))
        assert_one_line_error(e, tmp_path / name, needle)
    assert issubclass(CorpusError, ValueError)


def test_a_directory_given_as_corpus_is_named_a_directory_with_the_glob_to_give(tmp_path):
    """It used to say "corpus file not found" of a directory that exists."""
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    with pytest.raises(CorpusError, match=rf"^corpus path {re.escape(str(corpus))} is a directory: give its files or "
                       rf"a glob in --config\.data\.path \(e\.g\. {re.escape(str(corpus / '*.txt'))}\)$"):
        read_text_corpus(str(corpus))
    with pytest.raises(CorpusError, match=r"matches only directories .*no files: give files or a glob of files in "
                                          r"--data"):
        read_text_corpus(str(corpus / "*"), flag="--data")
    (corpus / "a.txt").write_text("a one.\n")
    assert read_text_corpus(str(corpus / "*")) == [["a one."]]  # a glob's subdirectories are passed over


# ------------------------------------------------------------------------------------------ TFDS

@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """Prepares the dataset as array_record; the builder class is not registered, as for a dataset
    prepared by another job: reading it by name must go through the prepared directory."""
    tfds = pytest.importorskip("tensorflow_datasets")
    data_dir = tmp_path_factory.mktemp("tfds")
    with tfds.core.registered.skip_registration():
        builder_cls = tfds_builder_class(tfds)
    builder_cls(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return data_dir


def test_read_tfds_corpus_round_trip(tfds_dir):
    docs = read_tfds_corpus("pretrain_test_corpus", data_dir=str(tfds_dir))
    expected = [[f"Document {i} first line.", f"Document {i} second line."] for i in range(7)]
    assert sorted(docs) == expected  # array_record stores examples in a hashed (shuffled) order
    assert all(isinstance(line, str) for doc in docs for line in doc)
    read = functools.partial(read_tfds_corpus, "pretrain_test_corpus", data_dir=str(tfds_dir))
    assert read() == docs  # same order every time
    assert read(max_documents=3) == docs[:3]
    assert len(read(split="train[:4]")) == 4


def test_read_tfds_corpus_errors(tfds_dir):
    for name, kwargs, needles in [
        ("pretrain_test_corpus", {"text_key": "body"}, ("body", "text")),
        ("pretrain_test_corpus", {"split": "dev"}, ("dev", "train")),
        ("no_such_dataset_xyz", {}, ("no_such_dataset_xyz",)),
    ]:
        with pytest.raises(CorpusError) as e:
            read_tfds_corpus(name, data_dir=str(tfds_dir), **kwargs)
        assert_one_line_error(e, *needles)


def test_read_tfds_corpus_prepares_registered_builder(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    tfds_builder_class(tfds)  # registers "pretrain_test_corpus" for this process
    try:
        docs = read_tfds_corpus("pretrain_test_corpus", data_dir=str(tmp_path))  # not prepared yet
        assert len(docs) == 7
        info = json.loads(next(tmp_path.glob("pretrain_test_corpus/*/dataset_info.json")).read_text())
        assert info["fileFormat"] == "array_record"
    finally:
        tfds.core.registered._DATASET_REGISTRY.pop("pretrain_test_corpus", None)


def test_read_tfds_corpus_tfrecord_without_tensorflow(tfds_dir, tmp_path):
    if importlib.util.find_spec("tensorflow"):
        pytest.skip("tensorflow is installed: tfrecord datasets are readable")
    shutil.copytree(tfds_dir, tmp_path, dirs_exist_ok=True)
    info_path = next(tmp_path.glob("pretrain_test_corpus/*/dataset_info.json"))
    info = json.loads(info_path.read_text())
    info["fileFormat"] = "tfrecord"  # as if prepared with TFDS's default format
    info_path.write_text(json.dumps(info))
    with pytest.raises(CorpusError) as e:
        read_tfds_corpus("pretrain_test_corpus", data_dir=str(tmp_path))
    assert_one_line_error(e, "pip install tensorflow", "array_record")


# ------------------------------------------------------------------------------------ tokenizers

@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(WORDPIECE_VOCAB) + "\n")
    return path


def test_wordpiece(vocab_file):
    tok = load_tokenizer("wordpiece", str(vocab_file))
    ids = tok.encode("Unaffable FOX jumped.")
    assert [tok.id_to_piece(i) for i in ids] == ["un", "##aff", "##able", "fox", "jump", "##ed", "."]
    assert tok.word_start[ids].tolist() == [True, False, False, True, True, False, True]
    assert tok.decode(ids) == "unaffable fox jumped."
    assert tok.encode_batch(["hello world", "zebra"]) == [[16, 17], [tok.unk_id]]
    assert (tok.vocab_size, tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (
        len(WORDPIECE_VOCAB),
        0,
        2,
        3,
        4,
        5,
    )
    assert tok.special_ids == (0, 1, 3, 4, 5)  # [unused0] yes, [UNK] no: it is a real token
    assert tok.word_start.shape == (tok.vocab_size,) and tok.word_start.dtype == bool
    assert tok.encode("[MASK]") != [tok.mask_id]  # corpus text never turns into a special
    assert load_tokenizer("wordpiece", str(vocab_file.parent)).vocab_size == tok.vocab_size
    assert load_tokenizer("wordpiece", str(vocab_file), lowercase=False).encode("FOX") == [2]


def test_tokenizer_errors(tmp_path, vocab_file):
    vocab_file.write_text("\n".join(w for w in WORDPIECE_VOCAB if w != "[MASK]"))
    for kind, path, needle in [
        ("wordpiece", tmp_path / "missing.txt", "not found"),
        ("wordpiece", vocab_file, "[MASK]"),
        ("sentencepiece", tmp_path / "spm.model", "train_tokenizer"),
        ("bpe", vocab_file, "kind"),
    ]:
        with pytest.raises(TokenizerError) as e:
            load_tokenizer(kind, str(path))
        assert_one_line_error(e, needle, path if kind != "bpe" else "bpe")


def test_a_sentencepiece_model_given_as_wordpiece_names_the_right_kind(tmp_path):
    """Before: a traceback from tokenizers ("stream did not contain valid UTF-8")."""
    text = tmp_path / "text.txt"
    text.write_text("".join(f"the quick brown fox {i} jumps over the lazy dog {i * 7}\n" for i in range(200)))
    model = train_tokenizer.train_sentencepiece([str(text)], str(tmp_path / "spm"), vocab_size=50)
    with pytest.raises(TokenizerError) as e:
        load_tokenizer("wordpiece", model)
    assert_one_line_error(e, model, "SentencePiece model", "--config.tokenizer.kind=sentencepiece")
    binary = tmp_path / "vocab.bin"  # binary, but no SentencePiece model: not called one
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(TokenizerError) as e:
        load_tokenizer("wordpiece", str(binary))
    assert_one_line_error(e, binary, "not a text vocabulary", "vocab.txt")
    assert "kind=sentencepiece" not in str(e.value)
    latin1 = tmp_path / "latin1.txt"  # text, but not UTF-8
    latin1.write_bytes("\n".join(WORDPIECE_VOCAB + ["caf\xe9"]).encode("latin-1"))
    with pytest.raises(TokenizerError) as e:
        load_tokenizer("wordpiece", str(latin1))
    assert_one_line_error(e, latin1, "UTF-8", "vocab.txt")


def test_tokenize_documents(vocab_file):
    tok = load_tokenizer("wordpiece", str(vocab_file))
    docs = [["hello world", "", "the quick fox"], ["  "], ["jumped"]]
    out = tokenize_documents(docs, tok)
    assert [[s.tolist() for s in d] for d in out] == [[[16, 17], [6, 7, 8]], [[12, 13]]]
    assert all(s.dtype == np.int32 for d in out for s in d)
    with pytest.raises(CorpusError):
        tokenize_documents([[""], [" "]], tok)


# --------------------------------------------------------------------------- demo corpus + spm


@pytest.fixture(scope="module")
def demo_corpus(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("demo") / "corpus.txt")
    return path, build_corpus(path, max_mb=0.5)


def test_demo_corpus_is_small_english_sentences_counted_by_its_statistics(demo_corpus):
    path, stats = demo_corpus
    assert os.path.getsize(path) == stats["bytes"] <= 0.5e6
    docs = read_text_corpus(path)
    assert len(docs) == stats["documents"] >= 50
    sentences = [s for d in docs for s in d]
    assert len(sentences) == stats["sentences"] and not any(">>>" in s for s in sentences)
    words = re.findall(r"[a-z]+", " ".join(sentences).lower())
    for common in ("the", "is", "of", "a", "to"):  # English: function words dominate
        assert words.count(common) > 0.005 * len(words), common
    assert min(len(s) for s in sentences) >= 20


def test_sentences_of_drops_code():
    doc = (
        "Compute the thing for you.  It wraps\nacross lines. Short.\n\n"
        "Example::\n\n    x = compute(1)\n    print(x)\n\n>>> compute(2)\n4\n\n"
        "if not expression: raise AssertionError(expression)\n\n"
        "Returns the result as an integer value.\n--------\n"
    )
    assert sentences_of(doc) == [
        "Compute the thing for you.",
        "It wraps across lines.",
        "Returns the result as an integer value.",
    ]


@pytest.fixture(scope="module")
def spm_model(demo_corpus, tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("spm") / "spm")
    return train_tokenizer.train_sentencepiece([demo_corpus[0]], prefix, vocab_size=400)


def test_sentencepiece(spm_model):
    tok = load_tokenizer("sentencepiece", spm_model)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert [tok.id_to_piece(i) for i in (2, 3, 4)] == ["[CLS]", "[SEP]", "[MASK]"]
    assert tok.vocab_size == 400 and tok.special_ids == (0, 2, 3, 4)
    text = "The interpreter raises an exception when the argument is not a string."
    ids = tok.encode(text)
    assert tok.decode(ids) == text.lower()  # uncased by default
    assert tok.decode([tok.cls_id] + ids + [tok.sep_id]) == text.lower()  # specials print nothing
    assert tok.encode_batch([text, "Another one."]) == [ids, tok.encode("another one.")]
    assert tok.encode("[MASK]") != [tok.mask_id]  # a control symbol: never produced from text
    # word_start: one True per word of this all-ASCII sentence, at pieces that begin with '▁'.
    starts = tok.word_start[ids]
    assert starts.sum() == len(text.split())
    assert starts.tolist() == [tok.id_to_piece(i).startswith("\u2581") for i in ids]
    assert tok.word_start[list(tok.special_ids) + [tok.unk_id]].all()
    assert load_tokenizer("sentencepiece", spm_model[: -len(".model")]).vocab_size == 400


def test_train_tokenizer_cli(demo_corpus, tmp_path, capsys):
    prefix = str(tmp_path / "out" / "bpe")
    train_tokenizer.main(
        [
            "--input",
            demo_corpus[0],
            "--model_prefix",
            prefix,
            "--vocab_size",
            "300",
            "--model_type",
            "bpe",
            "--no-lowercase",
        ]
    )
    assert capsys.readouterr().out.strip() == prefix + ".model"
    tok = load_tokenizer("sentencepiece", prefix + ".model", lowercase=False)
    assert tok.mask_id == 4 and tok.decode(tok.encode("The Python")) == "The Python"
    with pytest.raises(CorpusError) as e:  # more pieces than the text can give
        train_tokenizer.train_sentencepiece([demo_corpus[0]], prefix, vocab_size=10_000_000)
    assert_one_line_error(e, "vocab_size")
