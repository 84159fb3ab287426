"""BIO tags <-> sub-words on J&M's example (11.14): first-piece labels, decoding, truncation, chunks."""
from __future__ import annotations

import numpy as np
import pytest

from pretrain.data.tagging import align_word_labels, bio_to_spans, decode_word_tags
from pretrain.data.tokenizers import load_tokenizer

VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
         "mt", ".", "san", "##itas", "is", "in", "sun", "##shine", "canyon"]
WORDS = ["Mt.", "Sanitas", "is", "in", "Sunshine", "Canyon", "."]
TAGS = ["O", "B-LOC", "I-LOC"]
WORD_TAGS = ["B-LOC", "I-LOC", "O", "O", "B-LOC", "I-LOC", "O"]
WORD_LABELS = [TAGS.index(t) for t in WORD_TAGS]  # [1, 2, 0, 0, 1, 2, 0]
X = -100


@pytest.fixture
def tok(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return load_tokenizer("wordpiece", str(path))


def pieces(tok, ids, mask):
    return [tok.id_to_piece(i) for i, m in zip(ids, mask) if m]


def test_labels_on_first_subwords(tok):
    f = align_word_labels(tok, WORDS, WORD_LABELS, 16)
    assert all(v.shape == (16,) and v.dtype == np.int32 for v in f.values())
    # "Mt." is one word of two pieces: its '.' is a continuation, as '##itas' and '##shine' are.
    assert pieces(tok, f["input_ids"], f["input_mask"]) == [
        "[CLS]", "mt", ".", "san", "##itas", "is", "in", "sun", "##shine", "canyon", ".", "[SEP]"]
    assert f["input_mask"].tolist() == [1] * 12 + [0] * 4
    assert f["input_ids"][12:].tolist() == [tok.pad_id] * 4
    assert f["segment_ids"].tolist() == [0] * 16
    assert f["labels"].tolist() == [X, 1, X, 2, X, 0, 0, 1, X, 2, 0, X] + [X] * 4
    assert f["word_index"].tolist() == [-1, 0, -1, 1, -1, 2, 3, 4, -1, 5, 6, -1] + [-1] * 4


def test_label_all_subwords_copies_the_word_label(tok):
    f = align_word_labels(tok, WORDS, WORD_LABELS, 16, label_all_subwords=True)
    assert f["labels"].tolist() == [X, 1, 1, 2, 2, 0, 0, 1, 1, 2, 0, X] + [X] * 4
    # The decoding map does not change with the training variant.
    assert f["word_index"].tolist() == align_word_labels(tok, WORDS, WORD_LABELS, 16)["word_index"].tolist()


def test_decode_reads_the_first_subword_only(tok):
    f = align_word_labels(tok, WORDS, WORD_LABELS, 16)
    rng = np.random.default_rng(0)
    token_tags = rng.integers(0, 3, 16)            # noise everywhere ...
    first = f["word_index"] >= 0
    token_tags[first] = np.asarray(WORD_LABELS)[f["word_index"][first]]  # ... but the first pieces
    token_tags[[2, 4, 8]] = [0, 1, 0]              # continuation pieces that disagree with their word
    assert decode_word_tags(token_tags, f["word_index"], len(WORDS)) == WORD_LABELS
    token_tags[3] = 0                              # 'san' now says O: so does 'Sanitas'
    assert decode_word_tags(token_tags, f["word_index"], len(WORDS))[1] == 0


def test_truncation_keeps_whole_pieces_and_decodes_lost_words_as_o(tok):
    f = align_word_labels(tok, WORDS, WORD_LABELS, 5)  # room for 3 pieces: mt . san
    assert pieces(tok, f["input_ids"], f["input_mask"]) == ["[CLS]", "mt", ".", "san", "[SEP]"]
    assert f["labels"].tolist() == [X, 1, X, 2, X]
    assert f["word_index"].tolist() == [-1, 0, -1, 1, -1]
    token_tags = np.asarray([2, 1, 2, 2, 1])
    assert decode_word_tags(token_tags, f["word_index"], len(WORDS)) == [1, 2, 0, 0, 0, 0, 0]
    assert align_word_labels(tok, WORDS, WORD_LABELS, 2)["input_ids"].tolist() == [tok.cls_id, tok.sep_id]


def test_words_without_pieces_and_errors(tok):
    f = align_word_labels(tok, ["is", "", "zebra"], [1, 2, 0], 8)
    # An empty word becomes [UNK] so it keeps a position (and a tag); unknown words are [UNK] anyway.
    assert pieces(tok, f["input_ids"], f["input_mask"]) == ["[CLS]", "is", "[UNK]", "[UNK]", "[SEP]"]
    assert f["labels"][:5].tolist() == [X, 1, 2, 0, X]
    assert align_word_labels(tok, [], [], 4)["input_mask"].tolist() == [1, 1, 0, 0]
    with pytest.raises(ValueError, match="labels"):
        align_word_labels(tok, WORDS, WORD_LABELS[:-1], 16)
    with pytest.raises(ValueError, match="max_seq_length"):
        align_word_labels(tok, WORDS, WORD_LABELS, 1)


def test_bio_to_spans():
    assert bio_to_spans(WORD_TAGS) == [(0, 1, "LOC"), (4, 5, "LOC")]
    # J&M (11.22): a chunk may start with I- after O, as conlleval reads it.
    assert bio_to_spans(["B-PER", "I-PER", "O", "I-ORG", "I-ORG", "I-ORG", "O"]) == [(0, 1, "PER"), (3, 5, "ORG")]
    assert bio_to_spans(["B-LOC", "B-LOC", "I-LOC"]) == [(0, 0, "LOC"), (1, 2, "LOC")]
    assert bio_to_spans(["I-PER", "I-LOC", "B-MISC"]) == [(0, 0, "PER"), (1, 1, "LOC"), (2, 2, "MISC")]
    assert bio_to_spans(["O", "O"]) == [] and bio_to_spans([]) == []
    for bad in (["X-LOC"], ["B"], ["O-LOC"]):
        with pytest.raises(ValueError):
            bio_to_spans(bad)
