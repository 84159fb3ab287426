"""GPT tokenizers: `gpt2_bpe` encodes and decodes exactly as transformers' GPT2Tokenizer and as GPT-2's original
pure-Python BPE; `char` is nanoGPT's shakespeare_char vocabulary. Errors are one line naming the fix.

No GPT-2 vocabulary is available offline, so the module trains a small byte-level BPE (all 256 byte symbols,
<|endoftext|> as the LAST id like GPT-2's 50256) on tinyshakespeare + SST-2 and compares on that.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import transformers
from tokenizers import ByteLevelBPETokenizer

from pretrain.data import tokenizers
from tests.helpers.paths import SHARED_DATA

SHAKESPEARE = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")
SST2_DEV = os.path.join(SHARED_DATA, "glue", "SST-2", "dev.tsv")
EOS = "<|endoftext|>"
VOCAB_SIZE = 700  # before <|endoftext|>

EDGE_CASES = [
    "", " ", "  ", "\n", "\n\n", "\t", " \n ", "Hello world", " Hello world", "Hello world ", "Hello   world",
    "   leading", "trailing   ", "a\nb\n\nc  \n  d", "line one\r\nline two", "I'm, you're, we'll, it's, I'd.",
    "Don't SHOUT", "numbers 12345 and 3.14159", "naïve café — résumé", "Ελληνικά", "日本語のテキスト", "中文",
    "emoji 😀👍🏽 and flags 🇫🇷", "zero\u200bwidth", "tabs\tand\u00a0nbsp", "$%^&*()_+-=[]{}|;:'\",.<>/?`~",
    f"x{EOS}y", f"{EOS}", f"one {EOS} two", f"{EOS}{EOS}", f"  {EOS}  ", f"<|endoftext| {EOS}>", "<|endoftext",
    "<extra_id_0> is text here",
]


def _shakespeare() -> str:
    with open(SHAKESPEARE, encoding="utf-8") as f:
        return f.read()


def _sst2_sentences() -> list[str]:
    with open(SST2_DEV, encoding="utf-8") as f:
        return [line.split("\t")[0] for line in f.read().splitlines()[1:]]


def _texts() -> list[str]:
    """Edge cases, Shakespeare lines and multi-line chunks, SST-2 sentences (with their spaces as they are)."""
    text = _shakespeare()
    lines = text.splitlines()[:400:2]
    chunks = [text[i:i + 300] for i in range(0, 30_000, 1_000)]
    return EDGE_CASES + lines + chunks + _sst2_sentences()[:300]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> str:
    """vocab.json + merges.txt of a byte-level BPE laid out as GPT-2's: byte symbols + merges, then <|endoftext|>."""
    directory = str(tmp_path_factory.mktemp("gpt2_bpe"))
    bpe = ByteLevelBPETokenizer()  # its trainer starts from ByteLevel.alphabet(): all 256 bytes, as GPT-2
    bpe.train_from_iterator([_shakespeare(), *_sst2_sentences()], vocab_size=VOCAB_SIZE, show_progress=False)
    bpe.save_model(directory)
    vocab_file = os.path.join(directory, "vocab.json")
    with open(vocab_file, encoding="utf-8") as f:
        vocab = json.load(f)
    vocab[EOS] = len(vocab)
    with open(vocab_file, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    return directory


@pytest.fixture(scope="module")
def ours(gpt2_dir) -> tokenizers.Tokenizer:
    return tokenizers.load_tokenizer("gpt2_bpe", gpt2_dir, lowercase=False)


@pytest.fixture(scope="module")
def hf(gpt2_dir):
    """transformers' GPT2Tokenizer (in transformers 5 the same class as GPT2TokenizerFast: Rust tokenizers)."""
    return transformers.GPT2Tokenizer.from_pretrained(gpt2_dir)


@pytest.fixture(scope="module")
def hf_fast(gpt2_dir):
    return transformers.GPT2TokenizerFast.from_pretrained(gpt2_dir)


@pytest.fixture(scope="module")
def python_reference(gpt2_dir):
    """GPT-2's pure-Python BPE (openai/gpt-2 encoder.py; transformers 4's slow GPT2Tokenizer): transformers 5 keeps
    it verbatim (bytes_to_unicode, the regex, bpe()) only in ClvpTokenizer, whose English number normalizer we
    switch off. Its PythonBackend splits out added special tokens as the slow GPT2Tokenizer did."""
    from transformers.models.clvp.tokenization_clvp import ClvpTokenizer
    ref = ClvpTokenizer(os.path.join(gpt2_dir, "vocab.json"), os.path.join(gpt2_dir, "merges.txt"),
                        unk_token=EOS, bos_token=EOS, eos_token=EOS, pad_token=EOS)
    ref._normalizer = lambda text: text  # noqa: SLF001 (identity: GPT-2 has no normalizer)
    return ref


def _reference_encode(ref, text: str) -> list[int]:
    return ref.encode(text, add_special_tokens=False)


def _reference_decode(ref, ids: list[int]) -> str:
    return ref.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)  # GPT-2 cleans nothing


