"""One tokenizer interface over SentencePiece models, BERT WordPiece vocabularies, GPT-2's byte-level BPE and
character vocabularies.

Objectives need more than `encode`: the ids of the specials ([CLS], [SEP], [MASK], pad, eos) to build
and mask batches, the ids masking must never pick, and a per-id "starts a word" table so that
whole-word masking is a vectorised lookup (`tok.word_start[ids]`) rather than string work per token.

T5's sentinels: `extra_ids=100` appends 100 ids after the model's own pieces, as seqio's
SentencePieceVocabulary(extra_ids=100) and transformers' T5Tokenizer(extra_ids=100) do: `vocab_size`
counts them and `<extra_id_0>` is the LAST id (`sentinel_id(i) = vocab_size - 1 - i`). Like
T5Tokenizer, encoding the text "<extra_id_3>" gives that sentinel (the text around it is encoded
piece by piece, each part as if it began the text) and decoding renders sentinels as "<extra_id_3>".
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np

from pretrain.data.sources import CorpusError

CLS, SEP, MASK, EOS = "[CLS]", "[SEP]", "[MASK]", "</s>"
_SENTINEL = re.compile(r"<extra_id_(\d+)>")
_SPM_WORD_PREFIX = "\u2581"  # '▁': SentencePiece marks a word's first piece with it
KINDS = ("sentencepiece", "wordpiece", "char", "gpt2_bpe")
_BRACKETED = re.compile(r"^\[[^\[\]]+\]$")  # [PAD], [unused17], ...: BERT vocab control tokens


class Tokenizer:
    """Text <-> ids. Special tokens are never added by `encode`; objectives place them.

    Subclasses set `_specials` ({"[CLS]": id or None, ...}), `_base_size` (ids before the sentinels)
    and implement `_encode_plain`, `_decode_plain`, `_piece`; `_finish` completes the tables.
    """

    vocab_size: int  # including the num_extra_ids sentinels
    num_extra_ids: int  # sentinel ids after the model's own pieces (T5: 100)
    pad_id: int
    unk_id: int  # a real token: it may be masked and predicted, so it is not in special_ids
    special_ids: tuple[int, ...]  # ids MLM must never select for prediction (sentinels included)
    word_start: np.ndarray  # [vocab_size] bool: True if the piece begins a word (or is special)
    _specials: dict[str, int | None]
    _base_size: int
    _path: str
    _sentinel_separator = ""  # between decoded sentinels and the text around them

    # ---- ids of special pieces: a model may lack the BERT ones (a T5 model has no [MASK]) --------

    def _special(self, piece: str, why: str) -> int:
        i = self._specials.get(piece)
        if i is None:
            raise CorpusError(f"tokenizer {self._path} has no {piece} piece, which {why} (train one with"
                              " scripts/train_tokenizer.py, which adds [CLS] [SEP] [MASK])")
        return i

    @property
    def cls_id(self) -> int:
        return self._special(CLS, "BERT objectives need")

    @property
    def sep_id(self) -> int:
        return self._special(SEP, "BERT objectives need")

    @property
    def mask_id(self) -> int:
        return self._special(MASK, "BERT objectives need")

    @property
    def eos_id(self) -> int:
        """The model's </s> (T5: 1); else [SEP], which ends sequences in our BERT-style models."""
        if self._specials.get(EOS) is not None:
            return self._specials[EOS]
        return self._special(SEP, "ends sequences when the model has no </s>")

    def sentinel_id(self, i: int) -> int:
        """Id of `<extra_id_i>`: vocab_size - 1 - i, T5's convention."""
        if not 0 <= i < self.num_extra_ids:
            raise ValueError(f"sentinel {i} does not exist: this tokenizer has {self.num_extra_ids} extra ids"
                             " (set extra_ids in load_tokenizer / --config.tokenizer.extra_ids)")
        return self.vocab_size - 1 - i

    # ---- text <-> ids ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if not self.num_extra_ids:
            return self._encode_plain(list(texts))
        # Split every text at its sentinels, encode all plain parts in one batch call, reassemble.
        split = [self._split_sentinels(t) for t in texts]
        plain = [part for parts in split for part in parts if isinstance(part, str)]
        encoded = iter(self._encode_plain(plain))
        return [[i for part in parts for i in (next(encoded) if isinstance(part, str) else [part])]
                for parts in split]

    def _split_sentinels(self, text: str) -> list[str | int]:
        """'a <extra_id_0> b' -> ['a ', sentinel id, ' b']; '<extra_id_N>' past num_extra_ids stays text."""
        parts, start = [], 0
        for m in _SENTINEL.finditer(text):
            k = int(m.group(1))
            if k < self.num_extra_ids and m.group(1) == str(k):
                parts += [text[start:m.start()], self.sentinel_id(k)]
                start = m.end()
        return [p for p in parts + [text[start:]] if p != ""]

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if not self.num_extra_ids:
            return self._decode_plain(ids)
        out, run = [], []
        for i in ids + [None]:
            if i is not None and i < self._base_size:
                run.append(i)
                continue
            if run:
                out.append(self._decode_run(run, after_sentinel=bool(out)))
                run = []
            if i is not None:
                out.append(f"<extra_id_{self.vocab_size - 1 - i}>")
        return self._sentinel_separator.join(out)

    def id_to_piece(self, i: int) -> str:
        i = int(i)
        return f"<extra_id_{self.vocab_size - 1 - i}>" if i >= self._base_size else self._piece(i)

    def _encode_plain(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def _decode_plain(self, ids: list[int]) -> str:
        raise NotImplementedError

    def _decode_run(self, ids: list[int], after_sentinel: bool) -> str:
        """Decodes ids between sentinels; `after_sentinel`: a sentinel precedes them."""
        raise NotImplementedError

    def _piece(self, i: int) -> str:
        raise NotImplementedError

    def _finish(self, specials: set[int], word_start: np.ndarray, extra_ids: int):
        """word_start: [_base_size]. Sentinels are specials and words of their own."""
        if extra_ids < 0:
            raise CorpusError(f"extra_ids={extra_ids} must be >= 0 (T5 uses 100)")
        self.num_extra_ids = extra_ids
        self.vocab_size = self._base_size + extra_ids
        self.special_ids = tuple(sorted(specials | set(range(self._base_size, self.vocab_size))))
        self.word_start = np.concatenate([word_start, np.ones(extra_ids, bool)])
        self.word_start[list(self.special_ids)] = True  # a special is its own "word"

    def __repr__(self) -> str:
        specials = ", ".join(f"{k}={v}" for k, v in self._specials.items() if v is not None)
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, extra_ids={self.num_extra_ids},"
                f" pad={self.pad_id}, unk={self.unk_id}, {specials})")


