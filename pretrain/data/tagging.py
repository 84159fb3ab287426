"""Word-level BIO tags <-> sub-word features for token classification (NER, POS; J&M sec. 11.3.3).

Tagging data is labelled per word, while the encoder sees WordPiece / SentencePiece pieces:
'Mt. Sanitas' -> 'mt', '.', 'san', '##itas'. For training, the word's tag goes on its first piece
and the continuation pieces are ignored (-100), as BERT does for CoNLL-2003; J&M's variant copies
the tag onto every piece (`label_all_subwords`). For decoding, a word takes the tag predicted at
its first piece ("the argmax BIO tag associated with the first subword token of a word").
"""
from __future__ import annotations

import numpy as np

IGNORE = -100  # the label loss functions skip (objectives/task_heads/base.py)


def align_word_labels(tokenizer, words: list[str], word_labels: list[int], max_seq_length: int, *,
                      label_all_subwords: bool = False) -> dict[str, np.ndarray]:
    """[CLS] w1-pieces w2-pieces ... [SEP] with labels on sub-words.

    Each word is encoded on its own, so its pieces are exactly its own even when the tokenizer
    would merge across spaces; a word that encodes to nothing (e.g. only control characters)
    becomes [UNK] so every word keeps a position to carry its tag. Pieces past max_seq_length - 2
    are dropped (a word may keep only its first pieces; words with none left decode to 'O').

    Returns [max_seq_length] int32 arrays: input_ids (padded with pad_id), segment_ids (0),
    input_mask (1 real / 0 pad), labels (word label on first pieces; -100 on continuation pieces
    unless label_all_subwords, on [CLS]/[SEP] and padding) and word_index (the word whose first
    piece sits here, -1 elsewhere) for `decode_word_tags`.
    """
    if len(words) != len(word_labels):
        raise ValueError(f"align_word_labels: {len(words)} words but {len(word_labels)} labels")
    if max_seq_length < 2:
        raise ValueError(f"align_word_labels: max_seq_length={max_seq_length} leaves no room for [CLS] [SEP]")
    ids, labels, word_index = [tokenizer.cls_id], [IGNORE], [-1]
    for w, (pieces, label) in enumerate(zip(tokenizer.encode_batch(list(words)) if words else [], word_labels)):
        pieces = pieces or [tokenizer.unk_id]
        ids += pieces
        labels += [label] + [label if label_all_subwords else IGNORE] * (len(pieces) - 1)
        word_index += [w] + [-1] * (len(pieces) - 1)
    keep = max_seq_length - 1  # room for the closing [SEP]
    ids, labels, word_index = ids[:keep] + [tokenizer.sep_id], labels[:keep] + [IGNORE], word_index[:keep] + [-1]
    pad = max_seq_length - len(ids)

    def as_array(x, fill):
        return np.asarray(x + [fill] * pad, np.int32)
    return {"input_ids": as_array(ids, tokenizer.pad_id), "segment_ids": np.zeros(max_seq_length, np.int32),
            "input_mask": as_array([1] * len(ids), 0), "labels": as_array(labels, IGNORE),
            "word_index": as_array(word_index, -1)}


def piece_ids(row: dict[str, np.ndarray]) -> list[int]:
    """The real ids of an align_word_labels row: [CLS] pieces [SEP], without the padding."""
    return row["input_ids"][:row["input_mask"].sum()].tolist()


def decode_word_tags(token_tags: np.ndarray, word_index: np.ndarray, num_words: int) -> list[int]:
    """Word tags from token tags [L]: each word takes the tag at its first piece (word_index [L]).

    Tags predicted on continuation pieces, specials and padding are ignored; words cut off by
    truncation have no piece and get the 'O' id 0.
    """
    token_tags, word_index = np.asarray(token_tags), np.asarray(word_index)
    tags = np.zeros(num_words, np.int64)
    starts = (word_index >= 0) & (word_index < num_words)
    tags[word_index[starts]] = token_tags[starts]
    return tags.tolist()


def bio_to_spans(tags: list[str]) -> list[tuple[int, int, str]]:
    """BIO tags -> entity spans (start, end inclusive, type), read the way conlleval reads them.

    A chunk starts at B-X, or at I-X that does not continue a chunk of type X (after O or another
    type), and ends before O, B-* or a change of type. ['B-LOC', 'I-LOC', 'O'] -> [(0, 1, 'LOC')].
    """
    spans, start, kind = [], None, None
    for i, tag in enumerate(list(tags) + ["O"]):  # a final O closes the last chunk
        prefix, _, t = tag.partition("-")
        if tag != "O" and not (prefix in ("B", "I") and t):
            raise ValueError(f"bio_to_spans: tag {tag!r} at {i} is not O, B-TYPE or I-TYPE")
        if start is not None and (prefix != "I" or t != kind):
            spans.append((start, i - 1, kind))
            start = None
        if prefix != "O" and start is None:
            start, kind = i, t
    return spans
