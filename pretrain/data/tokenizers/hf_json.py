"""Hugging Face `tokenizer.json` files: read as they stand (kind 'hf_json', ModernBERT's tokenizer), and written
from ours (`tokenizer_json`) for an export that transformers' AutoTokenizer loads.

ModernBERT ships no vocab.txt: its tokenizer.json is a byte-level BPE (OLMo's, 50,280 pieces) with [UNK] [CLS]
[SEP] [PAD] [MASK] added as special tokens after it (the model's vocab_size, 50,368, leaves room past them).
HFJsonTokenizer encodes with the file's own pipeline (normalizer, pre-tokenizer, model, added tokens), so its
ids are AutoTokenizer's without the post-processor's [CLS] ... [SEP], which the objectives place themselves.
Case is whatever the file's normalizer does: `lowercase` does not apply.
"""
from __future__ import annotations

import json
import os

import numpy as np

from pretrain.data.tokenizers.base import (CLS, EOS, MASK, SEP, TOKENIZERS, MissingTokenError, Tokenizer,
                                           TokenizerError)
from pretrain.training import config_keys

PAD, UNK = "[PAD]", "[UNK]"
TOKENIZER_JSON = "tokenizer.json"
# How a piece shows that it begins a word, by the pipeline component that marks it
_WORD_MARKS = {"ByteLevel": "\u0120", "Metaspace": "\u2581"}  # 'Ġ' (a space byte), '▁' (SentencePiece's)
# Texts an exported tokenizer.json must encode as ours does (tokenizer_json checks them)
PROBES = ("The quick brown fox jumps over the lazy dog.", "  Two  spaces, then\ttabs and\nnew lines.  ",
          "It's 3.14159 -- isn't it? (Yes!) \"Quoted\" [brackets] {braces} 42%", "UPPER lower MiXeD Case",
          "naïve café résumé, Ελληνικά, 日本語", "e-mail: someone@example.com; url: https://example.org/a?b=c")


