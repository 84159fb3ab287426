"""The GPT family's tokenizers: nanoGPT's character vocabulary and GPT-2's byte-level BPE.

Both implement pretrain/data/tokenizers/base.py's Tokenizer interface (built through load_tokenizer,
kinds 'char' and 'gpt2_bpe'); neither has [CLS] [SEP] [MASK], and neither has a padding token: the
pad id only ever fills positions that segment ids / loss weights mask out.
"""
from __future__ import annotations

import os

import numpy as np

from pretrain.data.tokenizers.base import (CLS, EOS, MASK, SEP, TOKENIZERS, MissingTokenError, Tokenizer,
                                           TokenizerError, UnknownTextError)
from pretrain.data.tokenizers.hf_json import PipelineTokenizer, read_tokenizer_json
from pretrain.training import config_keys

_BYTE_LEVEL_SPACE = "\u0120"  # 'Ġ': GPT-2's byte-level alphabet writes the space byte as it
GPT2_EOS = "<|endoftext|>"  # GPT-2's only special token (id 50256): ends documents, also its unk and bos


@config_keys.declare(TOKENIZERS, "char")
class CharTokenizer(Tokenizer):
    """One id per character, the vocabulary being the sorted distinct characters of a text file: nanoGPT's
    data/shakespeare_char/prepare.py (`chars = sorted(list(set(data)))`; tinyshakespeare gives 65).

    There is no unknown id: a character outside the file is an error that names it. There is no padding
    character either; `pad_id` is 0 (the first character) and only ever fills positions that the
    objectives mask out by segment id / loss weight. No </s>: documents are joined without a separator.
    """

    def __init__(self, path: str, *, extra_ids: int = 0):
        if not os.path.isfile(path):
            raise TokenizerError(f"char tokenizer: text file not found: {path} (its distinct characters are the "
                                 "vocabulary; give the training corpus in --config.tokenizer.path)")
        with open(path, encoding="utf-8", errors="replace") as f:
            self._chars = sorted(set(f.read()))
        if not self._chars:
            raise TokenizerError(f"char tokenizer: {path} is empty; give the training corpus in "
                                 "--config.tokenizer.path")
        self._index = {ch: i for i, ch in enumerate(self._chars)}
        self._path, self._base_size = path, len(self._chars)
        self.pad_id = 0
        self._specials = {CLS: None, SEP: None, MASK: None, EOS: None}
        self._finish(set(), np.ones(self._base_size, bool), extra_ids)

    @property
    def unk_id(self) -> int:
        raise MissingTokenError(f"the char tokenizer of {self._path} has no unknown id (each character is in the "
                                "vocabulary)")

    @property
    def eos_id(self) -> int:
        raise MissingTokenError(f"the char tokenizer of {self._path} has no end-of-sequence id (nanoGPT's has none)")

    def _encode_plain(self, texts: list[str]) -> list[list[int]]:
        out = []
        for text in texts:
            try:
                out.append([self._index[ch] for ch in text])
            except KeyError:
                missing = sorted(set(text) - set(self._index))
                raise UnknownTextError(f"characters {''.join(missing)!r} are not in the char vocabulary of "
                                       f"{self._path} (build the vocabulary from a text that contains them)") from None
        return out

    def _decode_plain(self, ids: list[int]) -> str:
        return "".join(self._chars[i] for i in ids)

    def _decode_run(self, ids: list[int], after_sentinel: bool) -> str:
        return self._decode_plain(ids)

    def _piece(self, i: int) -> str:
        return self._chars[i]

    def __repr__(self) -> str:
        return f"CharTokenizer({self._path}, vocab_size={self.vocab_size}, extra_ids={self.num_extra_ids})"


