"""The BERT family for fine-tuning: the pretrained encoder + a fresh classification / regression head
on the pooled [CLS] vector (models/finetuning.py), inputs `[CLS] a [SEP] (b [SEP])`."""
from __future__ import annotations

import ml_collections
import numpy as np

from models.finetuning import BertForFineTuning
from objectives.finetuning import FineTuningObjective
from pretrain.core.errors import UserError
from pretrain.core.pretrained import Pretrained
from pretrain.data import finetune_data
from pretrain.families.base import merge_pretrained, model_config, one_per_example
from pretrain.glue import tasks as glue


class BertFamily:
    """BERT encoder (params['bert']) + a fresh task head (params['head']) on the pooled [CLS] vector."""
    name = "bert"

    def __init__(self, config: ml_collections.ConfigDict, task: glue.GlueTask, tokenizer):
        self.config, self.task, self.tokenizer = config, task, tokenizer
        self.kind = "regression" if task.is_regression else "classification"
        self.objective = FineTuningObjective(self.kind, task.num_labels)

    @property
    def num_layers(self) -> int:
        return self.config.model.num_layers

    def check(self) -> None:
        c = self.config
        if c.data.max_seq_length > c.model.max_position_embeddings:
            raise UserError(f"config.data.max_seq_length={c.data.max_seq_length} exceeds the model's "
                            f"{c.model.max_position_embeddings} positions")

    def encode(self, examples: list[glue.Example], batch_size: int) -> finetune_data.FineTuningData:
        """[CLS] a [SEP] (b [SEP]) features with the label as a per-example field."""
        task, c = self.task, self.config
        features = finetune_data.encode_texts(self.tokenizer, [e.text_a for e in examples],
                                              [e.text_b for e in examples] if task.is_pair else None,
                                              c.data.max_seq_length)
        labels = task.label_array(examples)
        return finetune_data.FineTuningData(features, {"label": labels}, batch_size, self.tokenizer.pad_id,
                                            **finetune_data.padding(c.data))

    def build_model(self) -> BertForFineTuning:
        return BertForFineTuning(model_config(self.config), self.kind,
                                 self.objective.num_labels, self.config.model.classifier_dropout)

    def merge_pretrained(self, params: dict, init: Pretrained) -> tuple[dict, list[str]]:
        merged = dict(params)
        merged["bert"], fresh = merge_pretrained(params["bert"], init.params, init.source, prefix="bert/")
        return merged, fresh  # the task head is always fresh: only surprises in the encoder are listed

    def predict_fn(self, model):
        """(params, batch) -> {'label' [B]} or {'score' [B]}: a forward pass, argmax / regression output."""
        def predict(params, batch):
            outputs = model.apply({"params": params}, **self.objective.model_inputs(batch), deterministic=True)
            return self.objective.predictions(outputs, batch)
        return predict

    def to_labels(self, predictions: dict[str, np.ndarray]) -> np.ndarray:
        return next(iter(predictions.values()))

    decode = staticmethod(one_per_example)

    def for_metrics(self, predictions: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return predictions  # always a class id / score

    def for_submission(self, predictions: np.ndarray) -> np.ndarray:
        return predictions