# ---- gpt2_bpe against the references -------------------------------------------------------------------


def test_encode_matches_transformers_and_python_bpe(ours, hf, hf_fast, python_reference):
    texts = _texts()
    got = ours.encode_batch(texts)
    assert got == [ours.encode(t) for t in texts[:50]] + got[50:]  # batch and single calls agree
    for reference in (hf, hf_fast, python_reference):
        want = [_reference_encode(reference, t) for t in texts]
        mismatches = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
        assert not mismatches, f"{type(reference).__name__}: {len(mismatches)} differ, first {mismatches[0]}"
    assert sum(map(len, got)) > 2 * len(texts)  # real pieces, not a degenerate vocabulary


def test_decode_round_trips_and_matches_references(ours, hf, python_reference):
    for text in _texts():
        ids = ours.encode(text)
        assert ours.decode(ids) == text
        assert ours.decode(ids) == _reference_decode(hf, ids) == _reference_decode(python_reference, ids)


def test_decode_of_cut_characters_matches_references(ours, hf, python_reference):
    """A piece can end mid-UTF-8 character (one emoji is 4 byte symbols): GPT-2 decodes with errors='replace'."""
    for i in range(ours.vocab_size):
        assert ours.decode([i]) == _reference_decode(hf, [i]) == _reference_decode(python_reference, [i]), i
    assert len(ours.encode("😀")) == 4  # the corpus has no emoji: one piece per byte
    cut = ours.encode("emoji 😀")[:-1]
    assert ours.decode(cut) == _reference_decode(python_reference, cut) == "emoji \ufffd"


def test_literal_endoftext_is_the_eos_id(ours, hf):
    ids = ours.encode(f"a{EOS}b")
    assert ids.count(ours.eos_id) == 1 and ids == _reference_encode(hf, f"a{EOS}b")
    assert ours.decode([ours.eos_id]) == EOS
    assert ours.eos_id not in ours.encode("<|endoftext|")  # only the whole token is special


def test_specials_follow_gpt2(ours, hf, gpt2_dir):
    assert ours.vocab_size == len(hf) == VOCAB_SIZE + 1
    assert ours.eos_id == hf.eos_token_id == hf.convert_tokens_to_ids(EOS) == VOCAB_SIZE  # last id, as 50256
    assert ours.pad_id == ours.eos_id  # GPT-2 has no pad: the Hugging Face convention
    assert ours.unk_id == hf.unk_token_id == ours.eos_id
    assert ours.special_ids == (ours.eos_id,)
    for name in ("cls_id", "sep_id", "mask_id"):
        with pytest.raises(tokenizers.MissingTokenError, match="no \\["):
            getattr(ours, name)
    pieces = hf.convert_ids_to_tokens(list(range(ours.vocab_size)))
    assert [ours.id_to_piece(i) for i in range(ours.vocab_size)] == pieces
    want_word_start = np.array([p.startswith("\u0120") for p in pieces])
    want_word_start[ours.eos_id] = True
    np.testing.assert_array_equal(ours.word_start, want_word_start)
    assert 10 < want_word_start.sum() < ours.vocab_size - 10  # both kinds of piece exist
    assert "gpt2_bpe" in tokenizers.TOKENIZERS.names() and f"{EOS}={VOCAB_SIZE}" in repr(ours)


