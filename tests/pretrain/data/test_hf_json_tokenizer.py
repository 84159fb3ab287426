"""`hf_json` (pretrain/data/tokenizers/hf_json.py): a ModernBERT-shaped tokenizer.json encodes as transformers'
AutoTokenizer does, alone and as the [CLS] a [SEP] b [SEP] pairs fine-tuning builds; its specials are
ModernBERT's; errors are one line. And `tokenizer_json`: our SentencePiece and WordPiece tokenizers written as a
tokenizer.json that AutoTokenizer reads to the same ids.

No ModernBERT tokenizer is available offline: tests/helpers/modernbert.py trains a small byte-level BPE laid out
as its tokenizer.json.
"""
from __future__ import annotations

import os
import shutil

import pytest
import transformers

from pretrain.data import finetune_data, tokenizers
from pretrain.tools.train_tokenizer import train_sentencepiece
from tests.helpers.modernbert import SPECIALS, mrpc_pairs, sst2_sentences, write_modernbert_tokenizer
from tests.helpers.paths import SHARED_DATA

EDGE_CASES = ["", " ", "  ", "\n\n", "Hello world", " Hello world", "Hello   world  ", "a\nb\n\nc  \n  d",
              "I'm, you're, we'll.", "Don't SHOUT", "numbers 12345 and 3.14159", "naïve café — résumé", "Ελληνικά",
              "日本語のテキスト", "emoji 😀👍🏽", "zero\u200bwidth", "tabs\tand\u00a0nbsp", "$%^&*()_+-=[]{}|;:'\",.<>/?`~",
              "e\u0301 (NFD) and é (NFC)", "The capital of France is [MASK].", "[MASK][MASK]", "x [SEP] y [CLS]",
              "four    spaces", "<|endoftext|> ends", "[PAD] [UNK]", "[mask] is text"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("modernbert_tokenizer"))
    write_modernbert_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def ours(tokenizer_dir) -> tokenizers.Tokenizer:
    return tokenizers.load_tokenizer("hf_json", os.path.join(tokenizer_dir, "tokenizer.json"), lowercase=False)


@pytest.fixture(scope="module")
def hf(tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


def _texts() -> list[str]:
    return EDGE_CASES + sst2_sentences()[:300] + [a for pair in mrpc_pairs(50) for a in pair]


def test_encode_matches_autotokenizer(ours, hf):
    texts = _texts()
    expected = [hf(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert ours.encode_batch(texts) == expected
    assert [ours.encode(t) for t in texts[:40]] == expected[:40]
    assert max(map(len, expected)) > 20 and ours.encode("The capital of France is [MASK].")[-2] == ours.mask_id


def test_pairs_and_singles_as_fine_tuning_builds_them_match_autotokenizer(ours, hf):
    pairs = mrpc_pairs(100)
    built = finetune_data.encode_texts(ours, [a for a, _ in pairs], [b for _, b in pairs], max_seq_length=512)
    assert [ids for ids, _ in built] == [hf(a, b)["input_ids"] for a, b in pairs]
    segments = built[0][1]
    assert segments[0] == 0 and segments[-1] == 1  # [CLS] a [SEP] is segment 0, b [SEP] segment 1
    singles = sst2_sentences()[:50]
    built = finetune_data.encode_texts(ours, singles, None, max_seq_length=512)
    assert [ids for ids, _ in built] == [hf(t)["input_ids"] for t in singles]


def test_specials_are_modernberts(ours, hf):
    assert (ours.cls_id, ours.sep_id, ours.mask_id, ours.pad_id, ours.unk_id) == (
        hf.cls_token_id, hf.sep_token_id, hf.mask_token_id, hf.pad_token_id, hf.unk_token_id)
    assert [ours.id_to_piece(ours.vocab_size - 5 + i) for i in range(5)] == list(SPECIALS)
    assert ours.vocab_size == len(hf) and ours.eos_id == ours.sep_id  # no </s>: [SEP] ends sequences
    assert {ours.cls_id, ours.sep_id, ours.mask_id, ours.pad_id} <= set(ours.special_ids)
    assert ours.unk_id not in ours.special_ids  # a real token, as in every kind
    endoftext, spaces = ours.encode("<|endoftext|>")[0], ours.encode("    ")[0]
    assert endoftext in ours.special_ids and spaces not in ours.special_ids  # a non-special added token is text


def test_word_start_marks_pieces_after_a_space(ours):
    ids = ours.encode("the king's horses galloped")
    pieces = [ours.id_to_piece(i) for i in ids]
    assert [bool(ours.word_start[i]) for i in ids] == [p.startswith("\u0120") for p in pieces]
    assert any(not ours.word_start[i] for i in ids[1:])  # some word is split: its continuation is no start
    assert all(ours.word_start[list(ours.special_ids)])


def test_decode_round_trips(ours, hf):
    for text in _texts():
        ids = ours.encode(text)
        assert ours.decode(ids) == hf.decode(ids, clean_up_tokenization_spaces=False)
        if "[MASK]" not in text:  # [MASK] eats the space before it (lstrip), as in ModernBERT's file
            assert ours.decode(ids) == text.replace("e\u0301", "\u00e9")  # NFC


def test_file_and_directory_are_the_same_tokenizer_and_lowercase_does_not_apply(ours, tokenizer_dir, tmp_path):
    same = tokenizers.load_tokenizer("hf_json", tokenizer_dir, lowercase=True)
    text = "Mixed CASE Text"
    assert same.encode(text) == ours.encode(text) and ours.encode(text) != ours.encode(text.lower())
    assert ours.load_options["lowercase"] is None and same.load_options["lowercase"] is None
    copy = tmp_path / "elsewhere.json"
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), copy)
    assert tokenizers.fingerprint(tokenizers.load_tokenizer("hf_json", str(copy))) == tokenizers.fingerprint(ours)
    assert tokenizers.from_config({"kind": "hf_json", "path": tokenizer_dir}).encode(text) == ours.encode(text)
    assert "hf_json" in tokenizers.TOKENIZERS.names()


def _error(path: str) -> str:
    with pytest.raises(tokenizers.TokenizerError) as info:
        tokenizers.load_tokenizer("hf_json", path)
    assert "\n" not in str(info.value)
    return str(info.value)


def _without(tokenizer_dir: str, tmp_path, name: str) -> str:
    """The fixture's tokenizer.json with the added token `name` renamed, so the file no longer has it."""
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        text = f.read()
    path = tmp_path / f"no_{name.strip('[]')}.json"
    path.write_text(text.replace(f'"{name}"', '"[NOPE]"'), encoding="utf-8")
    return str(path)


def test_errors_are_one_line(tokenizer_dir, tmp_path):
    assert "tokenizer.json not found" in _error(str(tmp_path / "nowhere"))
    assert "tokenizer.json not found" in _error(str(tmp_path))  # a directory without one
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\nthe\n")
    assert "is not a Hugging Face tokenizer.json" in _error(str(vocab))
    spm = train_sentencepiece(os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt"), str(tmp_path / "spm"), 300)
    assert "is not a Hugging Face tokenizer.json" in _error(spm)
    assert "has no [PAD] token" in _error(_without(tokenizer_dir, tmp_path, "[PAD]"))

    no_mask = tokenizers.load_tokenizer("hf_json", _without(tokenizer_dir, tmp_path, "[MASK]"))
    no_mask.encode("still encodes")  # [MASK] is needed only where masking is
    with pytest.raises(tokenizers.MissingTokenError) as info:
        _ = no_mask.mask_id
    assert "has no [MASK] piece" in str(info.value) and "as a special token" in str(info.value)
    assert "\n" not in str(info.value)


# ---- tokenizer_json: ours written as a tokenizer.json --------------------------------------------------------


def _through_transformers(text: str, tmp_path):
    path = tmp_path / "converted.json"
    path.write_text(text, encoding="utf-8")
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))


