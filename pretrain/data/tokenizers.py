"""One tokenizer interface over SentencePiece models and BERT WordPiece vocabularies.

Objectives need more than `encode`: the ids of the specials ([CLS], [SEP], [MASK], pad) to build
and mask batches, the ids masking must never pick, and a per-id "starts a word" table so that
whole-word masking is a vectorised lookup (`tok.word_start[ids]`) rather than string work per token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np

from pretrain.data.sources import CorpusError

CLS, SEP, MASK = "[CLS]", "[SEP]", "[MASK]"
_SPM_WORD_PREFIX = "\u2581"  # '▁': SentencePiece marks a word's first piece with it
_BRACKETED = re.compile(r"^\[[^\[\]]+\]$")  # [PAD], [unused17], ...: BERT vocab control tokens


class Tokenizer:
    """Text <-> ids. Special tokens are never added by `encode`; objectives place them."""

    vocab_size: int
    pad_id: int
    unk_id: int  # a real token: it may be masked and predicted, so it is not in special_ids
    cls_id: int
    sep_id: int
    mask_id: int
    special_ids: tuple[int, ...]  # ids MLM must never select for prediction
    word_start: np.ndarray  # [vocab_size] bool: True if the piece begins a word (or is special)

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def id_to_piece(self, i: int) -> str:
        raise NotImplementedError

    def _finish(self, specials: set[int], word_start: np.ndarray):
        self.special_ids = tuple(sorted(specials))
        word_start[list(self.special_ids)] = True  # a special is its own "word"
        self.word_start = word_start

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self.vocab_size}, pad={self.pad_id},"
            f" unk={self.unk_id}, cls={self.cls_id}, sep={self.sep_id}, mask={self.mask_id})"
        )


class SentencePieceTokenizer(Tokenizer):
    """A model from scripts/train_tokenizer.py: pad=0, unk=1, [CLS]=2, [SEP]=3, [MASK]=4."""

    def __init__(self, path: str, *, lowercase: bool = True):
        import sentencepiece as spm

        try:
            self._sp = spm.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as e:
            raise CorpusError(
                f"cannot load sentencepiece model {path}: {str(e).splitlines()[0]} (train one with"
                " scripts/train_tokenizer.py)"
            ) from None
        self._lowercase = lowercase
        sp = self._sp
        self.vocab_size = sp.get_piece_size()
        self.pad_id, self.unk_id = sp.pad_id(), sp.unk_id()
        if self.pad_id < 0:
            raise CorpusError(
                f"sentencepiece model {path} has no pad piece (retrain it with"
                " scripts/train_tokenizer.py, which sets pad_id=0)"
            )
        # By name, not by number: a model trained elsewhere may order its specials differently.
        self.cls_id, self.sep_id, self.mask_id = (self._lookup(path, p) for p in (CLS, SEP, MASK))

        pieces = [sp.id_to_piece(i) for i in range(self.vocab_size)]
        word_start = np.array([p.startswith(_SPM_WORD_PREFIX) for p in pieces], bool)
        word_start[self.unk_id] = True  # <unk> stands for whole unknown characters
        controls = {i for i in range(self.vocab_size) if sp.is_control(i)}
        self._finish(controls | {self.pad_id, self.cls_id, self.sep_id, self.mask_id}, word_start)

    def _lookup(self, path: str, piece: str) -> int:
        i = self._sp.piece_to_id(piece)  # unknown pieces map to unk_id, so check the round trip
        if self._sp.id_to_piece(i) != piece:
            raise CorpusError(
                f"sentencepiece model {path} has no {piece} piece (retrain it with"
                " scripts/train_tokenizer.py, which adds [CLS] [SEP] [MASK])"
            )
        return i

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._lowercase:
            texts = [t.lower() for t in texts]
        return self._sp.encode(list(texts), out_type=int)  # C++ threads over the batch

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))


class WordPieceTokenizer(Tokenizer):
    """A BERT vocab.txt, tokenized as BERT does (BertNormalizer + BertPreTokenizer + WordPiece)."""

    def __init__(self, path: str, *, lowercase: bool = True):
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, normalizers, pre_tokenizers

        if os.path.isdir(path):  # a model directory (e.g. a Hugging Face checkpoint) holds vocab.txt
            path = os.path.join(path, "vocab.txt")
        if not os.path.isfile(path):
            raise CorpusError(
                f"WordPiece vocab not found: {path} (give a BERT vocab.txt, one token"
                " per line, in --config.tokenizer.path)"
            )
        vocab = models.WordPiece.read_file(path)
        for name in ("[PAD]", "[UNK]", CLS, SEP, MASK):
            if name not in vocab:
                raise CorpusError(
                    f"WordPiece vocab {path} has no {name} token (use a BERT vocab.txt"
                    " that lists [PAD] [UNK] [CLS] [SEP] [MASK])"
                )
        # The specials are deliberately NOT registered as added tokens: a literal "[MASK]" in corpus
        # text must stay text, never become the mask id.
        tok = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(  # strip_accents=None: follows lowercase, as BERT
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        self._tok = tok

        self.vocab_size = tok.get_vocab_size()
        self.pad_id, self.unk_id = vocab["[PAD]"], vocab["[UNK]"]
        self.cls_id, self.sep_id, self.mask_id = vocab[CLS], vocab[SEP], vocab[MASK]
        pieces = [tok.id_to_token(i) or "" for i in range(self.vocab_size)]
        word_start = np.array([not p.startswith("##") for p in pieces], bool)
        bracketed = {i for i, p in enumerate(pieces) if _BRACKETED.match(p)}  # [unused*] included
        self._finish(
            (bracketed - {self.unk_id}) | {self.pad_id, self.cls_id, self.sep_id, self.mask_id}, word_start
        )

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def id_to_piece(self, i: int) -> str:
        return self._tok.id_to_token(int(i))


def load_tokenizer(kind: str, path: str, *, lowercase: bool = True) -> Tokenizer:
    """kind: 'sentencepiece' (a .model) or 'wordpiece' (a BERT vocab.txt or a directory with one).

    `lowercase` lowercases text before encoding (uncased models). A SentencePiece model trained by
    scripts/train_tokenizer.py with its default --lowercase already case-folds.
    """
    path = os.path.expanduser(path)
    if kind == "sentencepiece":
        if not os.path.isfile(path) and os.path.isfile(path + ".model"):
            path += ".model"  # accept the --model_prefix given to train_tokenizer.py
        if not os.path.isfile(path):
            raise CorpusError(
                f"sentencepiece model not found: {path} (train one with"
                " scripts/train_tokenizer.py or fix --config.tokenizer.path)"
            )
        return SentencePieceTokenizer(path, lowercase=lowercase)
    if kind == "wordpiece":
        return WordPieceTokenizer(path, lowercase=lowercase)
    raise CorpusError(
        f"unknown tokenizer kind {kind!r} (use 'sentencepiece' or 'wordpiece' in --config.tokenizer.kind)"
    )
