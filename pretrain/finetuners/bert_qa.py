"""BERT for extractive question answering (J&M 11.3.4; Devlin et al. 2019, Section 4.2): start and end logits at
every position of `[CLS] question [SEP] context window [SEP]`.

A context longer than the model is cut into windows of pieces that overlap by config.data.doc_stride (as
Hugging Face's run_qa does); a window that does not hold the whole answer is labelled [CLS] (no answer).
Contexts are split at whitespace into words, as BERT's run_squad does, and each word into pieces, so a
predicted span maps back to whole words and to the context's characters. Decoding per question: the
n-best starts and ends of each window (config.data.n_best), spans inside the context of at most
max_answer_length pieces, the best start + end score over all windows; the no-answer score is the smallest
[CLS] start + end over the windows (SQuAD 2.0).
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import re

import numpy as np

from objectives.task_heads.objective import FineTuningObjective
from pretrain.data import finetune_data
from pretrain.finetuners.base import FINETUNERS
from pretrain.finetuners.bert import BertFinetuner
from pretrain.finetuners.bert_tagging import check_token_length
from pretrain.runtime.errors import UserError
from pretrain.tasks.squad import Prediction, QaExample, SquadTask

NEG = -1e9  # the logit of a padding position


@dataclasses.dataclass
class Window:
    """One feature: a question with one window of its context."""
    tokens: list[int]
    context_start: int        # position of the window's first context piece
    words: list[int]          # the context word of each piece in the window
    start: int = 0            # the answer's first and last piece positions; 0 = [CLS] (not in this window)
    end: int = 0


def split_words(context: str) -> tuple[list[str], list[int], list[int]]:
    """Whitespace-separated words with their character [start, end) offsets."""
    spans = [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", context)]
    return [w for w, _, _ in spans], [s for _, s, _ in spans], [e for _, _, e in spans]


@FINETUNERS.register("bert_qa")
class BertQaFinetuner(BertFinetuner):
    """params['bert'] + params['head'] (QuestionAnsweringHead); predictions are answer texts (squad.Prediction)."""
    kinds = ("qa",)

    task: SquadTask

    def make_objective(self) -> FineTuningObjective:
        return FineTuningObjective(self.task.kind, 2, max_answer_length=self.config.data.max_answer_length,
                                   allow_null_answer=self.task.version_2)

    def check(self) -> None:
        super().check()
        check_token_length(self.config.data)
        d = self.config.data
        room = d.max_seq_length - d.max_query_length - 3
        if room <= d.doc_stride:
            raise UserError(f"config.data.max_seq_length={d.max_seq_length} leaves {room} context pieces per window "
                            f"after a {d.max_query_length}-piece question: no room for the overlap "
                            f"config.data.doc_stride={d.doc_stride}; raise max_seq_length or lower doc_stride")

    def windows(self, example: QaExample) -> list[Window]:
        """The question's features: windows of `room` context pieces, each starting `room - doc_stride` after
        the last, until one reaches the context's end."""
        d, tok = self.config.data, self.tokenizer
        question = tok.encode(example.question)[:d.max_query_length]
        words, starts, _ = split_words(example.context)
        pieces, piece_words = [], []
        for w, word_pieces in enumerate(tok.encode_batch(words) if words else []):
            pieces += word_pieces or [tok.unk_id]
            piece_words += [w] * len(word_pieces or [tok.unk_id])
        answer = None
        if example.answers:  # the first gold answer trains, as in BERT's run_squad
            a = example.answers[0]
            first = bisect.bisect_right(starts, a.start) - 1
            last = bisect.bisect_right(starts, a.start + max(len(a.text), 1) - 1) - 1
            answer = (piece_words.index(first), len(piece_words) - 1 - piece_words[::-1].index(last))
        room = d.max_seq_length - len(question) - 3
        out, offset = [], 0
        while True:
            window = Window([tok.cls_id, *question, tok.sep_id, *pieces[offset:offset + room], tok.sep_id],
                            len(question) + 2, piece_words[offset:offset + room])
            if answer and offset <= answer[0] and answer[1] < offset + room:
                window.start, window.end = (p - offset + window.context_start for p in answer)
            out.append(window)
            if offset + room >= len(pieces):
                return out
            offset += room - d.doc_stride

    def encode(self, examples: list[QaExample], batch_size: int) -> finetune_data.FineTuningData:
        """Every window of every question: 'start_position', 'end_position', 'example' [N]; 'context_mask',
        'word' (the context word at each position, -1 elsewhere) [N, max_seq_length]."""
        windows, owners = [], []
        for i, example in enumerate(examples):
            for window in self.windows(example):
                windows.append(window)
                owners.append(i)
        length = self.config.data.max_seq_length
        word = np.full((len(windows), length), -1, np.int32)
        for n, w in enumerate(windows):
            word[n, w.context_start:w.context_start + len(w.words)] = w.words
        fields = {"start_position": np.array([w.start for w in windows], np.int32),
                  "end_position": np.array([w.end for w in windows], np.int32),
                  "example": np.array(owners, np.int32), "context_mask": (word >= 0).astype(np.int32), "word": word}
        features = [(w.tokens, [0] * w.context_start + [1] * (len(w.tokens) - w.context_start)) for w in windows]
        return finetune_data.FineTuningData(features, fields, batch_size, self.tokenizer.pad_id,
                                            **finetune_data.padding(self.config.data),
                                            token_fields=("context_mask", "word"))

    def predictions(self, outputs: dict, batch: dict) -> dict:
        return outputs  # start and end logits [B, L]: the n-best search runs on the host, over windows

    def to_labels(self, predictions: dict[str, np.ndarray]) -> np.ndarray:
        """-> [B, 2, max_seq_length] start and end logits, padded with NEG."""
        logits = np.stack([predictions["start_logits"], predictions["end_logits"]], 1).astype(np.float32)
        return np.pad(logits, ((0, 0), (0, 0), (0, self.config.data.max_seq_length - logits.shape[2])),
                      constant_values=NEG)

    def decode(self, logits: np.ndarray, data: finetune_data.FineTuningData,
               examples: list[QaExample]) -> list[Prediction]:
        """[N, 2, max_seq_length] per window -> one Prediction per question (see the module docstring)."""
        by_example = collections.defaultdict(list)
        for n, i in enumerate(data.fields["example"]):
            by_example[int(i)].append(n)
        return [self.best_answer(example, logits[by_example[i]], data.fields["word"][by_example[i]])
                for i, example in enumerate(examples)]

    def best_answer(self, example: QaExample, logits: np.ndarray, word: np.ndarray) -> Prediction:
        """logits [W, 2, L] and word [W, L] of one question's windows -> its Prediction."""
        d = self.config.data
        best, span, null = -np.inf, None, float(np.min(logits[:, 0, 0] + logits[:, 1, 0]))
        for (start_logits, end_logits), words in zip(logits, word):
            context = np.flatnonzero(words >= 0)
            top_starts = context[np.argsort(start_logits[context])[::-1][:d.n_best]]
            top_ends = context[np.argsort(end_logits[context])[::-1][:d.n_best]]
            for s in top_starts:
                for e in top_ends:
                    score = start_logits[s] + end_logits[e]
                    if s <= e < s + d.max_answer_length and score > best:
                        best, span = score, (words[s], words[e])
        if span is None:
            return Prediction("", np.inf)
        _, starts, ends = split_words(example.context)
        return Prediction(example.context[starts[span[0]]:ends[span[1]]], float(null - best))
