"""Subword tokenizers of the BERT and T5 families: SentencePiece models and BERT WordPiece vocabularies."""
from __future__ import annotations

import os
import re

import numpy as np

from pretrain.data.tokenizers.base import CLS, EOS, MASK, SEP, TOKENIZERS, Tokenizer, TokenizerError
from pretrain.training import config_keys
from pretrain.training.config_keys import BOOLEAN

_SPM_WORD_PREFIX = "\u2581"  # '▁': SentencePiece marks a word's first piece with it
_BRACKETED = re.compile(r"^\[[^\[\]]+\]$")  # [PAD], [unused17], ...: BERT vocab control tokens


@config_keys.declare(TOKENIZERS, "sentencepiece", {"honours_case": True}, lowercase=BOOLEAN)
class SentencePieceTokenizer(Tokenizer):
    """A model from pretrain.tools.train_tokenizer (pad=0, unk=1, [CLS]=2, [SEP]=3, [MASK]=4, no </s>) or
    a T5-style one (pad=0, </s>=1, unk=2, no [CLS] [SEP] [MASK]: BERT objectives then raise)."""

    @classmethod
    def load(cls, path: str, *, lowercase: bool, extra_ids: int) -> "SentencePieceTokenizer":
        """Also accepts the --model_prefix given to train_tokenizer.py (the path without .model)."""
        if not os.path.isfile(path) and os.path.isfile(path + ".model"):
            path += ".model"
        if not os.path.isfile(path):
            raise TokenizerError(f"sentencepiece model not found: {path} (train one with"
                                 " python -m pretrain.tools.train_tokenizer or fix --config.tokenizer.path)")
        return cls(path, lowercase=lowercase, extra_ids=extra_ids)

    def __init__(self, path: str, *, lowercase: bool = True, extra_ids: int = 0):
        import sentencepiece as spm

        try:
            self._sp = spm.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as e:
            raise TokenizerError(
                f"cannot load sentencepiece model {path}: {str(e).splitlines()[0]} (train one with"
                " python -m pretrain.tools.train_tokenizer)"
            ) from None
        self._path, self._lowercase = path, lowercase
        self.folds_case = _folds_case(self._sp)
        sp = self._sp
        self._base_size = sp.get_piece_size()
        self.pad_id, self.unk_id = sp.pad_id(), sp.unk_id()
        if self.pad_id < 0:
            raise TokenizerError(
                f"sentencepiece model {path} has no pad piece (retrain it with"
                " python -m pretrain.tools.train_tokenizer, which sets pad_id=0)"
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

    def hf_pipeline(self):
        """transformers' converter of SentencePiece models (unigram or BPE; the model's precompiled normalizer kept),
        lowercasing first where `lowercase` does; control pieces ([CLS] [SEP] [MASK]) become special added tokens,
        so only a literal "[MASK]" in the text encodes differently. Needs transformers and protobuf."""
        import types

        from tokenizers import normalizers
        try:
            from transformers.convert_slow_tokenizer import SentencePieceExtractor, SpmConverter
        except ImportError:
            raise TokenizerError(f"converting the sentencepiece model {self._path} to a tokenizer.json needs "
                                 "transformers (pip install '.[hf]')") from None

        class Extractor(SentencePieceExtractor):  # transformers 5 passes the vocabulary as extract()'s model type
            def extract(self, *args, **kwargs):
                found = super().extract(None)
                return (found["vocab"], found["merges"]) if isinstance(found, dict) else found

        class Converter(SpmConverter):
            SpmExtractor = Extractor

        try:
            pipeline = Converter(types.SimpleNamespace(vocab_file=self._path)).converted()
        except Exception as e:  # noqa: BLE001 - transformers' converter (protobuf missing, a version's change)
            raise TokenizerError(f"transformers cannot convert the sentencepiece model {self._path}: "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        if self._lowercase:
            pipeline.normalizer = normalizers.Sequence([normalizers.Lowercase(), pipeline.normalizer])
        return pipeline


def _folds_case(sp) -> bool:
    """Whether the model's own normalizer folds case (train_tokenizer's default, nmt_nfkc_cf): lowercasing the text
    first then changes no id. False where that cannot be read (protobuf missing, a rule of the model's own)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
        model = sentencepiece_model_pb2.ModelProto.FromString(sp.serialized_model_proto())
    except Exception:  # noqa: BLE001 - protobuf missing or of another version: assume the model keeps case
        return False
    return model.normalizer_spec.name.endswith("_cf")


@config_keys.declare(TOKENIZERS, "wordpiece", {"honours_case": True}, lowercase=BOOLEAN)
class WordPieceTokenizer(Tokenizer):
    """A BERT vocab.txt, tokenized as BERT does (BertNormalizer + BertPreTokenizer + WordPiece)."""

    def __init__(self, path: str, *, lowercase: bool = True, extra_ids: int = 0):
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, normalizers, pre_tokenizers

        if os.path.isdir(path):  # a model directory (e.g. a Hugging Face checkpoint) holds vocab.txt
            path = os.path.join(path, "vocab.txt")
        if not os.path.isfile(path):
            raise TokenizerError(
                f"WordPiece vocab not found: {path} (give a BERT vocab.txt, one token"
                " per line, in --config.tokenizer.path)"
            )
        _refuse_binary_vocab(path)
        try:
            vocab = models.WordPiece.read_file(path)
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
            raise TokenizerError(f"cannot read WordPiece vocab {path}: {str(e).splitlines()[0]} (give a BERT"
                                 " vocab.txt, one token per line, in --config.tokenizer.path)") from None
        for name in ("[PAD]", "[UNK]", CLS, SEP, MASK):
            if name not in vocab:
                raise TokenizerError(
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

    def hf_pipeline(self):
        from tokenizers import Tokenizer as HFTokenizer

        return HFTokenizer.from_str(self._tok.to_str())  # a copy: the caller adds a post-processor


def _refuse_binary_vocab(path: str) -> None:
    """A TokenizerError for a file that is not a text vocabulary; one naming the right kind for a SentencePiece
    model (a protobuf: NUL bytes, which a vocab.txt never holds)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if b"\0" not in head:
        return
    try:
        import sentencepiece as spm

        spm.SentencePieceProcessor(model_file=path)
    except Exception:  # noqa: BLE001 - not a SentencePiece model either (or no sentencepiece to tell)
        raise TokenizerError(f"WordPiece vocab {path} is a binary file, not a text vocabulary (give a BERT"
                             " vocab.txt, one token per line, in --config.tokenizer.path)") from None
    raise TokenizerError(f"{path} looks like a SentencePiece model, not a WordPiece vocab.txt (use"
                         " --config.tokenizer.kind=sentencepiece)")
