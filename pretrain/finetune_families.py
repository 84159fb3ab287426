"""What the fine-tuning loop needs from a model family, and the BERT encoder + task head family.

The loop in `pretrain/finetuner.py` is the same for every family; a family says how a GLUE split
becomes batches, which module and objective train on them, how a pretrained checkpoint fills the
fresh parameters, and how a prediction batch becomes label ids (or STS-B scores):

  bert  an encoder with a classification / regression head on the pooled [CLS] vector
  t5    text to text: task prefix + fields in, label word out (pretrain/finetune_t5.py)
  gpt   a decoder with a linear head on the last real token (pretrain/finetune_gpt.py)
"""
from __future__ import annotations

import jax
import ml_collections
import numpy as np

from models.finetuning import BertForFineTuning, bert_config_from_dict
from objectives.finetuning import FineTuningObjective
from pretrain import pretrained
from pretrain.data import finetune_data, glue
from pretrain.errors import UserError


def merge_pretrained(params: dict, pretrained_params: dict, source: str, prefix: str = "") -> tuple[dict, list[str]]:
    """Pretrained weights into a fresh parameter tree (shapes must agree) -> (params, fresh names).

    Every leaf of `params` found at the same path in `pretrained_params` is replaced; the others
    (a new task head) keep their random init and are listed as fresh.
    """
    fresh = []

    def take(path, current):
        node = pretrained_params
        for key in path:
            node = node.get(key.key) if isinstance(node, dict) else None
        name = prefix + "/".join(str(k.key) for k in path)
        if node is None:
            fresh.append(name)
            return current
        if tuple(np.shape(node)) != tuple(current.shape):
            raise UserError(f"{source}: {name} has shape {tuple(np.shape(node))}, the model wants "
                            f"{tuple(current.shape)}")
        return np.asarray(node, current.dtype)

    return jax.tree_util.tree_map_with_path(take, jax.device_get(params)), fresh


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
        labels = np.array([e.label for e in examples], np.float32 if task.is_regression else np.int32)
        return finetune_data.FineTuningData(features, {"label": labels}, batch_size, self.tokenizer.pad_id,
                                            c.data.pad_to_multiple_of)

    def build_model(self) -> BertForFineTuning:
        return BertForFineTuning(bert_config_from_dict(self.config.model.to_dict()), self.kind,
                                 self.task.num_labels, self.config.model.classifier_dropout)

    def merge_pretrained(self, params: dict, init: pretrained.Pretrained) -> tuple[dict, list[str]]:
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

    def for_metrics(self, predictions: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return predictions  # always a class id / score

    def for_submission(self, predictions: np.ndarray) -> np.ndarray:
        return predictions


def for_config(config: ml_collections.ConfigDict, task: glue.GlueTask, tokenizer):
    """The family named by config.model.name."""
    if config.model.name == "bert":
        return BertFamily(config, task, tokenizer)
    if config.model.name == "t5":
        from pretrain.finetune_t5 import T5Family
        return T5Family(config, task, tokenizer)
    if config.model.name == "gpt":
        from pretrain.finetune_gpt import GPTFamily
        return GPTFamily(config, task, tokenizer)
    raise UserError(f"config.model.name={config.model.name!r} cannot be fine-tuned here; use 'bert', 't5' or 'gpt'")