def test_lowercase_flag_is_ignored(gpt2_dir, hf):
    lowered = tokenizers.load_tokenizer("gpt2_bpe", gpt2_dir, lowercase=True)
    assert lowered.encode("Hello ROMEO") == _reference_encode(hf, "Hello ROMEO")


def test_extra_ids_append_sentinels(gpt2_dir, ours, hf):
    t5_style = tokenizers.load_tokenizer("gpt2_bpe", gpt2_dir, lowercase=False, extra_ids=3)
    assert t5_style.vocab_size == ours.vocab_size + 3 and t5_style.sentinel_id(0) == ours.vocab_size + 2
    text = "the king <extra_id_0> his crown<extra_id_2>\n"
    ids = t5_style.encode(text)
    want = (_reference_encode(hf, "the king ") + [t5_style.sentinel_id(0)] + _reference_encode(hf, " his crown")
            + [t5_style.sentinel_id(2)] + _reference_encode(hf, "\n"))
    assert ids == want
    assert t5_style.decode(ids) == text
    assert set(t5_style.special_ids) == {ours.eos_id, *range(ours.vocab_size, ours.vocab_size + 3)}
    assert t5_style.word_start[-3:].all()


def test_tokenizer_json_and_transformers_save_pretrained_dirs(gpt2_dir, ours, hf, tmp_path):
    """transformers 5's save_pretrained writes tokenizer.json (+ config) only; a directory with it or the file
    itself load too, and vocab.json given as a file means its directory."""
    saved = tmp_path / "saved"
    hf.save_pretrained(saved)
    assert not (saved / "vocab.json").exists()  # if transformers writes it again, the tokenizer.json path is moot
    texts = _texts()[:80]
    for path in (str(saved), str(saved / "tokenizer.json"), os.path.join(gpt2_dir, "vocab.json")):
        loaded = tokenizers.load_tokenizer("gpt2_bpe", path, lowercase=False)
        assert loaded.encode_batch(texts) == ours.encode_batch(texts), path
        assert (loaded.eos_id, loaded.pad_id, loaded.vocab_size) == (ours.eos_id, ours.pad_id, ours.vocab_size)
        assert loaded.decode(loaded.encode(texts[-1])) == texts[-1]


def test_hugging_face_gpt2_directory_loads_as_a_language_model(gpt2_dir, ours, hf, tmp_path):
    """pretrain.training.pretrained's HF branch names kind='gpt2_bpe' with the model's directory: the real loader works."""
    import torch

    from pretrain.lm.language_model import load_language_model
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(hf), n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                     bos_token_id=hf.eos_token_id, eos_token_id=hf.eos_token_id)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    hf.save_pretrained(tmp_path)
    lm = load_language_model(str(tmp_path))
    assert isinstance(lm.tokenizer, tokenizers.GPT2BPETokenizer)
    assert lm.tokenizer.vocab_size == lm.config.vocab_size == len(hf)
    assert lm.tokenizer.encode(" To be, or not") == ours.encode(" To be, or not")


# ---- gpt2_bpe errors: one line naming the file and the fix ---------------------------------------------


