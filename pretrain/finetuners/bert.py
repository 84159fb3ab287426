"""The BERT finetuner for fine-tuning: the pretrained encoder + a fresh classification / regression head
on the pooled [CLS] vector (models/bert_tasks.py), inputs `[CLS] a [SEP] (b [SEP])`. The BERT finetuners of
the other head kinds (tagging, spans, QA) subclass it; the head itself is the task's kind (objectives/task_heads/)."""
from __future__ import annotations

import ml_collections
import numpy as np

from models.bert_tasks import BertForFineTuning
from objectives.task_heads.objective import FineTuningObjective
from pretrain.data import finetune_data
from pretrain.finetuners.base import merge_pretrained, model_config, one_per_example
from pretrain.runtime.errors import UserError
from pretrain.tasks.classification import ClassificationTask, Example
from pretrain.training.pretrained import Pretrained


class BertFinetuner:
    """BERT encoder (params['bert']) + a fresh task head (params['head']) on the pooled [CLS] vector."""
    name = "bert"

    def __init__(self, config: ml_collections.ConfigDict, task: ClassificationTask, tokenizer):
        self.config, self.task, self.tokenizer = config, task, tokenizer
        self.objective = self.make_objective()

    def make_objective(self) -> FineTuningObjective:
        """The task's head kind and size (GLUE: classification or regression on the pooled vector)."""
        return FineTuningObjective(self.task.kind, self.task.num_labels)

    @property
    def num_layers(self) -> int:
        return self.config.model.num_layers

    def check(self) -> None:
        c = self.config
        if c.data.max_seq_length > c.model.max_position_embeddings:
            raise UserError(f"config.data.max_seq_length={c.data.max_seq_length} exceeds the model's "
                            f"{c.model.max_position_embeddings} positions")

    def encode(self, examples: list[Example], batch_size: int) -> finetune_data.FineTuningData:
        """[CLS] a [SEP] (b [SEP]) features with the label as a per-example field."""
        task, c = self.task, self.config
        features = finetune_data.encode_texts(self.tokenizer, [e.text_a for e in examples],
                                              [e.text_b for e in examples] if task.is_pair else None,
                                              c.data.max_seq_length)
        labels = task.label_array(examples)
        return finetune_data.FineTuningData(features, {"label": labels}, batch_size, self.tokenizer.pad_id,
                                            **finetune_data.padding(c.data))

    def build_model(self) -> BertForFineTuning:
        return BertForFineTuning(model_config(self.config), self.objective.head, self.objective.num_labels,
                                 self.config.model.classifier_dropout, tuple(sorted(self.head_options().items())))

    def head_options(self) -> dict:
        """The head kind's options (none for the plain heads)."""
        return {}

    def merge_pretrained(self, params: dict, init: Pretrained) -> tuple[dict, list[str]]:
        merged = dict(params)
        merged["bert"], fresh = merge_pretrained(params["bert"], init.params, init.source, prefix="bert/")
        return merged, fresh  # the task head is always fresh: only surprises in the encoder are listed

    def predict_fn(self, model):
        """(params, batch) -> `predictions` of a forward pass."""
        def predict(params, batch):
            outputs = model.apply({"params": params}, **self.objective.model_inputs(batch), deterministic=True)
            return self.predictions(outputs, batch)
        return predict

    def predictions(self, outputs: dict, batch: dict) -> dict:
        """The model's outputs -> what the host needs of a batch (here {'label' [B]} or {'score' [B]}: the
        argmax or the regression output); traced inside the jitted predict."""
        return self.objective.predictions(outputs, batch)

    def to_labels(self, predictions: dict[str, np.ndarray]) -> np.ndarray:
        return next(iter(predictions.values()))

    decode = staticmethod(one_per_example)

    def for_metrics(self, predictions: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return predictions  # always a class id / score

    def for_submission(self, predictions: np.ndarray) -> np.ndarray:
        return predictions
