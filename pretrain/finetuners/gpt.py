"""GPT fine-tuned on GLUE with a linear head on the last token (models/gpt_tasks.py).

The input is GPT-1's "traversal-style" sequence without its learned start/delimiter/extract tokens,
which a pretrained GPT-2 does not have (Radford et al. 2018, Section 3.3): text_a, for a pair task a
separator and text_b, then the tokenizer's end-of-sequence token. GPT-2 has no [SEP], so its
<|endoftext|> separates and ends the input (HF examples fine-tune GPT2ForSequenceClassification with
pad = eos the same way); a tokenizer without an EOS (the char vocabulary) separates the pair with a
newline, or a space if its vocabulary lacks one, and ends with the last character of the text.
Inputs are truncated to max_seq_length (longer text first for pairs), the separator and EOS kept.

Training is the shared classification / regression objective (objectives/task_heads/: cross
entropy, or MSE for STS-B) on the head's logits; only the model inputs differ from BERT's.
"""
from __future__ import annotations

import ml_collections

from models.gpt_tasks import GPTForFineTuning
from objectives.task_heads.objective import FineTuningObjective
from pretrain.data import finetune_data, tokenizers
from pretrain.finetuners.base import FINETUNERS, merge_pretrained, model_config
from pretrain.finetuners.bert import BertFinetuner
from pretrain.runtime.errors import UserError
from pretrain.tasks.classification import ClassificationTask, Example
from pretrain.training import peft as parameter_efficient
from pretrain.training.pretrained import Pretrained


class LastTokenObjective(FineTuningObjective):
    """FineTuningObjective fed (input_ids, input_mask): GPT has no token types, the mask finds the last token."""

    def model_inputs(self, batch: dict) -> dict:
        return {"input_ids": batch["input_ids"], "input_mask": batch["input_mask"]}


def special_ids(tokenizer) -> tuple[list[int], list[int]]:
    """-> (separator ids between text_a and text_b, ids that end every input): [eos], [eos] when the
    tokenizer has an end-of-sequence token; otherwise a newline (or a space) and nothing."""
    eos = tokenizers.eos_id_or_none(tokenizer)
    if eos is not None:
        return [eos], [eos]
    for separator in ("\n", " "):
        try:
            return tokenizer.encode(separator), []
        except tokenizers.UnknownTextError:
            continue
    raise UserError(f"{tokenizer!r} has no end-of-sequence token, newline or space to separate a pair of texts; "
                    "build the tokenizer from a text that contains newlines")


@FINETUNERS.register("gpt")
class GPTFinetuner(BertFinetuner):
    """GPT body (params['gpt']) + a fresh `score` layer on the last real token. Predictions, labels and
    metrics are those of BERT's classification / regression head, so they are inherited."""
    name = "gpt"
    kinds = ("classification", "regression")
    families = ("gpt",)

    def __init__(self, config: ml_collections.ConfigDict, task: ClassificationTask, tokenizer):
        super().__init__(config, task, tokenizer)
        self.separator, self.end = special_ids(tokenizer)

    def make_objective(self) -> LastTokenObjective:
        head = super().make_objective()
        return LastTokenObjective(head.kind, head.num_labels)

    def check(self) -> None:
        c = self.config
        if c.data.max_seq_length > c.model.n_positions:
            raise UserError(f"config.data.max_seq_length={c.data.max_seq_length} exceeds the model's "
                            f"{c.model.n_positions} positions (set --config.data.max_seq_length={c.model.n_positions})")
        if c.data.max_seq_length <= len(self.separator) + len(self.end):
            raise UserError(f"config.data.max_seq_length={c.data.max_seq_length} leaves no room for text")

    def features(self, examples: list[Example]) -> list[tuple[list[int], list[int]]]:
        """-> per example (ids, segment ids 0 on text_a, 1 on the separator and text_b), at most
        max_seq_length long. The segment ids are informational: the model reads only ids and their length."""
        budget = self.config.data.max_seq_length - len(self.end)
        ids_a = self.tokenizer.encode_batch([e.text_a for e in examples])
        if not self.task.is_pair:
            return [(a[:budget] + self.end, [0] * (min(len(a), budget) + len(self.end))) for a in ids_a]
        ids_b = self.tokenizer.encode_batch([e.text_b or "" for e in examples])
        out = []
        for a, b in zip(ids_a, ids_b):
            a, b = finetune_data.truncate_pair(a, b, budget - len(self.separator))
            out.append((a + self.separator + b + self.end, [0] * len(a) + [1] * (len(self.separator) + len(b)
                                                                               + len(self.end))))
        return out

    def encode(self, examples: list[Example], batch_size: int) -> finetune_data.FineTuningData:
        labels = self.task.label_array(examples)
        return finetune_data.FineTuningData(self.features(examples), {"label": labels}, batch_size,
                                            self.tokenizer.pad_id, **finetune_data.padding(self.config.data))

    def build_model(self) -> GPTForFineTuning:
        return GPTForFineTuning(model_config(self.config), self.objective.head, self.objective.num_labels,
                                self.config.model.classifier_dropout, peft=parameter_efficient.peft_config(self.config))

    def merge_pretrained(self, params: dict, init: Pretrained) -> tuple[dict, list[str]]:
        """The whole pretrained GPT into params['gpt']; `score` (and nothing else, for a GPT of the same
        architecture) is listed as fresh."""
        return merge_pretrained(params, {"gpt": init.params}, init.source)
