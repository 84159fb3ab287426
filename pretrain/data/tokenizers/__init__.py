"""Tokenizers: one interface (base.py) over SentencePiece and WordPiece (subword.py), nanoGPT's
characters and GPT-2's byte-level BPE (gpt.py), Hugging Face tokenizer.json files such as ModernBERT's
(hf_json.py), and the one factory every entry point uses.

`from_config(config.tokenizer)` is how pretraining, fine-tuning and the language-model tools build
a tokenizer; `load_tokenizer(kind, path, ...)` is the same with explicit arguments. A kind is a Tokenizer class
registered in TOKENIZERS beside its definition (config_keys.declare), with its capabilities (`honours_case`) as
attributes. `fingerprint` names what decides a tokenizer's ids, so that ids stored on disk (a prepared corpus) are
never read with another.
"""
from __future__ import annotations

import hashlib
import json
import os

import ml_collections

from objectives.interface import eos_id_or_none
from pretrain.data.tokenizers.base import (CLS, EOS, MASK, SEP, TOKENIZERS, MissingTokenError, Tokenizer,
                                           TokenizerError, UnknownTextError)
# Imported in the order --help lists the kinds (each registers its own, beside its class).
from pretrain.data.tokenizers.subword import SentencePieceTokenizer, WordPieceTokenizer
from pretrain.data.tokenizers.hf_json import HFJsonTokenizer, special_tokens, tokenizer_json
from pretrain.data.tokenizers.gpt import GPT2_EOS, CharTokenizer, GPT2BPETokenizer

__all__ = ["CLS", "EOS", "GPT2_EOS", "MASK", "SEP", "CharTokenizer", "GPT2BPETokenizer", "HFJsonTokenizer",
           "MissingTokenError", "SentencePieceTokenizer", "TOKENIZERS", "Tokenizer", "TokenizerError",
           "UnknownTextError", "WordPieceTokenizer", "eos_id_or_none", "fingerprint", "from_config", "load_tokenizer",
           "special_tokens", "tokenizer_json"]


def load_tokenizer(kind: str, path: str, *, lowercase: bool = True, extra_ids: int = 0) -> Tokenizer:
    """kind: 'sentencepiece' (a .model), 'wordpiece' (a BERT vocab.txt or a directory with one), 'gpt2_bpe'
    (a Hugging Face GPT-2 directory: tokenizer.json or vocab.json + merges.txt, or a tokenizer.json file),
    'hf_json' (any Hugging Face tokenizer.json, or a directory with one: ModernBERT's) or 'char' (a text file
    whose distinct characters are the vocabulary). `lowercase` does not apply to 'char' nor to 'gpt2_bpe' (GPT-2
    is cased; its vocabulary has both cases, so lowering would only lose information) nor to 'hf_json' (the
    file's normalizer decides).

    `lowercase` lowercases text before encoding (uncased models; pass False for T5's cased model).
    A SentencePiece model trained by pretrain.tools.train_tokenizer with its default --lowercase already
    case-folds. `extra_ids`: sentinel ids appended after the vocabulary (T5: 100).
    """
    tokenizer_class = TOKENIZERS.get(kind)
    tokenizer = tokenizer_class.load(os.path.expanduser(path), lowercase=lowercase, extra_ids=extra_ids)
    # What fingerprint() needs of it: lowercase changes ids only where the kind honours it.
    tokenizer.load_options = {"kind": kind, "path": path,
                              "lowercase": bool(lowercase) if tokenizer_class.honours_case else None,
                              "extra_ids": int(extra_ids)}
    return tokenizer


def from_config(config: ml_collections.ConfigDict | dict, path: str | None = None) -> Tokenizer:
    """config.tokenizer (kind, path, lowercase, extra_ids) -> a Tokenizer; `path` replaces config's path."""
    get = config.get
    return load_tokenizer(get("kind", "sentencepiece"), path or get("path", ""), lowercase=get("lowercase", True),
                          extra_ids=get("extra_ids", 0))


def fingerprint(tokenizer: Tokenizer | ml_collections.ConfigDict | dict, **as_if) -> str:
    """sha256 (hex) of what decides the ids: the kind, the options that change ids (lowercase where the kind
    honours it, extra_ids) and the bytes of the file(s) read. Not the path: a copy elsewhere is the same tokenizer.

    `tokenizer`: one built by load_tokenizer / from_config, or a config.tokenizer (it is loaded). `as_if`: load
    options to digest instead of its own (lowercase=True for a model that folds case by itself).
    """
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = from_config(tokenizer)
    options = getattr(tokenizer, "load_options", None)
    if options is None:
        raise TypeError(f"{tokenizer!r} was not built by load_tokenizer, so its options are unknown")
    options = {**options, **as_if}
    path = tokenizer._path  # the file read (a GPT-2 directory: vocab.json + merges.txt)
    files = [path] if os.path.isfile(path) else [os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")]
    decisive = {k: v for k, v in options.items() if k != "path"}
    digest = hashlib.sha256(json.dumps(decisive, sort_keys=True).encode())
    for name in files:
        with open(name, "rb") as f:
            digest.update(b"%d:" % os.fstat(f.fileno()).st_size)  # length-prefixed: file boundaries count
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
