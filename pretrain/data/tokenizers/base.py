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

import re
from collections.abc import Sequence

import numpy as np

from models.registry import Registry
from pretrain.runtime.errors import UserError
from pretrain.training import config_keys
from pretrain.training.config_keys import NON_NEGATIVE

CLS, SEP, MASK, EOS = "[CLS]", "[SEP]", "[MASK]", "</s>"


class TokenizerError(UserError):
    """A tokenizer file that cannot be loaded or used (one line naming the file and the fix)."""


class MissingTokenError(TokenizerError, LookupError):
    """The vocabulary has no such special token ([MASK], </s>, ...). A LookupError, so that callers
    with a fallback (objectives.interface.eos_id_or_none) catch it without importing this module."""


class UnknownTextError(TokenizerError):
    """Text with a character the vocabulary cannot encode (the char tokenizer has no unknown id)."""


# config.tokenizer.kind -> a Tokenizer class, registered beside it with config_keys.declare; every kind reads
# extra_ids. `load_tokenizer` builds one with `cls.load(path, lowercase=, extra_ids=)`.
TOKENIZERS = config_keys.chosen_by("tokenizer.kind", Registry("tokenizer", "config.tokenizer.kind", TokenizerError),
                                   extra_ids=NON_NEGATIVE)


_SENTINEL = re.compile(r"<extra_id_(\d+)>")


class Tokenizer:
    """Text <-> ids. Special tokens are never added by `encode`; objectives place them.

    Subclasses set `_specials` ({"[CLS]": id or None, ...}), `_base_size` (ids before the sentinels)
    and implement `_encode_plain`, `_decode_plain`, `_piece`; `_finish` completes the tables.
    """

    honours_case = False  # whether `lowercase` changes the ids (fingerprint counts it only then)
    folds_case = False  # a loaded model that lowercases by itself: `lowercase` cannot change its ids either
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
    _missing_special_fix = "train one with python -m pretrain.tools.train_tokenizer, which adds [CLS] [SEP] [MASK]"

    @classmethod
    def load(cls, path: str, *, lowercase: bool, extra_ids: int) -> "Tokenizer":
        """The tokenizer of the file(s) at `path`; `lowercase` reaches only the kinds that honour case."""
        if cls.honours_case:
            return cls(path, lowercase=lowercase, extra_ids=extra_ids)
        return cls(path, extra_ids=extra_ids)

    # ---- ids of special pieces: a model may lack the BERT ones (a T5 model has no [MASK]) --------

    def _special(self, piece: str, why: str) -> int:
        i = self._specials.get(piece)
        if i is None:
            raise MissingTokenError(f"tokenizer {self._path} has no {piece} piece, which {why} "
                                    f"({self._missing_special_fix})")
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

    def hf_pipeline(self):
        """A Hugging Face `tokenizers.Tokenizer` that encodes as this one does, without the specials' template
        (pretrain/data/tokenizers/hf_json.tokenizer_json adds it); None where the kind has none."""

    def _finish(self, specials: set[int], word_start: np.ndarray, extra_ids: int):
        """word_start: [_base_size]. Sentinels are specials and words of their own."""
        if extra_ids < 0:
            raise TokenizerError(f"extra_ids={extra_ids} must be >= 0 (T5 uses 100)")
        self.num_extra_ids = extra_ids
        self.vocab_size = self._base_size + extra_ids
        self.special_ids = tuple(sorted(specials | set(range(self._base_size, self.vocab_size))))
        self.word_start = np.concatenate([word_start, np.ones(extra_ids, bool)])
        self.word_start[list(self.special_ids)] = True  # a special is its own "word"

    def __repr__(self) -> str:
        specials = ", ".join(f"{k}={v}" for k, v in self._specials.items() if v is not None)
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, extra_ids={self.num_extra_ids},"
                f" pad={self.pad_id}, unk={self.unk_id}, {specials})")