@pytest.mark.parametrize("model_type, lowercase_model, lowercase", [
    ("unigram", True, True), ("bpe", True, True), ("unigram", False, False), ("unigram", False, True)])
def test_a_sentencepiece_model_converts_to_the_same_ids(model_type, lowercase_model, lowercase, tmp_path):
    spm = train_sentencepiece(os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt"), str(tmp_path / "spm"), 800,
                              model_type, lowercase=lowercase_model)
    ours = tokenizers.load_tokenizer("sentencepiece", spm, lowercase=lowercase)
    hf = _through_transformers(tokenizers.tokenizer_json(ours), tmp_path)
    texts = [t for t in _texts() if "[" not in t]  # a literal "[MASK]" is text to sentencepiece, a special to HF
    assert [hf(t, add_special_tokens=False)["input_ids"] for t in texts] == ours.encode_batch(texts)
    pairs = mrpc_pairs(30)
    built = finetune_data.encode_texts(ours, [a for a, _ in pairs], [b for _, b in pairs], max_seq_length=512)
    assert [hf(a, b)["input_ids"] for a, b in pairs] == [ids for ids, _ in built]
    assert [hf(a, b, return_token_type_ids=True)["token_type_ids"] for a, b in pairs] == [segments for _, segments in built]


def test_a_wordpiece_vocab_converts_to_the_same_ids(tmp_path):
    vocab = tmp_path / "vocab.txt"
    words = sorted({w for t in sst2_sentences()[:200] for w in t.lower().split()})
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "##s", "##ing"]) + "\n")
    ours = tokenizers.load_tokenizer("wordpiece", str(vocab), lowercase=True)
    hf = _through_transformers(tokenizers.tokenizer_json(ours), tmp_path)
    texts = sst2_sentences()[:200] + ["Unseen WORDS here", "CAPITALS and accents: café"]
    assert [hf(t, add_special_tokens=False)["input_ids"] for t in texts] == ours.encode_batch(texts)
    assert hf("a b", "c")["input_ids"] == finetune_data.encode_texts(ours, ["a b"], ["c"], 16)[0][0]


def test_tokenizer_json_of_a_hf_json_tokenizer_is_its_file(ours, tokenizer_dir):
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        assert tokenizers.tokenizer_json(ours) == f.read()


def test_a_char_vocabulary_has_no_tokenizer_json(tmp_path):
    text = tmp_path / "chars.txt"
    text.write_text("abc")
    with pytest.raises(tokenizers.TokenizerError, match="has no tokenizer.json form"):
        tokenizers.tokenizer_json(tokenizers.load_tokenizer("char", str(text)))