def _error(kind: str, path: str, **kwargs) -> str:
    with pytest.raises(tokenizers.TokenizerError) as info:
        tokenizers.load_tokenizer(kind, path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_gpt2_bpe_errors(gpt2_dir, tmp_path):
    assert "not found" in _error("gpt2_bpe", str(tmp_path / "nowhere")) and "--config.tokenizer.path" in \
        _error("gpt2_bpe", str(tmp_path / "nowhere"))
    empty = tmp_path / "empty"
    empty.mkdir()
    message = _error("gpt2_bpe", str(empty))
    assert "vocab.json or merges.txt" in message and "tokenizer.json" in message

    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(os.path.join(gpt2_dir, "vocab.json"), half)
    message = _error("gpt2_bpe", str(half))
    assert "no merges.txt" in message and "vocab.json +" in message

    with open(os.path.join(gpt2_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    no_eos = tmp_path / "no_eos"
    no_eos.mkdir()
    shutil.copy(os.path.join(gpt2_dir, "merges.txt"), no_eos)
    (no_eos / "vocab.json").write_text(json.dumps({k: v for k, v in vocab.items() if k != EOS}))
    assert f"no {EOS} token" in _error("gpt2_bpe", str(no_eos))

    no_bytes = tmp_path / "no_bytes"  # a vocabulary that cannot spell every byte would drop text silently
    no_bytes.mkdir()
    (no_bytes / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "\u0120": 2, EOS: 3}))
    (no_bytes / "merges.txt").write_text("#version: 0.2\n")
    assert "lacks 253 of the 256 byte symbols" in _error("gpt2_bpe", str(no_bytes))

    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(os.path.join(gpt2_dir, "merges.txt"), broken)
    (broken / "vocab.json").write_text("{not json")
    assert "cannot read GPT-2 vocabulary" in _error("gpt2_bpe", str(broken))

    wordpiece_json = tmp_path / "wordpiece" / "tokenizer.json"
    wordpiece_json.parent.mkdir()
    transformers.BertTokenizer(vocab_file=_bert_vocab(tmp_path)).save_pretrained(wordpiece_json.parent)
    assert "WordPiece model, not GPT-2's byte-level BPE" in _error("gpt2_bpe", str(wordpiece_json.parent))

    assert "gpt2_bpe" in _error("gpt2", gpt2_dir)  # the unknown-kind message lists it


def _bert_vocab(tmp_path) -> str:
    path = tmp_path / "bert_vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "king"]) + "\n")
    return str(path)


# ---- char: nanoGPT's shakespeare_char --------------------------------------------------------------------


def test_char_vocabulary_is_nanogpts(tmp_path):
    """data/shakespeare_char/prepare.py: chars = sorted(list(set(data))), stoi = {ch: i}, 65 characters."""
    data = _shakespeare()
    chars = sorted(set(data))
    stoi = {ch: i for i, ch in enumerate(chars)}
    char = tokenizers.load_tokenizer("char", SHAKESPEARE)
    assert char.vocab_size == len(chars) == 65 and char.pad_id == 0 and char.special_ids == ()
    sample = data[:5_000]
    ids = char.encode(sample)
    assert ids == [stoi[c] for c in sample]
    assert char.decode(ids) == sample
    assert [char.id_to_piece(i) for i in range(65)] == chars
    assert char.encode_batch(["First", "ROMEO:\n"]) == [[stoi[c] for c in "First"], [stoi[c] for c in "ROMEO:\n"]]


def test_char_errors_are_one_line(tmp_path):
    char = tokenizers.load_tokenizer("char", SHAKESPEARE)
    with pytest.raises(tokenizers.UnknownTextError, match="'é'") as info:
        char.encode("café")
    assert "\n" not in str(info.value)
    for name in ("eos_id", "unk_id", "cls_id"):
        with pytest.raises(tokenizers.MissingTokenError):
            getattr(char, name)
    message = _error("char", str(tmp_path / "missing.txt"))
    assert "not found" in message and "missing.txt" in message
    (tmp_path / "empty.txt").write_text("")
    assert "is empty" in _error("char", str(tmp_path / "empty.txt"))


def test_char_extra_ids(tmp_path):
    char = tokenizers.load_tokenizer("char", SHAKESPEARE, extra_ids=2)
    stoi = {ch: i for i, ch in enumerate(sorted(set(_shakespeare())))}
    ids = char.encode("ab<extra_id_1>c")
    assert ids == [stoi["a"], stoi["b"], 65, stoi["c"]]  # <extra_id_1> = vocab_size - 1 - 1
    assert char.vocab_size == 67 and char.decode(ids) == "ab<extra_id_1>c"
