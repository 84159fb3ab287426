"""T5 for extractive QA as text to text (Raffel et al. 2020, Appendix D): "question: ... context: ..." in, the
answer's text out, scored by the same official SQuAD metric as the BERT path. An unanswerable v2.0 question's
target is the empty string (EOS alone), so an empty output is its no-answer prediction."""
from __future__ import annotations

import ml_collections
import numpy as np

from pretrain.data import finetune_data
from pretrain.families.t5 import T5Family, TextToTextObjective
from pretrain.tasks.squad import Prediction, QaExample, SquadTask


def text_pair(example: QaExample) -> tuple[str, str]:
    """(input, target) in T5's SQuAD format; the first gold answer is the target, as in training."""
    answer = example.answers[0].text if example.answers else ""
    return f"question: {example.question} context: {example.context}", answer


class T5QaFamily(T5Family):
    """T5ForConditionalGeneration fine-tuned whole; the answer is decoded greedily with the cache."""

    def __init__(self, config: ml_collections.ConfigDict, task: SquadTask, tokenizer):
        self.config, self.task, self.tokenizer = config, task, tokenizer
        self.objective = TextToTextObjective(config.get("z_loss", 0.0))
        self.targets_length = config.data.max_answer_length + 1  # pieces + EOS: every batch, and the budget

    def encode(self, examples: list[QaExample], batch_size: int) -> finetune_data.Seq2SeqData:
        """(input ids cut to max_seq_length - 1, + EOS; answer ids cut to max_answer_length, + EOS) per question:
        a context longer than the model is truncated, as T5 does, not windowed."""
        eos, limit = self.tokenizer.eos_id, self.config.data.max_seq_length
        pairs = [text_pair(e) for e in examples]
        inputs = self.tokenizer.encode_batch([a for a, _ in pairs])
        targets = self.tokenizer.encode_batch([b for _, b in pairs])
        features = [(ids[:limit - 1] + [eos], target[:self.targets_length - 1] + [eos])
                    for ids, target in zip(inputs, targets)]
        return finetune_data.Seq2SeqData(features, {}, batch_size, self.tokenizer.pad_id,
                                         **finetune_data.padding(self.config.data), targets_length=self.targets_length)

    def to_labels(self, predictions: dict[str, np.ndarray]) -> np.ndarray:
        return predictions["tokens"]  # [B, targets_length]

    def decode(self, tokens: np.ndarray, data, examples: list[QaExample]) -> list[Prediction]:
        """Decoded ids up to EOS -> the answer text (the empty one says 'no answer')."""
        eos, out = self.tokenizer.eos_id, []
        for row in tokens:
            ends = np.flatnonzero(row == eos)
            out.append(Prediction(self.tokenizer.decode(row[:ends[0]] if len(ends) else row).strip(), -np.inf))
        return out
