"""Minimal pairs (BLiMP and its successors): does the model prefer the grammatical sentence of each pair?

A file is JSON lines, one pair a line, as BLiMP ships them: `sentence_good` and `sentence_bad`, and optionally the
phenomenon (`linguistics_term`, BLiMP's 12 and the BabyLM suites' fields) and the paradigm (`UID`, BLiMP's 67). A pair
is right when the good sentence scores higher: a masked LM by its pseudo-log-likelihood (pretrain/lm/masked_lm.py),
a GPT by log P(sentence | end of text) (pretrain/lm/language_model.py; a tokenizer without an end-of-text token
leaves the first token unscored), a T5 by its decoder's log P(sentence) (pretrain/lm/encoder_decoder.py): the scores
lm-eval's `blimp` tasks compare. Accuracy is reported per phenomenon,
per paradigm and over all pairs.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
from collections.abc import Sequence

import numpy as np

import models
from objectives.interface import eos_id_or_none
from pretrain.lm import encoder_decoder, masked_lm
from pretrain.lm.language_model import continuation_scores, load_language_model
from pretrain.runtime.errors import UserError
from pretrain.training import pretrained
from pretrain.workdir import storage


@dataclasses.dataclass(frozen=True)
class Pair:
    good: str
    bad: str
    phenomenon: str   # linguistics_term, else the paradigm, else the file's name
    paradigm: str     # UID, else the file's name


def read_pairs(paths: Sequence[str]) -> list[Pair]:
    """JSON-lines files -> their pairs; a file that is missing or a line that is not a pair is one line naming it."""
    pairs = []
    for path in paths:
        if not storage.isfile(path):
            raise UserError(f"minimal-pair file not found: {path} (give BLiMP-format JSON lines: sentence_good, "
                            "sentence_bad)")
        name = os.path.splitext(os.path.basename(path))[0]
        for number, line in enumerate(storage.read_text(path).splitlines(), 1):
            if line.strip():
                pairs.append(_pair(line, f"{path}:{number}", name))
    if not pairs:
        raise UserError(f"no minimal pairs in {', '.join(paths)} (each line a JSON object with sentence_good and "
                        "sentence_bad)")
    return pairs


def _pair(line: str, where: str, name: str) -> Pair:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where} is not JSON ({e.msg} at column {e.colno}): each line is one pair, a JSON object "
                        "with sentence_good and sentence_bad") from None
    if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("sentence_good", "sentence_bad")):
        raise UserError(f"{where} has no string sentence_good and sentence_bad: each line is one pair, a JSON object "
                        "with both")
    paradigm = str(row.get("UID") or name)
    return Pair(row["sentence_good"], row["sentence_bad"], str(row.get("linguistics_term") or paradigm), paradigm)


def sentence_scorer(path: str, *, pll: str = "original", tokenizer_path: str = "", batch_size: int = 8):
    """A checkpoint -> a function sentences -> their log-likelihoods: a masked LM's PLL; a GPT's log P(sentence | end
    of text); a T5's log P(sentence | its encoder reading the end of sequence alone), as lm-eval scores an empty
    context."""
    masked_lm.check_variant(pll)
    family = pretrained.family_of(path, "--workdir")
    if family in masked_lm.MASKED_LMS:
        lm = masked_lm.load_masked_lm(path, tokenizer_path=tokenizer_path, flag="--workdir")
        return lambda sentences: masked_lm.sentence_scores(lm, sentences, pll)
    if family in models.FAMILIES and models.family(family).encoder_decoder:
        t5 = encoder_decoder.load_seq2seq(path, tokenizer_path=tokenizer_path, flag="--workdir")
        return lambda sentences: np.array([score for score, _ in encoder_decoder.continuation_scores(
            t5, [([t5.tokenizer.eos_id], t5.tokenizer.encode(text)) for text in sentences], batch_size=batch_size)])
    gpt = load_language_model(path, tokenizer_path=tokenizer_path, flag="--workdir")
    eos = eos_id_or_none(gpt.tokenizer)

    def causal(sentences: Sequence[str]) -> np.ndarray:
        encoded = [gpt.tokenizer.encode(text) for text in sentences]
        pairs = [([eos], ids) if eos is not None else (ids[:1], ids[1:]) for ids in encoded]
        return np.array([score for score, _ in continuation_scores(gpt, pairs, batch_size=batch_size)])
    return causal


def accuracies(pairs: Sequence[Pair], good: np.ndarray, bad: np.ndarray) -> dict:
    """-> {"overall": {...}, "phenomena": {name: {...}}, "paradigms": {name: {...}}}, each {pairs, accuracy}."""
    right = good > bad
    summary: dict = {"overall": {"pairs": len(pairs), "accuracy": float(right.mean())}}
    for plural, key in (("phenomena", "phenomenon"), ("paradigms", "paradigm")):
        groups = collections.defaultdict(list)
        for pair, correct in zip(pairs, right):
            groups[getattr(pair, key)].append(bool(correct))
        summary[plural] = {name: {"pairs": len(values), "accuracy": float(np.mean(values))}
                           for name, values in sorted(groups.items())}
    return summary


def format_accuracies(summary: dict) -> str:
    lines = [f"{'phenomenon':<40} {'pairs':>6} {'accuracy':>9}"]
    for name, row in summary["phenomena"].items():
        lines.append(f"{name:<40} {row['pairs']:>6} {row['accuracy']:>9.4f}")
    overall = summary["overall"]
    lines.append(f"{'overall':<40} {overall['pairs']:>6} {overall['accuracy']:>9.4f}")
    return "\n".join(lines)