class PipelineTokenizer(Tokenizer):
    """A tokenizer that encodes and decodes with a Hugging Face `tokenizers.Tokenizer` (`self._tok`), as it stands:
    this kind's and GPT-2's byte-level BPE (gpt.py)."""
    _tok: "object"

    def _encode_plain(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def _decode_plain(self, ids: list[int]) -> str:
        # Bytes that do not form UTF-8 (a byte-level piece cut mid-character) become U+FFFD (GPT-2's errors="replace")
        return self._tok.decode(ids, skip_special_tokens=False)

    def _decode_run(self, ids: list[int], after_sentinel: bool) -> str:
        return self._decode_plain(ids)  # the pieces carry their spaces: nothing to restore around sentinels

    def _piece(self, i: int) -> str:
        return self._tok.id_to_token(i)

    def hf_pipeline(self):
        from tokenizers import Tokenizer as HFTokenizer

        return HFTokenizer.from_str(self._tok.to_str())  # a copy: the caller adds a post-processor


@config_keys.declare(TOKENIZERS, "hf_json")  # the file's normalizer decides the case
class HFJsonTokenizer(PipelineTokenizer):
    """A tokenizer.json (or a directory holding one) with the [PAD] special token, and [CLS] [SEP] [MASK] where
    BERT objectives need them. `unk_id` is [UNK], else the model's unk token (a byte-level BPE never produces it).

    Added tokens split the text as in transformers: a literal "[MASK]" in the text is the mask id (ModernBERT's
    [MASK] also takes the space before it: lstrip). Added tokens are words of their own for whole-word masking;
    the special ones, and [PAD], are never masked.
    """
    _missing_special_fix = "add it to the tokenizer.json as a special token, as ModernBERT's has"

    def __init__(self, path: str, *, extra_ids: int = 0):
        tok, self._path = read_tokenizer_json(path)
        spec = json.loads(tok.to_str())
        self._tok, self._base_size = tok, tok.get_vocab_size(with_added_tokens=True)
        pad = tok.token_to_id(PAD)
        if pad is None:
            raise TokenizerError(f"tokenizer {self._path} has no {PAD} token, which pads batches (use ModernBERT's "
                                 "tokenizer.json, or add [PAD] to it as a special token)")
        self.pad_id = pad
        model = spec["model"]
        model_unk = (model.get("unk_id") if model.get("type") == "Unigram"
                     else tok.token_to_id(model["unk_token"]) if model.get("unk_token") else None)
        self._unk = tok.token_to_id(UNK) if tok.token_to_id(UNK) is not None else model_unk
        self._specials = {name: tok.token_to_id(name) for name in (CLS, SEP, MASK, EOS)}
        pieces = [tok.id_to_token(i) or "" for i in range(self._base_size)]
        word_start = _word_starts(pieces, spec, self._path)
        added = tok.get_added_tokens_decoder()  # id -> AddedToken
        word_start[list(added)] = True  # an added token is a word of its own
        specials = {i for i, t in added.items() if t.special} | {i for i in self._specials.values() if i is not None}
        self._finish((specials | {pad}) - {self._unk}, word_start, extra_ids)  # unk: a real token, as in base.py

    @property
    def unk_id(self) -> int:
        if self._unk is None:
            raise MissingTokenError(f"tokenizer {self._path} has no {UNK} token nor a model unk_token (add [UNK] to "
                                    "it as a special token)")
        return self._unk


def read_tokenizer_json(path: str):
    """A tokenizer.json, or a directory holding one -> (tokenizers.Tokenizer, the file read); one-line errors."""
    from tokenizers import Tokenizer as HFTokenizer

    json_file = os.path.join(path, TOKENIZER_JSON) if os.path.isdir(path) else path
    if not os.path.isfile(json_file):
        raise TokenizerError(f"tokenizer.json not found: {json_file} (give a Hugging Face tokenizer.json, or the "
                             "directory that holds one, in --config.tokenizer.path)")
    try:
        return HFTokenizer.from_file(json_file), json_file
    except Exception as e:  # noqa: BLE001 - the Rust parser raises a bare Exception
        raise TokenizerError(f"{json_file} is not a Hugging Face tokenizer.json ({str(e).splitlines()[0]}); give the "
                             "tokenizer.json saved with the model, as transformers' save_pretrained writes it") from None


def _component_types(node) -> set[str]:
    """The 'type' of a pre-tokenizer or decoder and of everything in its Sequence."""
    if isinstance(node, list):
        return set().union(*map(_component_types, node))
    if not isinstance(node, dict):
        return set()
    return {node.get("type")} | _component_types(node.get("pretokenizers") or node.get("decoders") or [])


def _word_starts(pieces: list[str], spec: dict, path: str) -> np.ndarray:
    """[pieces] bool: the piece begins a word. WordPiece marks the others (##); byte-level BPE and SentencePiece's
    Metaspace mark word starts (the space before them)."""
    model = spec["model"]
    if model.get("type") == "WordPiece":
        prefix = model.get("continuing_subword_prefix") or "##"
        return np.array([not p.startswith(prefix) for p in pieces], bool)
    types = _component_types(spec.get("pre_tokenizer")) | _component_types(spec.get("decoder"))
    for component, mark in _WORD_MARKS.items():
        if component in types:
            return np.array([p.startswith(mark) for p in pieces], bool)
    raise TokenizerError(f"{path}: cannot tell which pieces begin a word (its pre-tokenizer is neither ByteLevel nor "
                         "Metaspace, and its model is not WordPiece); use a tokenizer.json of one of those")


def tokenizer_json(tokenizer: Tokenizer) -> str:
    """Our tokenizer -> the text of a tokenizer.json that encodes as it does, its post-processor adding
    [CLS] A [SEP] (B [SEP]) as pretrain/data/finetune_data.encode_texts does; checked on PROBES.

    A hf_json tokenizer's file is returned as it is. TokenizerError where the kind has no such form (char,
    gpt2_bpe, sentinels) or the converted pipeline encodes a probe differently.
    """
    if isinstance(tokenizer, HFJsonTokenizer):
        with open(tokenizer._path, encoding="utf-8") as f:
            return f.read()
    pipeline = tokenizer.hf_pipeline()
    if pipeline is None or tokenizer.num_extra_ids:
        raise TokenizerError(f"{type(tokenizer).__name__} {tokenizer._path} has no tokenizer.json form here"
                             + (" (it has sentinel ids)" if tokenizer.num_extra_ids else ""))
    _add_bert_template(pipeline, tokenizer)
    for text in PROBES:
        theirs = pipeline.encode(text, add_special_tokens=False).ids
        if theirs != tokenizer.encode(text):
            raise TokenizerError(f"the tokenizer.json converted from {tokenizer._path} encodes {text!r} as {theirs}, "
                                 f"not as ours: {tokenizer.encode(text)}")
    return pipeline.to_str(pretty=True)


def special_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    """The pieces of the tokenizer's specials by tokenizer_config.json's names (cls_token, ...), those it has."""
    found = {}
    for key, attribute in (("cls_token", "cls_id"), ("sep_token", "sep_id"), ("mask_token", "mask_id"),
                           ("pad_token", "pad_id"), ("unk_token", "unk_id")):
        try:
            found[key] = tokenizer.id_to_piece(getattr(tokenizer, attribute))
        except MissingTokenError:
            continue
    return found


def _add_bert_template(pipeline, tokenizer: Tokenizer) -> None:
    """[CLS] $A [SEP] and [CLS] $A [SEP] $B [SEP] (B's type id 1), where the tokenizer has [CLS] and [SEP]."""
    from tokenizers import processors

    try:
        cls, sep = tokenizer.cls_id, tokenizer.sep_id
    except MissingTokenError:
        return
    c, s = tokenizer.id_to_piece(cls), tokenizer.id_to_piece(sep)
    pipeline.post_processor = processors.TemplateProcessing(
        single=f"{c}:0 $A:0 {s}:0", pair=f"{c}:0 $A:0 {s}:0 $B:1 {s}:1", special_tokens=[(c, cls), (s, sep)])
