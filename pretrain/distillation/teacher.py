"""The teacher of a distillation run (model 'distil', models/distillation/model.py; objective "distillation").

TEACHERS names, per model family (config.model.name), what loads the teacher pretraining starts from; the
pretraining loop looks its family up there. `load_teacher(config)`, registered for model 'distil', reads
`--config.distillation.teacher` (a pretrain.train BERT workdir or a Hugging Face BERT directory: pretrain/training/pretrained.py, with the MLM head where the checkpoint has one), checks it against
config.model (the same vocabulary, width and depth) and gives the run the teacher's tokenizer when
config.tokenizer.path is empty. `initialise(state, teacher, shardings)` puts it into a fresh state: the teacher's
weights under params['teacher'] and, DistilBERT's initialisation, the student's from the teacher's embeddings,
every other layer (student layer i <- teacher layer 2i: `student_params`), pooler and MLM head. A student narrower
than its teacher (config.model.teacher_hidden_size etc.: TinyBERT, MiniLM) keeps its random initialisation. A
resumed run restores both from its checkpoint instead; the loop (pretrain/loops/pretraining.py) calls these two only.

A teacher without an MLM head (a sentence-embedding model such as all-MiniLM-L6-v2) has no soft targets: the run
needs config.objective.alpha_ce=0, and the student's MLM head starts fresh.
"""
from __future__ import annotations

import jax
import ml_collections

import models
from models import stack
from models.bert import BertConfig
from models.distillation.model import teacher_layer
from models.registry import Registry
from pretrain.runtime.errors import ConfigError, UserError
from pretrain.training import pretrained

FLAG = "--config.distillation.teacher"
# config.model fields the student shares with its teacher (its num_layers is its own, teacher_layers the teacher's).
SHARED = ("hidden_size", "num_heads", "intermediate_size", "max_position_embeddings", "type_vocab_size",
          "embedding_size", "hidden_act", "layer_norm_eps")
WIDTHS = ("hidden_size", "num_heads", "intermediate_size")  # the teacher's own in config.model.teacher_<key> if set
# config.model.name -> (config) -> the teacher its pretraining starts from; a family not here has none.
TEACHERS: Registry = Registry("distillation teacher", key="config.model.name", error=ConfigError)


@TEACHERS.register("distil")
def load_teacher(config: ml_collections.ConfigDict) -> pretrained.Pretrained:
    """The teacher of a 'distil' run, checked against config.model and the objective: a checkpoint of the family the
    student fine-tunes as (a BERT)."""
    path = config.get("distillation", {}).get("teacher", "")
    if not path:
        raise ConfigError(f"model 'distil' needs a teacher: give {FLAG}=PATH (a pretrain.train BERT workdir or a "
                          "Hugging Face BERT directory)")
    teacher = pretrained.load_pretrained(path, FLAG, heads=True)
    student = models.family(config.model.name).finetunes_as
    if teacher.family != student:
        raise UserError(f"{FLAG}={path} is a {teacher.family} checkpoint; a distillation teacher is a {student}")
    check_teacher(config.model, teacher.model, teacher.source)
    if "mlm_head" not in teacher.params and config.objective.alpha_ce:
        raise ConfigError(f"the teacher {teacher.source} has no MLM head (a sentence-embedding model?), so no soft "
                          f"targets: set --config.objective.alpha_ce=0 to distil its hidden states (the student's MLM "
                          f"head then starts fresh), or give a teacher pretrained with masked LM")
    if not config.tokenizer.path:  # the student reads its teacher's vocabulary
        config.tokenizer.update(teacher.tokenizer)
    return teacher


def check_teacher(model: ml_collections.ConfigDict, teacher: dict, source: str) -> None:
    """config.model (the student) against the teacher's architecture fields: one line naming the field and the fix."""
    vocab = teacher["vocab_size"]
    if model.vocab_size != vocab:
        raise ConfigError(f"the teacher {source} has a vocabulary of {vocab} ids but config.model.vocab_size="
                          f"{model.vocab_size}: a student predicts its teacher's vocabulary; set "
                          f"--config.model.vocab_size={vocab} and the teacher's tokenizer (leave config.tokenizer.path "
                          "empty to take it)")
    if teacher.get("shared_layers"):
        raise ConfigError(f"the teacher {source} shares one layer across depth (ALBERT): there are no layers to "
                          "take every other one of; give a BERT teacher")
    layers = teacher["num_layers"]
    if model.teacher_layers != layers:
        copies = all(model.get(f"teacher_{key}") in (0, None, model[key]) for key in WIDTHS)  # the teacher's widths
        limit = (layers + 1) // 2 if copies else layers  # every other teacher layer, or one teacher layer each
        raise ConfigError(f"the teacher {source} has {layers} layers but config.model.teacher_layers="
                          f"{model.teacher_layers}; set --config.model.teacher_layers={layers} (and num_layers <= "
                          f"{limit})")
    for key in SHARED:
        name = f"teacher_{key}" if key in WIDTHS and model.get(f"teacher_{key}") else key
        default = getattr(BertConfig, key)  # a field the checkpoint's config lacks
        value, ours = teacher.get(key, default), model.get(name, default)
        if ours != value:
            narrower = (f" (or --config.model.teacher_{key}={value}: a narrower student, which starts at random)"
                        if name == key and key in WIDTHS else "")
            raise ConfigError(f"the teacher {source} has {key}={value!r} but config.model.{name}={ours!r}: "
                              f"config.model describes the teacher too; set --config.model.{name}={value}{narrower}")


def student_params(teacher: dict, num_layers: int) -> dict:
    """The teacher's {bert, mlm_head, ...} (looped layers) -> the student's: the same embeddings, pooler and heads,
    and layer i = the teacher's layer 2i (DistilBERT, Section 3: "taking one layer out of two")."""
    bert = {k: v for k, v in teacher["bert"].items() if not stack.LOOPED.match(k)}
    bert.update({f"layer_{i}": teacher["bert"][f"layer_{teacher_layer(i)}"] for i in range(num_layers)})
    return {**teacher, "bert": bert}


def initialise(state, teacher: pretrained.Pretrained, num_layers: int, shardings, copy_student: bool = True):
    """A fresh state with the teacher's weights and (copy_student: a student of the teacher's widths) the student's
    every-other-layer copy of them, on `shardings`."""
    looped = stack.to_layout(teacher.params, scan=False)
    weights = {"teacher": looped}
    if copy_student:
        weights["student"] = student_params(looped, num_layers)
    params, fresh = pretrained.merge_params(state.params, weights, teacher.source)
    print(f"Teacher from {teacher.source}; "
          + (f"student layers <- teacher layers {[teacher_layer(i) for i in range(num_layers)]}" if copy_student
             else "a narrower student, at random")
          + (f"; freshly initialised: {', '.join(sorted({'/'.join(n.split('/')[:2]) for n in fresh}))}" if fresh else ""))
    return state.replace(params=jax.device_put(params, shardings.params))
