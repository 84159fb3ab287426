"""Pretraining distillation (DistilBERT, TinyBERT, MiniLM): a student BERT trained beside a frozen teacher BERT.

One module holds both, so the one trainer's step sees them as one model: params {'student': {bert, mlm_head},
'teacher': {bert, mlm_head}}. The teacher runs deterministically (no dropout) and its outputs pass through
`stop_gradient`, so no gradient flows into it; the family registration (models/families.py, `frozen`) also
keeps it out of the optimizer (no update, no weight decay, no Adam moments). Both are BERT-shaped
`BertForPreTraining`s without the NSP head. DistilBERT's student has no token-type embeddings and no pooler
(`student()`), so it exports as transformers' DistilBertForMaskedLM (models/convert/hf_distilbert.py), and its
`bert` subtree fine-tunes as a BERT does, with a fresh pooler, as DistilBERT's classifiers add theirs; TinyBERT's
and MiniLM's keep both (`distilbert_student=False`), as their released students, and the pooler stays frozen.

The student shares the teacher's vocabulary. DistilBERT's has the teacher's width and `num_layers` <=
ceil(teacher_layers / 2): it starts from every other teacher layer (student layer i <- teacher layer 2i);
pretrain/distillation/teacher.py copies them at the start of a run. TinyBERT's and MiniLM's students are narrower
(`teacher_hidden_size`, `teacher_num_heads`, `teacher_intermediate_size`: the teacher's widths where they differ;
config.model's BERT fields are always the student's, so its `student/bert` fine-tunes as the BERT they describe)
and start at random. The objective (objectives/distillation/objective.py) scores the outputs.

Their losses read the models' insides, which __call__ returns only when the objective asks (`internals`, a
static argument: nothing else changes, and a run that asks for nothing runs the normal path):
- "attention": per student layer m, its attention scores (scaled q.k, before the mask) [M, B, H, L, L] and
  values [M, B, L, H, K], and the teacher's at its layer g(m) (`mapped_layers`). Both need every layer's
  attention through the einsum reference (models/attention.py), fused kernels or not.
- "hidden_states": the student's layer outputs through TinyBERT's W_h [M, B, L, D_teacher], and the teacher's at g(m).
- "embeddings": the student's embedding output through TinyBERT's W_e [B, L, D_teacher], and the teacher's.
W_h (`hidden_fit`) and W_e (`embedding_fit`) are parameters of this module beside `student` and `teacher`: they
train with the student and stay behind when its `student/bert` fine-tunes.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import heads, layers
from models.bert import BertConfig, BertForPreTraining
from models.errors import ModelInputError


INTERNALS = ("attention", "hidden_states", "embeddings")  # what DistillationModel returns when asked (see above)


@dataclasses.dataclass(frozen=True)
class DistilConfig(BertConfig):
    """The student's BertConfig (num_layers and widths are the student's) + the teacher's depth and widths; every
    other field is shared."""
    teacher_layers: int = 12
    teacher_hidden_size: int = 0         # 0: the student's; TinyBERT and MiniLM distil a wider teacher
    teacher_num_heads: int = 0           # 0: the student's
    teacher_intermediate_size: int = 0   # 0: the student's
    next_sentence: bool = False          # DistilBERT has no NSP; neither model builds the head
    distilbert_student: bool = True      # the student drops token types and the pooler (DistilBERT); False keeps
                                         # them (TinyBERT's and MiniLM's students are BertModels)

    def __post_init__(self):
        super().__post_init__()
        if self.next_sentence or self.span_boundary or self.shared_layers:
            raise ModelInputError("model 'distil' distils BERT's masked LM: set config.model.next_sentence, "
                                  "span_boundary and shared_layers to False")
        teacher = self.teacher()
        if teacher.hidden_size % teacher.num_heads:
            raise ModelInputError(f"config.model.teacher_num_heads={teacher.num_heads} does not divide the teacher's "
                                  f"width {teacher.hidden_size}: set the teacher's heads and widths as its checkpoint "
                                  "has them")
        if not self.copies_teacher:
            if self.num_layers > self.teacher_layers:
                raise ModelInputError(f"config.model.num_layers={self.num_layers} is more than the teacher's "
                                      f"{self.teacher_layers} layers: each student layer learns from its own teacher "
                                      f"layer (TinyBERT's mapping); set num_layers <= {self.teacher_layers}")
        elif self.num_layers > (self.teacher_layers + 1) // 2:
            raise ModelInputError(
                f"config.model.num_layers={self.num_layers} is more than half the teacher's {self.teacher_layers} "
                f"layers: a student starts from every other teacher layer (0, 2, 4, ...); set num_layers <= "
                f"{(self.teacher_layers + 1) // 2}")

    def bert(self) -> BertConfig:
        """config.model's BERT fields: the student's widths, and the embeddings and heads both models start from."""
        return BertConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(BertConfig)})

    @property
    def copies_teacher(self) -> bool:
        """Whether the student has its teacher's widths, and so starts from its layers (DistilBERT); a narrower one
        (TinyBERT, MiniLM) starts at random."""
        teacher = self.teacher()
        return ((self.hidden_size, self.num_heads, self.intermediate_size)
                == (teacher.hidden_size, teacher.num_heads, teacher.intermediate_size))

    def student(self) -> BertConfig:
        """DistilBERT (Sanh et al. 2019, Section 3): "the token-type embeddings and the pooler are removed"."""
        if not self.distilbert_student:
            return self.bert()
        return dataclasses.replace(self.bert(), type_vocab_size=0, pooler=False)

    def teacher(self) -> BertConfig:
        """The teacher at its own depth and widths (it runs deterministic: its dropout never applies)."""
        return dataclasses.replace(self.bert(), num_layers=self.teacher_layers,
                                   hidden_size=self.teacher_hidden_size or self.hidden_size,
                                   num_heads=self.teacher_num_heads or self.num_heads,
                                   intermediate_size=self.teacher_intermediate_size or self.intermediate_size)


def teacher_layer(i: int) -> int:
    """The teacher layer student layer i starts from."""
    return 2 * i


def mapped_layers(student_layers: int, teacher_layers: int) -> tuple[int, ...]:
    """TinyBERT's uniform mapping g(m) = m * N / M (Jiao et al. 2020, Section 3.1; layers counted from 1, 0 being
    the embeddings): the teacher layer each student layer m = 1..M learns from, rounded down where M does not divide
    N (the released code's m * (N // M) where it does, as in all of the paper's settings). g(M) = N: the last
    layers pair up, which is MiniLM's pair."""
    return tuple(m * teacher_layers // student_layers for m in range(1, student_layers + 1))


class DistillationModel(nn.Module):
    """-> {'mlm_logits' [B, P, V], 'hidden' [B, L, D]} of the student and the same with a 'teacher_' prefix
    (under stop_gradient), and what `internals` asks for (module docstring)."""
    config: DistilConfig

    def setup(self):
        c = self.config
        self.student = BertForPreTraining(c.student())
        self.teacher = BertForPreTraining(c.teacher())
        # TinyBERT's W_h and W_e (student width -> teacher width), created only where a loss calls them
        fit = dict(kernel_init=layers.truncated_normal(c.initializer_range), **c.kwargs)
        self.hidden_fit = layers.Dense(c.teacher().hidden_size, ("embed", "embed_out"), **fit)
        self.embedding_fit = layers.Dense(c.teacher().hidden_size, ("embed", "embed_out"), **fit)

    @staticmethod
    def _forward(model: BertForPreTraining, input_ids, segment_ids, input_mask, masked_lm_positions, deterministic,
                 internals: bool = False):
        """BertForPreTraining's MLM path, keeping the last hidden states (its __call__ returns only the heads') and,
        if asked, BertModel's internals (else None)."""
        out = model.bert(input_ids, segment_ids, input_mask, deterministic, return_internals=internals)  # + pooler
        masked = heads.gather_positions(out[0], masked_lm_positions)
        return model.mlm_head(masked, model.bert.embeddings.word_embeddings), out[0], out[2] if internals else None

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,  # [B, L] each
                 masked_lm_positions: jax.Array, deterministic: bool = True,  # [B, P]
                 internals: tuple[str, ...] = ()) -> dict[str, jax.Array]:
        if set(internals) - set(INTERNALS):
            raise ValueError(f"internals {sorted(set(internals) - set(INTERNALS))} are not among {INTERNALS}")
        inputs = (input_ids, segment_ids, input_mask, masked_lm_positions)
        logits, hidden, student = self._forward(self.student, *inputs, deterministic, bool(internals))
        teacher_logits, teacher_hidden, teacher = jax.lax.stop_gradient(
            self._forward(self.teacher, *inputs, True, bool(internals)))
        out = {"mlm_logits": logits, "hidden": hidden, "teacher_mlm_logits": teacher_logits,
               "teacher_hidden": teacher_hidden}
        return {**out, **self._paired(internals, student, teacher)} if internals else out

    def _paired(self, internals: tuple[str, ...], student: dict, teacher: dict) -> dict[str, jax.Array]:
        """The requested internals of the student beside the teacher's at the mapped layers."""
        c = self.config
        mapped = [g - 1 for g in mapped_layers(c.num_layers, c.teacher_layers)]  # static slices: XLA drops the rest

        def at_mapped(x: jax.Array) -> jax.Array:  # [N, ...] -> [M, ...]
            return jnp.stack([x[g] for g in mapped])

        out = {}
        if "attention" in internals:
            if c.teacher().num_heads != c.num_heads:
                raise ModelInputError(f"attention distillation compares the student's {c.num_heads} heads one by one "
                                      f"with the teacher's {c.teacher().num_heads}: set config.model.num_heads="
                                      f"{c.teacher().num_heads}, or the attention alphas of config.objective to 0")
            for key in ("scores", "values"):
                out[f"attention_{key}"], out[f"teacher_attention_{key}"] = student[key], at_mapped(teacher[key])
        if "hidden_states" in internals:
            out["hidden_states"] = self.hidden_fit(student["hidden"])  # [M, B, L, D_teacher]
            out["teacher_hidden_states"] = at_mapped(teacher["hidden"])
        if "embeddings" in internals:
            out["embeddings"] = self.embedding_fit(student["embeddings"])  # [B, L, D_teacher]
            out["teacher_embeddings"] = teacher["embeddings"]
        return out
