"""GPT with a task head on the last token, as transformers' GPT2ForSequenceClassification: the family's fine-tuning
model, with the constructor every family's has (models/bert_tasks.py, models/modernbert_tasks.py): the model config,
a head kind, the number of labels, the classifier's dropout, the kind's options and a PEFT method.

A causal model's last token is the only one that has seen the whole input, so sequence
classification reads the final LayerNorm's hidden state there (Radford et al. 2018, "Improving
Language Understanding by Generative Pre-Training", Section 3.2: "the final transformer block's
activation h_l^m" of the last token "is fed into an added linear output layer"). As Hugging Face's
GPT2ForSequenceClassification: one linear layer `score` [D, num_labels] without a bias, N(0,
initializer_range); num_labels = 1 is regression (STS-B). GPT-1 also drops out the classifier's
input (clf_pdrop 0.1 in openai/finetune-transformer-lm); HF does not: `classifier_dropout` (0 = HF). What the
head returns is the kind's (objectives/task_heads/: a pooled kind, classification or regression, reads the last
token as its pooled vector), with `score` as its layer.

The body sits under `gpt` with exactly models/gpt.py's parameter tree, so a pretrained GPT (a
pretrain.train workdir or an imported GPT-2) drops into params['gpt'] unchanged; `score` is new. A
PEFT method (its own config) attaches to the body from outside it (models/peft/model.py `attach`), under `gpt`.
Rows are right-padded; the last real token is found from `input_mask`, never from a pad id (the
char tokenizer's pad is a real character and GPT-2's is its EOS, which may end a real input).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import heads, layers, ops
from models import peft as parameter_efficient
from models.bert_tasks import TaskHead
from models.gpt import GPT, GPTConfig


def last_token_positions(input_mask: jax.Array) -> jax.Array:
    """[B, L] (nonzero = real token) -> [B] int32: the rightmost real position of each row (0 for an
    all-padding row, whose example carries weight 0)."""
    positions = jnp.arange(input_mask.shape[1], dtype=jnp.int32)[None]
    return jnp.max(jnp.where(input_mask != 0, positions, 0), axis=-1)


class GPTForFineTuning(nn.Module):
    """(input_ids, input_mask) [B, L] -> the kind's outputs ({'logits': [B, num_labels] float32} for a pooled kind)
    from each row's last real token."""
    config: GPTConfig
    kind: TaskHead                  # a registered head kind (objectives.task_heads.head_kind(name))
    num_labels: int                 # classes (1 for regression)
    classifier_dropout: float = 0.0
    head_options: tuple = ()        # the kind's options (none for the pooled kinds)
    peft: parameter_efficient.PeftConfig = parameter_efficient.NONE  # a PEFT method attached to the body

    def setup(self):
        c = self.config
        self.gpt = parameter_efficient.attach(GPT(c), self.peft)
        self.score = layers.Dense(self.num_labels, ("embed", "classes"), use_bias=False, kernel_init=c.init(),
                                  **c.kwargs)
        self.dropout = ops.Dropout(self.classifier_dropout)

    def __call__(self, input_ids: jax.Array,      # [B, L] int, right-padded
                 input_mask: jax.Array,            # [B, L]: 1 = real token, 0 = padding
                 deterministic: bool = True, **inputs: jax.Array) -> dict[str, jax.Array]:  # the kind's input_keys
        # The mask doubles as GPT's segment ids (1 = the row's one document, 0 = padding): real tokens
        # attend as in pretraining, and padding, being after them, cannot reach them anyway.
        hidden = self.gpt.hidden_states(input_ids, segment_ids=input_mask.astype(jnp.int32),
                                        deterministic=deterministic)                     # [B, L, D]
        last = heads.gather_positions(hidden, last_token_positions(input_mask)[:, None])[:, 0]  # [B, D]
        return self.kind.outputs(self.classify, hidden, last, inputs, deterministic)

    def classify(self, h: jax.Array, deterministic: bool) -> jax.Array:  # [..., D] -> [..., num_labels] float32
        """The head the kind applies: GPT-1's classifier dropout, then HF's `score`."""
        return self.score(self.dropout(h, deterministic=deterministic)).astype(jnp.float32)