class SentencePieceTokenizer(Tokenizer):
    """A model from scripts/train_tokenizer.py (pad=0, unk=1, [CLS]=2, [SEP]=3, [MASK]=4, no </s>) or
    a T5-style one (pad=0, </s>=1, unk=2, no [CLS] [SEP] [MASK]: BERT objectives then raise)."""

    def __init__(self, path: str, *, lowercase: bool = True, extra_ids: int = 0):
        import sentencepiece as spm

        try:
            self._sp = spm.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as e:
            raise CorpusError(
                f"cannot load sentencepiece model {path}: {str(e).splitlines()[0]} (train one with"
                " scripts/train_tokenizer.py)"
            ) from None
        self._path, self._lowercase = path, lowercase
        sp = self._sp
        self._base_size = sp.get_piece_size()
        self.pad_id, self.unk_id = sp.pad_id(), sp.unk_id()
        if self.pad_id < 0:
            raise CorpusError(
                f"sentencepiece model {path} has no pad piece (retrain it with"
                " scripts/train_tokenizer.py, which sets pad_id=0)"
            )
        # By name, not by number: a model trained elsewhere may order its specials differently.
        self._specials = {p: self._lookup(p) for p in (CLS, SEP, MASK)}
        self._specials[EOS] = sp.eos_id() if sp.eos_id() >= 0 else None

        pieces = [sp.id_to_piece(i) for i in range(self._base_size)]
        word_start = np.array([p.startswith(_SPM_WORD_PREFIX) for p in pieces], bool)
        word_start[self.unk_id] = True  # <unk> stands for whole unknown characters
        controls = {i for i in range(self._base_size) if sp.is_control(i)}  # pad, </s>, [CLS] ...
        present = {i for i in self._specials.values() if i is not None}
        self._finish(controls | present | {self.pad_id}, word_start, extra_ids)

    def _lookup(self, piece: str) -> int | None:
        i = self._sp.piece_to_id(piece)  # unknown pieces map to unk_id, so check the round trip
        return i if self._sp.id_to_piece(i) == piece else None

    def _encode_plain(self, texts: list[str]) -> list[list[int]]:
        if self._lowercase:
            texts = [t.lower() for t in texts]
        return self._sp.encode(texts, out_type=int)  # C++ threads over the batch

    def _decode_plain(self, ids: list[int]) -> str:
        return self._sp.decode(ids)

    def _decode_run(self, ids: list[int], after_sentinel: bool) -> str:
        # sentencepiece drops the space of a leading '▁'; after a sentinel it separates two words
        # (T5Tokenizer decodes "x <extra_id_0> y" as "x<extra_id_0> y").
        space = after_sentinel and self._sp.id_to_piece(ids[0]).startswith(_SPM_WORD_PREFIX)
        return " " * space + self._sp.decode(ids)

    def _piece(self, i: int) -> str:
        return self._sp.id_to_piece(i)


