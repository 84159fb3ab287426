"""ModernBERT fixtures built offline: a tokenizer.json laid out as answerdotai/ModernBERT-base's (a byte-level BPE,
then [UNK] [CLS] [SEP] [PAD] [MASK] as special added tokens) and small transformers ModernBERT configs."""
from __future__ import annotations

import json
import os

from tests.helpers.paths import SHARED_DATA

SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")  # ModernBERT-base: ids 50280..50284, after its 50,280 pieces
# ModernBERT-base's tokenizer_config.json, less its list of added tokens
TOKENIZER_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "mask_token": "[MASK]", "pad_token": "[PAD]", "unk_token": "[UNK]", "model_max_length": 8192,
                    "clean_up_tokenization_spaces": True, "model_input_names": ["input_ids", "attention_mask"]}


def training_texts() -> list[str]:
    """tinyshakespeare's first 60,000 characters and SST-2's dev sentences."""
    with open(os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
        shakespeare = f.read(60_000).splitlines()
    return shakespeare + sst2_sentences()


def sst2_sentences() -> list[str]:
    with open(os.path.join(SHARED_DATA, "glue", "SST-2", "dev.tsv"), encoding="utf-8") as f:
        return [line.split("\t")[0] for line in f.read().splitlines()[1:]]


def mrpc_pairs(n: int = 100) -> list[tuple[str, str]]:
    """MRPC dev's first n sentence pairs (its file starts with a byte-order mark, as the original's)."""
    with open(os.path.join(SHARED_DATA, "glue", "MRPC", "dev.tsv"), encoding="utf-8-sig") as f:
        rows = [line.split("\t") for line in f.read().splitlines()[1:n + 1]]
    return [(row[3], row[4]) for row in rows]


def write_modernbert_tokenizer(directory: str, vocab_size: int = 600) -> str:
    """A ModernBERT-shaped tokenizer.json (+ tokenizer_config.json) in `directory`; returns the tokenizer.json's
    path. Like the real one: NFC normalizer, byte-level pre-tokenizer and decoder, OLMo's specials among the pieces
    (|||IP_ADDRESS|||, <|padding|>), a non-special added whitespace token, <|endoftext|>, then ModernBERT's five
    specials, [MASK] stripping the space on its left; a [CLS] A [SEP] (B [SEP]) post-processor."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["|||IP_ADDRESS|||", "<|padding|>"], show_progress=False)
    tok.train_from_iterator(training_texts(), trainer)
    tok.add_tokens([AddedToken("    ", normalized=False)])
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tok.add_special_tokens([AddedToken(name, special=True, lstrip=name == "[MASK]") for name in SPECIALS])
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "tokenizer.json")
    tok.save(path)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(TOKENIZER_CONFIG, f)
    return path
