"""T5 fine-tuning on GLUE as text to text (Raffel et al. 2020, Section 2.4 and Appendix D).

An example becomes "mrpc sentence1: ... sentence2: ..." -> "equivalent" (pretrain/tasks/glue/text_to_text.py);
the model trains with the same teacher-forced cross-entropy as in pretraining (objectives/denoising.py,
with T5's z-loss), and predicts by greedy decoding with the key/value cache (models/decoding.py). The
decoded string is parsed back to a class id (or an STS-B score); a string that names no class counts
as wrong, so the official metrics of the BERT path score both families alike.
"""
from __future__ import annotations

import jax
import ml_collections
import numpy as np

from models import peft, t5
from objectives.denoising import denoising_loss
from pretrain.data import finetune_data
from pretrain.finetuners.base import FINETUNERS, merge_pretrained, model_config, one_per_example
from pretrain.runtime.errors import UserError
from pretrain.tasks.classification import ClassificationTask, Example
from pretrain.tasks.glue import text_to_text
from pretrain.training import peft as parameter_efficient
from pretrain.training.pretrained import Pretrained


class TextToTextObjective:
    """Teacher-forced seq2seq loss on the target words; padding rows carry decoder weight 0."""

    def __init__(self, z_loss: float = 0.0):
        self.z_loss = z_loss

    @staticmethod
    def model_inputs(batch: dict) -> dict:
        return {"encoder_input_ids": batch["encoder_input_ids"], "decoder_input_ids": batch["decoder_input_ids"]}

    def loss(self, outputs: dict, batch: dict) -> tuple[jax.Array, dict]:
        loss, metrics = denoising_loss(outputs["logits"], batch, self.z_loss)
        metrics["examples"] = batch["weight"].sum()
        return loss, metrics


@FINETUNERS.register("t5")
class T5Finetuner:
    """T5ForConditionalGeneration fine-tuned whole (no new head): the label is a word it writes."""
    name = "t5"
    kinds = ("classification", "regression")  # GLUE's: STS-B's score is written as a word too
    families = ("t5",)

    def __init__(self, config: ml_collections.ConfigDict, task: ClassificationTask, tokenizer):
        self.config, self.task, self.tokenizer = config, task, tokenizer
        self.objective = TextToTextObjective(config.get("z_loss", 0.0))
        # The longest target plus EOS: the target length of every batch and the decoding budget.
        self.targets_length = self.longest_target() + 1

    def longest_target(self) -> int:
        """Pieces of the longest label word (STS-B: of the scores 0.0, 0.2, ..., 5.0)."""
        task = self.task
        words = ([text_to_text.label_text(task, i / 5) for i in range(26)] if task.is_regression
                 else list(task.labels))
        return max(len(ids) for ids in self.tokenizer.encode_batch(words))

    @property
    def num_layers(self) -> int:
        return self.config.model.num_encoder_layers

    def check(self) -> None:
        if self.config.freezing.strategy != "none":
            raise UserError(f"config.freezing.strategy={self.config.freezing.strategy!r} names BERT's layers; "
                            "T5 fine-tunes every weight (use --config.freezing.strategy=none)")
        if self.tokenizer.pad_id != 0:
            raise UserError(f"the tokenizer's pad id is {self.tokenizer.pad_id}; T5 needs pad = 0 (it is also "
                            "the decoder's start token): train it with python -m pretrain.tools.train_tokenizer")

    def encode(self, examples: list[Example], batch_size: int) -> finetune_data.Seq2SeqData:
        """(input ids + EOS truncated to max_seq_length, label-word ids + EOS) per example."""
        return self.seq2seq_data(text_to_text.text_pairs(self.task, examples),
                                 {"label": self.task.label_array(examples)}, batch_size)

    def seq2seq_data(self, pairs: list[tuple[str, str]], fields: dict[str, np.ndarray],
                     batch_size: int) -> finetune_data.Seq2SeqData:
        """(input text, target text) pairs -> input ids cut to max_seq_length - 1 and target ids cut to
        targets_length - 1, each + EOS."""
        eos, limit = self.tokenizer.eos_id, self.config.data.max_seq_length
        inputs = self.tokenizer.encode_batch([a for a, _ in pairs])
        targets = self.tokenizer.encode_batch([b for _, b in pairs])
        features = [(ids[:limit - 1] + [eos], target[:self.targets_length - 1] + [eos])
                    for ids, target in zip(inputs, targets)]
        return finetune_data.Seq2SeqData(features, fields, batch_size, self.tokenizer.pad_id,
                                         **finetune_data.padding(self.config.data), targets_length=self.targets_length)

    def build_model(self) -> t5.T5 | peft.PeftModel:
        """T5, with a PEFT method attached from outside (its parameters where T5's own are: the tree's root)."""
        return peft.attach(t5.T5(model_config(self.config)), parameter_efficient.peft_config(self.config))

    def merge_pretrained(self, params: dict, init: Pretrained) -> tuple[dict, list[str]]:
        return merge_pretrained(params, init.params, init.source)

    def predict_fn(self, model: t5.T5):
        """(params, batch) -> {'tokens': [B, targets_length]}: greedy decoding with the cache."""
        length, eos = self.targets_length, self.tokenizer.eos_id

        def predict(params, batch):
            return {"tokens": t5.generate(model, params, batch["encoder_input_ids"], length, eos)}
        return predict

    def to_labels(self, predictions: dict[str, np.ndarray]) -> np.ndarray:
        """Decoded ids (up to EOS) -> text -> class id / score; unreadable text -> INVALID_*."""
        parsed = [text_to_text.parse_label(self.task, t) for t in self.texts(predictions["tokens"])]
        return np.array(parsed, np.float32 if self.task.is_regression else np.int32)

    decode = staticmethod(one_per_example)

    def texts(self, tokens: np.ndarray) -> list[str]:
        """Decoded ids [N, targets_length] -> each row's text up to its first EOS."""
        out = []
        for row in tokens:
            ends = np.flatnonzero(row == self.tokenizer.eos_id)
            out.append(self.tokenizer.decode(row[:ends[0]] if len(ends) else row))
        return out

    def for_metrics(self, predictions: np.ndarray, labels: np.ndarray) -> np.ndarray:
        return text_to_text.predictions_for_metrics(self.task, predictions, labels)

    def for_submission(self, predictions: np.ndarray) -> np.ndarray:
        """The GLUE server needs a class for every row: an unreadable output becomes class 0."""
        if self.task.is_regression:
            return np.clip(predictions, 0.0, 5.0)
        return np.where(predictions == text_to_text.INVALID_CLASS, 0, predictions)
