"""DistilBERT's pretraining module (Sanh et al. 2019): a student BERT trained beside a frozen teacher BERT.

One module holds both, so the one trainer's step sees them as one model: params {'student': {bert, mlm_head},
'teacher': {bert, mlm_head}}. The teacher runs deterministically (no dropout) and its outputs pass through
`stop_gradient`, so no gradient flows into it; the family registration (models/registry.py, `frozen`) also
keeps it out of the optimizer (no update, no weight decay, no Adam moments). Both are BERT-shaped
`BertForPreTraining`s without the NSP head; the student is DistilBERT-shaped: no token-type embeddings and no
pooler (`student()`), so it exports as transformers' DistilBertForMaskedLM (models/convert/hf_distilbert.py), and its
`bert` subtree fine-tunes as a BERT does, with a fresh pooler, as DistilBERT's classifiers add theirs.

The student has the teacher's width and vocabulary and `num_layers` <= ceil(teacher_layers / 2): it starts from
every other teacher layer (student layer i <- teacher layer 2i), as DistilBERT does; pretrain/core/distillation.py
copies them at the start of a run. The objective (objectives/distillation.py) scores the outputs.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax

from models import heads
from models.bert import BertConfig, BertForPreTraining
from models.errors import ModelInputError


@dataclasses.dataclass(frozen=True)
class DistilConfig(BertConfig):
    """The student's BertConfig (num_layers is the student's) + the teacher's depth; every other field is shared."""
    teacher_layers: int = 12
    next_sentence: bool = False          # DistilBERT has no NSP; neither model builds the head

    def __post_init__(self):
        super().__post_init__()
        if self.next_sentence or self.span_boundary or self.shared_layers:
            raise ModelInputError("model 'distil' distils BERT's masked LM: set config.model.next_sentence, "
                                  "span_boundary and shared_layers to False")
        if self.num_layers > (self.teacher_layers + 1) // 2:
            raise ModelInputError(
                f"config.model.num_layers={self.num_layers} is more than half the teacher's {self.teacher_layers} "
                f"layers: a student starts from every other teacher layer (0, 2, 4, ...); set num_layers <= "
                f"{(self.teacher_layers + 1) // 2}")

    def bert(self) -> BertConfig:
        """The fields the student and the teacher share (the teacher's architecture)."""
        return BertConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(BertConfig)})

    def student(self) -> BertConfig:
        """DistilBERT (Sanh et al. 2019, Section 3): "the token-type embeddings and the pooler are removed"."""
        return dataclasses.replace(self.bert(), type_vocab_size=0, pooler=False)

    def teacher(self) -> BertConfig:
        """The teacher at its own depth (it runs deterministic: its dropout never applies)."""
        return dataclasses.replace(self.bert(), num_layers=self.teacher_layers)


def teacher_layer(i: int) -> int:
    """The teacher layer student layer i starts from."""
    return 2 * i


class DistillationModel(nn.Module):
    """-> {'mlm_logits' [B, P, V], 'hidden' [B, L, D]} of the student and the same with a 'teacher_' prefix
    (under stop_gradient)."""
    config: DistilConfig

    def setup(self):
        self.student = BertForPreTraining(self.config.student())
        self.teacher = BertForPreTraining(self.config.teacher())

    @staticmethod
    def _forward(model: BertForPreTraining, input_ids, segment_ids, input_mask, masked_lm_positions, deterministic):
        """BertForPreTraining's MLM path, keeping the last hidden states (its __call__ returns only the heads')."""
        sequence, _ = model.bert(input_ids, segment_ids, input_mask, deterministic)  # (the teacher's pooler too)
        masked = heads.gather_positions(sequence, masked_lm_positions)
        return model.mlm_head(masked, model.bert.embeddings.word_embeddings), sequence

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,  # [B, L] each
                 masked_lm_positions: jax.Array, deterministic: bool = True) -> dict[str, jax.Array]:  # [B, P]
        inputs = (input_ids, segment_ids, input_mask, masked_lm_positions)
        logits, hidden = self._forward(self.student, *inputs, deterministic)
        teacher_logits, teacher_hidden = jax.lax.stop_gradient(self._forward(self.teacher, *inputs, True))
        return {"mlm_logits": logits, "hidden": hidden,
                "teacher_mlm_logits": teacher_logits, "teacher_hidden": teacher_hidden}
