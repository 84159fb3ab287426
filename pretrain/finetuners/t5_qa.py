"""T5 for extractive QA as text to text (Raffel et al. 2020, Appendix D): "question: ... context: ..." in, the
answer's text out, scored by the same official SQuAD metric as the BERT path. An unanswerable v2.0 question's
target is the empty string (EOS alone), so an empty output is its no-answer prediction."""
from __future__ import annotations

import numpy as np

from pretrain.data import finetune_data
from pretrain.finetuners.base import FINETUNERS
from pretrain.finetuners.t5 import T5Finetuner
from pretrain.tasks.squad import Prediction, QaExample, SquadTask


def text_pair(example: QaExample) -> tuple[str, str]:
    """(input, target) in T5's SQuAD format; the first gold answer is the target, as in training."""
    answer = example.answers[0].text if example.answers else ""
    return f"question: {example.question} context: {example.context}", answer


@FINETUNERS.register("t5_qa")
class T5QaFinetuner(T5Finetuner):
    """T5ForConditionalGeneration fine-tuned whole; the answer is decoded greedily with the cache."""
    kinds = ("qa",)

    task: SquadTask

    def longest_target(self) -> int:
        return self.config.data.max_answer_length  # pieces of a written answer

    def encode(self, examples: list[QaExample], batch_size: int) -> finetune_data.Seq2SeqData:
        """T5's (input, answer) per question: a context longer than the model is truncated, as T5 does, not
        windowed."""
        return self.seq2seq_data([text_pair(e) for e in examples], {}, batch_size)

    def to_labels(self, predictions: dict[str, np.ndarray]) -> np.ndarray:
        return predictions["tokens"]  # [B, targets_length]

    def decode(self, tokens: np.ndarray, data, examples: list[QaExample]) -> list[Prediction]:
        """Decoded ids up to EOS -> the answer text (the empty one says 'no answer')."""
        return [Prediction(text.strip(), -np.inf) for text in self.texts(tokens)]