@config_keys.declare(TOKENIZERS, "gpt2_bpe")  # cased: its vocabulary has both cases, lowering would lose them
class GPT2BPETokenizer(PipelineTokenizer):
    """GPT-2's byte-level BPE (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" §2.2;
    openai/gpt-2 src/encoder.py), built as transformers' GPT2Tokenizer builds it: models.BPE over vocab.json +
    merges.txt, pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel, no normalizer, cased.

    Every byte has a symbol, so nothing is unknown: `unk_id` is <|endoftext|>'s id, as GPT2Tokenizer's
    unk_token, and is never produced. GPT-2 has no pad token either: `pad_id` is that id too (the Hugging
    Face convention), which only fills positions masked by segment id / loss weight. No [CLS] [SEP] [MASK].
    A literal "<|endoftext|>" in the text encodes to the eos id, as GPT2Tokenizer does by default (it is a
    special added token); decoding renders it back as "<|endoftext|>".
    """

    def __init__(self, path: str, *, extra_ids: int = 0):
        from tokenizers import AddedToken

        tok, self._path = _load_byte_level_bpe(path)
        eos = tok.token_to_id(GPT2_EOS)
        if eos is None:
            raise TokenizerError(f"GPT-2 tokenizer {self._path} has no {GPT2_EOS} token (GPT-2's end of text, id "
                                 "50256; use a GPT-2 vocabulary or add it to vocab.json)")
        missing = [c for c in _byte_level_alphabet() if tok.token_to_id(c) is None]
        if missing:  # models.BPE without unk silently DROPS characters it cannot spell
            raise TokenizerError(f"GPT-2 tokenizer {self._path} lacks {len(missing)} of the 256 byte symbols (e.g. "
                                 f"{missing[0]!r}), so text with those bytes would vanish (train it with "
                                 "initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), as GPT-2's)")
        tok.add_special_tokens([AddedToken(GPT2_EOS, special=True, normalized=False)])  # no-op if already one
        self._tok = tok
        self._base_size = tok.get_vocab_size(with_added_tokens=True)
        self.pad_id = self.unk_id = eos
        self._specials = {CLS: None, SEP: None, MASK: None, GPT2_EOS: eos}
        pieces = [tok.id_to_token(i) or "" for i in range(self._base_size)]
        word_start = np.array([p.startswith(_BYTE_LEVEL_SPACE) for p in pieces], bool)
        added_specials = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        self._finish(added_specials | {eos}, word_start, extra_ids)

    @property
    def eos_id(self) -> int:
        return self._specials[GPT2_EOS]



def _byte_level_alphabet() -> list[str]:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel.alphabet()


def _load_byte_level_bpe(path: str):
    """path = a Hugging Face GPT-2 directory or a tokenizer.json -> (tokenizers.Tokenizer, the file or dir read).

    As transformers' from_pretrained, a directory's tokenizer.json wins over its vocab.json + merges.txt: it
    carries added tokens, and transformers 5's save_pretrained writes only it. A tokenizer.json is taken
    as it stands (its own pre-tokenizer and decoder); vocab.json + merges.txt get GPT-2's pipeline.
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    if os.path.isfile(path) and os.path.basename(path) in ("vocab.json", "merges.txt"):
        path = os.path.dirname(path)  # one of the pair: read both
    json_file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if os.path.isfile(json_file):
        tok, json_file = read_tokenizer_json(json_file)
        if not isinstance(tok.model, models.BPE):
            raise TokenizerError(f"{json_file} holds a {type(tok.model).__name__} model, not GPT-2's byte-level BPE "
                                 "(use --config.tokenizer.kind=wordpiece or sentencepiece for it)")
        return tok, json_file
    if not os.path.isdir(path):
        raise TokenizerError(f"GPT-2 tokenizer not found: {path} (give a Hugging Face GPT-2 directory or a "
                             "tokenizer.json in --config.tokenizer.path)")
    vocab, merges = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
    missing = [os.path.basename(f) for f in (vocab, merges) if not os.path.isfile(f)]
    if missing:
        raise TokenizerError(f"GPT-2 tokenizer directory {path} has no {' or '.join(missing)} (it needs "
                             "tokenizer.json, or vocab.json + merges.txt as in a Hugging Face GPT-2 checkpoint; fix "
                             "--config.tokenizer.path)")
    try:
        vocab_dict, merge_list = models.BPE.read_file(vocab, merges)
    except Exception as e:
        raise TokenizerError(f"cannot read GPT-2 vocabulary {vocab} + {merges}: {str(e).splitlines()[0]} (give "
                             "GPT-2's vocab.json and merges.txt)") from None
    tok = HFTokenizer(models.BPE(vocab_dict, merge_list, dropout=None, continuing_subword_prefix="",
                                 end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok, path
