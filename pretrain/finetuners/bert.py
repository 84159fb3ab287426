"""The encoder finetuner: the pretrained encoder + a fresh classification / regression head on the pooled [CLS]
vector, inputs `[CLS] a [SEP] (b [SEP])`. The finetuners of the other head kinds (tagging, spans, QA) subclass it;
the head itself is the task's kind (objectives/task_heads/). Every encoder family (BERT and its variants, ModernBERT)
fine-tunes through these, over the module its registration names (ModelFamily.task_model: models/bert_tasks.py,
models/modernbert.py)."""
from __future__ import annotations

import ml_collections
import numpy as np

import flax.linen as nn

import models
from objectives.task_heads.objective import FineTuningObjective
from pretrain.data import finetune_data
from pretrain.finetuners.base import FINETUNERS, merge_pretrained, model_config, one_per_example
from pretrain.runtime.errors import UserError
from pretrain.tasks.classification import ClassificationTask, Example
from pretrain.training import peft as parameter_efficient
from pretrain.training.pretrained import Pretrained

# The encoder families: every family with a task model (an encoder with a task head) fine-tunes through these
# (those models/families.py registers, read when this module is imported).
ENCODERS = tuple(name for name, _ in models.FAMILIES.find(lambda family: family.task_model is not None))


@FINETUNERS.register("bert")
class BertFinetuner:
    """The encoder (params[body], e.g. 'bert') + a fresh task head (params['head']) on the pooled [CLS] vector."""
    kinds = ("classification", "regression")  # GLUE's sequence heads
    families = ENCODERS

    def __init__(self, config: ml_collections.ConfigDict, task: ClassificationTask, tokenizer):
        self.config, self.task, self.tokenizer = config, task, tokenizer
        self.family = models.family(config.model.name)
        self.objective = self.make_objective()

    @property
    def name(self) -> str:
        return self.family.name

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

    def build_model(self) -> nn.Module:
        task_model = models.registry.resolve(self.family.task_model)
        return task_model(model_config(self.config), self.objective.head, self.objective.num_labels,
                          self.config.model.classifier_dropout, tuple(sorted(self.head_options().items())),
                          peft=parameter_efficient.peft_config(self.config))

    def head_options(self) -> dict:
        """The head kind's options (none for the plain heads)."""
        return {}

    def merge_pretrained(self, params: dict, init: Pretrained) -> tuple[dict, list[str]]:
        """The checkpoint's subtrees into the model's of the same name: the encoder (a family with a params_subtree
        gives it alone) and, where the checkpoint has it, what else it shares (ModernBERT's prediction head)."""
        pretrained = {self.family.body.key: init.params} if self.family.params_subtree else init.params
        merged, fresh = dict(params), []
        for key in sorted(params.keys() & pretrained.keys()):
            merged[key], missing = merge_pretrained(params[key], pretrained[key], init.source, prefix=f"{key}/")
            fresh += missing
        return merged, fresh  # the task head is always fresh: only surprises in what loaded are listed

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
