"""ModernBERT with a task head for fine-tuning (models/modernbert.py is the encoder and its MLM): the family's
`task_model` (models/families.py), built by the encoder finetuners (pretrain/finetuners/bert.py). A PEFT method
(its own config) attaches to the encoder from outside it (models/peft/model.py `attach`), under `modernbert`."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import peft as parameter_efficient
from models.bert_tasks import TaskHead
from models.modernbert import ModernBertConfig, ModernBertModel, PredictionHead


class ModernBertForFineTuning(nn.Module):
    """ModernBERT with a task head, as Hugging Face's ModernBertFor{SequenceClassification, TokenClassification,
    QuestionAnswering} build it: the prediction head (pretrained with the MLM, `prediction_head`) on the pooled
    vector ([CLS] or the mean, config.classifier_pooling) or on every token, then the head kind's dropout and
    classifier (`head`). The same arguments as models/bert_tasks.BertForFineTuning."""
    config: ModernBertConfig
    kind: TaskHead                 # a registered head kind (objectives.task_heads.head_kind(name))
    num_labels: int
    classifier_dropout: float = 0.0
    head_options: tuple = ()
    peft: parameter_efficient.PeftConfig = parameter_efficient.NONE  # a PEFT method attached to the encoder

    def setup(self):
        c = self.config
        self.modernbert = parameter_efficient.attach(ModernBertModel(c), self.peft)
        self.prediction_head = PredictionHead(c)
        self.head = self.kind.head(self.num_labels, self.classifier_dropout, dict(self.head_options),
                                   initializer_range=c.hidden_size ** -0.5, **c.kwargs)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,  # [B, L]
                 deterministic: bool = True, **inputs: jax.Array) -> dict[str, jax.Array]:
        del segment_ids
        sequence = self.modernbert(input_ids, input_mask, deterministic)
        if self.config.classifier_pooling == "cls":
            pooled = sequence[:, 0]
        else:
            weights = (input_mask > 0).astype(jnp.float32)[..., None]
            # max(., 1): a batch's padding rows (no token at all) pool to zeros, not 0/0, whose gradient is NaN
            count = jnp.maximum(jnp.sum(weights, 1), 1.0)
            pooled = (jnp.sum(sequence.astype(jnp.float32) * weights, 1) / count).astype(sequence.dtype)
        return self.kind.outputs(self.head, self.prediction_head(sequence), self.prediction_head(pooled), inputs,
                                 deterministic)