class WordPieceTokenizer(Tokenizer):
    """A BERT vocab.txt, tokenized as BERT does (BertNormalizer + BertPreTokenizer + WordPiece)."""

    def __init__(self, path: str, *, lowercase: bool = True, extra_ids: int = 0):
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
        self._tok, self._path = tok, path

        self._base_size = tok.get_vocab_size()
        self.pad_id, self.unk_id = vocab["[PAD]"], vocab["[UNK]"]
        self._specials = {CLS: vocab[CLS], SEP: vocab[SEP], MASK: vocab[MASK], EOS: None}  # eos: [SEP]
        pieces = [tok.id_to_token(i) or "" for i in range(self._base_size)]
        word_start = np.array([not p.startswith("##") for p in pieces], bool)
        bracketed = {i for i, p in enumerate(pieces) if _BRACKETED.match(p)}  # [unused*] included
        self._finish((bracketed - {self.unk_id}) | {self.pad_id, *self._specials.values()} - {None},
                     word_start, extra_ids)

    def _encode_plain(self, texts: list[str]) -> list[list[int]]:
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encodings]

    def _decode_plain(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    _sentinel_separator = " "  # words are space-separated, sentinels too (as BertTokenizer prints them)

    def _decode_run(self, ids: list[int], after_sentinel: bool) -> str:
        return self._decode_plain(ids)

    def _piece(self, i: int) -> str:
        return self._tok.id_to_token(i)


def load_tokenizer(kind: str, path: str, *, lowercase: bool = True, extra_ids: int = 0) -> Tokenizer:
    """kind: 'sentencepiece' (a .model), 'wordpiece' (a BERT vocab.txt or a directory with one), 'gpt2_bpe'
    (a Hugging Face GPT-2 directory: tokenizer.json or vocab.json + merges.txt, or a tokenizer.json file) or
    'char' (a text file whose distinct characters are the vocabulary). `lowercase` does not apply to 'char'
    nor to 'gpt2_bpe' (GPT-2 is cased; its vocabulary has both cases, so lowering would only lose information).

    `lowercase` lowercases text before encoding (uncased models; pass False for T5's cased model).
    A SentencePiece model trained by scripts/train_tokenizer.py with its default --lowercase already
    case-folds. `extra_ids`: sentinel ids appended after the vocabulary (T5: 100).
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
        return SentencePieceTokenizer(path, lowercase=lowercase, extra_ids=extra_ids)
    if kind == "wordpiece":
        return WordPieceTokenizer(path, lowercase=lowercase, extra_ids=extra_ids)
    if kind in ("char", "gpt2_bpe"):
        from pretrain.data import gpt_tokenizers
        return gpt_tokenizers.build(kind, path, extra_ids=extra_ids)
    raise CorpusError(
        f"unknown tokenizer kind {kind!r} (use one of {', '.join(KINDS)} in --config.tokenizer.kind)"
    )


def eos_id_or_none(tokenizer) -> int | None:
    """The tokenizer's EOS id, or None when it has none (our Tokenizer raises CorpusError then; GPT-2's
    and T5's have one, the char vocabulary and a SentencePiece model without </s> or [SEP] do not)."""
    try:
        eos = getattr(tokenizer, "eos_id", None)
    except CorpusError:
        return None
    return None if eos is None else int(eos)


def __getattr__(name: str):
    """`tokenizers.CharTokenizer` / `tokenizers.GPT2BPETokenizer`: the GPT family's classes live in
    gpt_tokenizers.py (imported lazily: that module builds on this one)."""
    if name in ("CharTokenizer", "GPT2BPETokenizer", "GPT2_EOS"):
        from pretrain.data import gpt_tokenizers
        return getattr(gpt_tokenizers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
