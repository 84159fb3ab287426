"""BERT for sequence labelling (J&M 11.3.3): the pretrained encoder + a fresh tag classifier at every position.

Words become pieces as pretrain/data/tagging.py aligns them: a word's tag on its first piece (or on every
piece with config.data.label_all_subwords), the other positions out of the loss; decoding gives each word
the argmax tag at its first piece. Inputs are `[CLS] pieces [SEP]`, truncated to max_seq_length (words past
it are tagged O, as Hugging Face's run_ner leaves them unlabelled).
"""
from __future__ import annotations

import numpy as np

from objectives.task_heads.objective import FineTuningObjective
from pretrain.data import finetune_data, tagging
from pretrain.finetuners.base import FINETUNERS
from pretrain.finetuners.bert import BertFinetuner
from pretrain.runtime.errors import UserError
from pretrain.tasks.conll import ConllTask, Sentence


@FINETUNERS.register("bert_tagging")
class BertTaggingFinetuner(BertFinetuner):
    """params['bert'] + params['head'] (TokenClassificationHead); predictions are tag names per word."""
    kinds = ("tagging",)

    task: ConllTask

    def make_objective(self) -> FineTuningObjective:
        return FineTuningObjective(self.task.kind, self.task.num_labels)

    def check(self) -> None:
        super().check()
        check_token_length(self.config.data)

    def encode(self, sentences: list[Sentence], batch_size: int) -> finetune_data.FineTuningData:
        """Per sentence: pieces, 'labels' [N, max_seq_length] (-100 off the labelled pieces) and 'word_index'."""
        c, ids = self.config, {tag: i for i, tag in enumerate(self.task.labels)}
        rows = [tagging.align_word_labels(self.tokenizer, list(s.words), [ids[t] for t in s.tags],
                                          c.data.max_seq_length, label_all_subwords=c.data.label_all_subwords)
                for s in sentences]
        features = [(ids, [0] * len(ids)) for ids in map(tagging.piece_ids, rows)]
        fields = {name: np.stack([r[name] for r in rows]) for name in ("labels", "word_index")}
        return finetune_data.FineTuningData(features, fields, batch_size, self.tokenizer.pad_id,
                                            **finetune_data.padding(c.data), token_fields=("labels", "word_index"))

    def to_labels(self, predictions: dict[str, np.ndarray]) -> np.ndarray:
        """{'tags': [B, L]} -> [B, max_seq_length] (batches pad to different lengths)."""
        tags = predictions["tags"]
        return np.pad(tags, ((0, 0), (0, self.config.data.max_seq_length - tags.shape[1])))

    def decode(self, predictions: np.ndarray, data: finetune_data.FineTuningData,
               sentences: list[Sentence]) -> list[list[str]]:
        """Token tags [N, max_seq_length] -> each word's tag name (its first piece's)."""
        word_index = data.fields["word_index"]
        return [[self.task.labels[t] for t in tagging.decode_word_tags(predictions[i], word_index[i], len(s.words))]
                for i, s in enumerate(sentences)]


def check_token_length(data_config) -> None:
    """Per-piece fields are [max_seq_length] and cut to each batch's padded length, which must not exceed it."""
    if data_config.max_seq_length % data_config.pad_to_multiple_of:
        raise UserError(f"config.data.max_seq_length={data_config.max_seq_length} must be a multiple of "
                        f"config.data.pad_to_multiple_of={data_config.pad_to_multiple_of} for per-token tasks")
