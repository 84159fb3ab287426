"""Span-based NER with BERT (Jurafsky & Martin, SLP3 ch. 11, "J&M" below, Section 11.3.4, Figure 11.10): every
span of up to config.span_head.max_width words is classified into an entity type or NULL (eq. 11.21), from the
span representation J&M define (models/heads.py SpanClassificationHead: learned start and end boundaries, eqs.
11.17-11.19, and a self-attention summary, eq. 11.20; or the plain boundaries and average, eqs. 11.15-11.16).

A span covers whole words: from its first word's first piece to its last word's last piece. Decoding takes
each span's argmax, and labels a span with an entity type only where that type's probability also reaches
config.span_head.threshold (J&M's calibrated non-NULL threshold; 0 = plain argmax). Spans may nest
(`decode_spans`); for CoNLL's flat scoring a greedy pass keeps the most probable spans that do not overlap and
writes them as BIO tags, so the task scores, and writes, the same files as head=bio.
"""
from __future__ import annotations

import jax
import numpy as np

from objectives.task_heads.base import IGNORE
from objectives.task_heads.objective import FineTuningObjective
from pretrain.data import finetune_data, tagging
from pretrain.finetuners.base import FINETUNERS
from pretrain.finetuners.bert import BertFinetuner
from pretrain.tasks.conll import ConllTask, Sentence

NULL = "NULL"


@FINETUNERS.register("bert_spans")
class BertSpanFinetuner(BertFinetuner):
    """params['bert'] + params['head'] (SpanClassificationHead); predictions are BIO tags per word."""
    kinds = ("span",)

    task: ConllTask

    @property
    def types(self) -> tuple[str, ...]:
        """The span classes: NULL, then the entity types of the task's BIO tags."""
        return (NULL, *sorted({tag[2:] for tag in self.task.labels if tag != "O"}))

    def make_objective(self) -> FineTuningObjective:
        return FineTuningObjective(self.task.kind, len(self.types))

    def head_options(self) -> dict:
        head = self.config.span_head
        return {"boundaries": head.boundaries, "summary": head.summary}

    def sentence_spans(self, sentence: Sentence) -> tuple[list[int], list[tuple[int, int]], list[tuple[int, int]],
                                                          list[int]]:
        """-> ([CLS] pieces [SEP], then the piece spans, word spans and labels of every span of up to max_width
        words that fits the model)."""
        c = self.config
        row = tagging.align_word_labels(self.tokenizer, list(sentence.words), [0] * len(sentence.words),
                                        c.data.max_seq_length)
        firsts = np.flatnonzero(row["word_index"] >= 0)          # first piece of each word that fits
        lasts = np.append(firsts[1:], row["input_mask"].sum() - 1) - 1  # the piece before the next word / [SEP]
        gold = {(a, b): t for a, b, t in tagging.bio_to_spans(list(sentence.tags))}
        pieces, words, labels = [], [], []
        for a in range(len(firsts)):
            for b in range(a, min(a + c.span_head.max_width, len(firsts))):
                pieces.append((int(firsts[a]), int(lasts[b])))
                words.append((a, b))
                labels.append(self.types.index(gold[(a, b)]) if (a, b) in gold else 0)
        return tagging.piece_ids(row), pieces, words, labels

    def encode(self, sentences: list[Sentence], batch_size: int) -> finetune_data.FineTuningData:
        """Per sentence: pieces; 'spans' [N, S, 2] piece positions, 'span_labels' [N, S] (IGNORE on padding),
        'span_words' [N, S, 2] (-1 on padding), S the most spans of any sentence."""
        rows = [self.sentence_spans(s) for s in sentences]
        most = max(len(words) for _, _, words, _ in rows)
        spans = np.zeros((len(rows), most, 2), np.int32)
        words = np.full((len(rows), most, 2), -1, np.int32)
        labels = np.full((len(rows), most), IGNORE, np.int32)
        for n, (_, piece_spans, word_spans, span_labels) in enumerate(rows):
            spans[n, :len(piece_spans)], words[n, :len(word_spans)] = piece_spans, word_spans
            labels[n, :len(span_labels)] = span_labels
        features = [(ids, [0] * len(ids)) for ids, _, _, _ in rows]
        return finetune_data.FineTuningData(features, {"spans": spans, "span_labels": labels, "span_words": words},
                                            batch_size, self.tokenizer.pad_id, **finetune_data.padding(self.config.data))

    def predictions(self, outputs: dict, batch: dict) -> dict:
        return {"probs": jax.nn.softmax(outputs["logits"], axis=-1)}  # [B, S, types]

    def to_labels(self, predictions: dict[str, np.ndarray]) -> np.ndarray:
        return predictions["probs"]

    def decode_spans(self, probs: np.ndarray, words: np.ndarray) -> list[tuple[int, int, str, float]]:
        """One sentence's probs [S, types] and span_words [S, 2] -> every span labelled with a type (nested ones
        kept), as (first word, last word, type, probability), most probable first."""
        best = 1 + probs[:, 1:].argmax(-1)
        p = probs[np.arange(len(probs)), best]
        keep = (words[:, 0] >= 0) & (p > probs[:, 0]) & (p >= self.config.span_head.threshold)
        found = [(int(a), int(b), self.types[t], float(q)) for (a, b), t, q, k in zip(words, best, p, keep) if k]
        return sorted(found, key=lambda span: -span[3])

    def decode(self, probs: np.ndarray, data: finetune_data.FineTuningData,
               sentences: list[Sentence]) -> list[list[str]]:
        """The greedy non-overlapping spans of each sentence, as BIO tags per word."""
        out = []
        for n, sentence in enumerate(sentences):
            tags = ["O"] * len(sentence.words)
            for a, b, kind, _ in self.decode_spans(probs[n], data.fields["span_words"][n]):
                if all(tag == "O" for tag in tags[a:b + 1]):
                    tags[a:b + 1] = [f"B-{kind}"] + [f"I-{kind}"] * (b - a)
            out.append(tags)
        return out
