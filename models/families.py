"""The model families: one registration each, and the only list of them.

Everything that differs per family reads its `ModelFamily` here: `models.model_config` / `build_model`
(the module, its config dataclass and pretraining module), pretrain/training/pretrained.py (the Hugging Face
loaders and what fine-tuning inherits from a checkpoint), pretrain/training/validation.py (the relations
between config.model's keys), pretrain/training/freezing.py (the pretrained body inside a fine-tuning
model) and pretrain/finetuners/registry.py (the fine-tuning family per task kind). Adding a family is one
`register(ModelFamily(...))` below.

Code is named by "module:attribute" strings, imported on first use: the table costs no import of JAX
modules, and it can name the finetuners of pretrain/finetuners without models/ importing
pretrain/ (tests/models/test_registry.py resolves every name, so a typo fails there).
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from models.errors import ModelInputError
from models.registry import resolve  # noqa: F401 (ModelFamily's names are resolved with it)


@dataclasses.dataclass(frozen=True)
class HfCheckpoint:
    """A kind of Hugging Face checkpoint directory the family loads, known by config.json's model_type."""
    model_type: str                      # config.json's "model_type", e.g. 'gpt2'
    title: str                           # how messages name it: 'GPT-2'
    loader: str                          # 'module:function': directory -> (config dataclass, params as numpy)
    tokenizer: Callable[[str], dict]     # directory -> the tokenizer spec (kind, path, lowercase(, extra_ids))


@dataclasses.dataclass(frozen=True)
class Body:
    """The pretrained body inside a fine-tuning model's parameters, as freezing strategies see it."""
    key: str                             # its top-level subtree; every other top-level subtree is a task head
    embeddings: tuple[str, ...]          # blocks below layer_0: freeze_embeddings freezes them, gradual thaws them last
    top: tuple[str, ...] = ()            # blocks above the top layer: they train with the head under gradual


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    name: str                            # config.model.name
    module: str                          # the module that defines the two classes below
    config_class: str                    # its frozen config dataclass
    model_class: str                     # its pretraining module
    hf: tuple[HfCheckpoint, ...] = ()    # the Hugging Face checkpoints it loads
    # What fine-tuning inherits from a pretrained checkpoint (pretrain/training/pretrained.py):
    params_subtree: str | None = None    # the params' subtree it starts from, "a/b" nested (None: the whole tree)
    architecture_keys: tuple[str, ...] | None = None  # config.model keys (None: all but the training-time ones)
    # Relations within config.model that pretrain/training/validation.py checks:
    width_key: str | None = None         # a width that num_heads must divide
    positions_key: str | None = None     # the position table the data's longest sequence must fit
    choices: Mapping[str, str] = dataclasses.field(default_factory=dict)  # key -> 'module:NAMES' it must be in
    body: Body | None = None             # for freezing (None: no pretrained body the strategies act on)
    finetuners: Mapping[str, str] = dataclasses.field(default_factory=dict)  # head kind -> 'module:Finetuner'
    task_model: str | None = None        # 'module:Class': the encoder with a task head the encoder finetuners build
    finetunes_as: str | None = None      # the family its checkpoints fine-tune as (ELECTRA: its discriminator, a BERT)
    finetuned_config: str | None = None  # the config method giving what fine-tunes, where it differs (distil: student)
    frozen: tuple[str, ...] = ()         # params subtrees ("a/b" paths) pretraining never updates (a distillation teacher)
    teacher: str | None = None           # 'module:function' (config) -> the teacher pretraining starts from, if any
    # params subtrees ("a/b" paths) a checkpoint may lack: pretraining from it (config.init) starts them fresh; any
    # other weight it lacks is an error (pretrain/loops/pretraining.py)
    optional_params: tuple[str, ...] = ()

    def config_cls(self) -> type:
        return resolve(f"{self.module}:{self.config_class}")

    def model_cls(self) -> type:
        return resolve(f"{self.module}:{self.model_class}")


FAMILIES: dict[str, ModelFamily] = {}  # config.model.name -> its family, in registration order


def register(family: ModelFamily) -> ModelFamily:
    if family.name in FAMILIES:
        raise ValueError(f"model family {family.name!r} is registered twice")
    FAMILIES[family.name] = family
    return family


def family(name: str) -> ModelFamily:
    """config.model.name -> its family, or ModelInputError naming the known ones."""
    if name not in FAMILIES:
        raise ModelInputError(f"config.model.name={name!r} is unknown; available: {', '.join(map(repr, FAMILIES))}")
    return FAMILIES[name]


def hf_checkpoint(model_type: str) -> tuple[ModelFamily, HfCheckpoint] | None:
    """config.json's model_type -> (the family that loads it, how), or None."""
    for f in FAMILIES.values():
        for checkpoint in f.hf:
            if checkpoint.model_type == model_type:
                return f, checkpoint
    return None


def body(key: str) -> Body | None:
    """A fine-tuning model's top-level subtree -> the family body it is, or None (a task head)."""
    for f in FAMILIES.values():
        if f.body is not None and f.body.key == key:
            return f.body
    return None


# ----- Tokenizers of Hugging Face directories -----
def _wordpiece(directory: str) -> dict:
    """vocab.txt, lowercased unless tokenizer_config.json says do_lower_case=false."""
    lowercase = True
    tokenizer_config = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(tokenizer_config):
        with open(tokenizer_config) as f:
            lowercase = bool(json.load(f).get("do_lower_case", True))
    return dict(kind="wordpiece", path=directory, lowercase=lowercase)


def _albert_sentencepiece(directory: str) -> dict:
    """ALBERT's SentencePiece model (spiece.model, with [CLS] [SEP] [MASK] pieces), lowercased as _wordpiece."""
    return dict(_wordpiece(directory), kind="sentencepiece", path=os.path.join(directory, "spiece.model"))


def _t5_sentencepiece(directory: str) -> dict:
    """T5's SentencePiece model (spiece.model) plus the 100 sentinels <extra_id_*>, cased."""
    return dict(kind="sentencepiece", path=os.path.join(directory, "spiece.model"), lowercase=False, extra_ids=100)


def _gpt2_bpe(directory: str) -> dict:
    """GPT-2's byte-level BPE: vocab.json + merges.txt in the same directory, cased."""
    return dict(kind="gpt2_bpe", path=directory, lowercase=False)


def _tokenizer_json(directory: str) -> dict:
    """A tokenizers `tokenizer.json` (ModernBERT ships no vocab.txt), cased as the file's normalizer says."""
    return dict(kind="hf_json", path=os.path.join(directory, "tokenizer.json"), lowercase=False)


def _sequence(family: str) -> dict[str, str]:
    """A head on the whole sequence: GLUE's classification tasks and its regression task (STS-B)."""
    return {"classification": family, "regression": family}


# ----- The families -----
# An encoder fine-tunes on every head kind through the same finetuners, over the family's `task_model`.
ENCODER_FINETUNERS = {**_sequence("pretrain.finetuners.bert:BertFinetuner"),
                      "tagging": "pretrain.finetuners.bert_tagging:BertTaggingFinetuner",
                      "span": "pretrain.finetuners.bert_spans:BertSpanFinetuner",
                      "qa": "pretrain.finetuners.bert_qa:BertQaFinetuner"}
BERT_ARCHITECTURE = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "layer_norm_eps",
                     "embedding_size", "shared_layers", "hidden_act", "pre_norm")

register(ModelFamily(
    "bert", "models.bert", "BertConfig", "BertForPreTraining",
    hf=(HfCheckpoint("bert", "BERT", "models.convert.hf_io:load_hf_bert", _wordpiece),
        HfCheckpoint("albert", "ALBERT", "models.convert.hf_io:load_hf_albert", _albert_sentencepiece),
        HfCheckpoint("electra", "ELECTRA", "models.convert.hf_electra:load_hf_electra", _wordpiece),
        HfCheckpoint("distilbert", "DistilBERT", "models.convert.hf_distilbert:load_hf_distilbert", _wordpiece)),
    params_subtree="bert",  # the encoder (embeddings, layer_i, pooler) without the pretraining heads
    # Hugging Face's BertForMaskedLM directories (most BERTs on the Hub, RoBERTa-style runs) hold neither the pooler
    # nor the NSP head: both serve NSP alone, and a fresh two-way classifier learns it from the continued pretraining
    optional_params=("bert/pooler", "nsp_head"),
    architecture_keys=BERT_ARCHITECTURE,
    width_key="hidden_size", positions_key="max_position_embeddings",
    # embeddings_project: the E -> H projection of factorised embeddings (ALBERT, ELECTRA), part of the embeddings
    # final_norm: a pre_norm BERT's LayerNorm above the top layer
    body=Body("bert", embeddings=("embeddings", "embeddings_project"), top=("pooler", "final_norm")),
    finetuners=ENCODER_FINETUNERS, task_model="models.bert_tasks:BertForFineTuning"))

register(ModelFamily(
    "t5", "models.t5", "T5Config", "T5",
    hf=(HfCheckpoint("t5", "T5", "models.convert.hf_t5:load_hf_t5", _t5_sentencepiece),),
    choices={"feed_forward": "models.t5:FEED_FORWARDS"},
    finetuners={**_sequence("pretrain.finetuners.t5:T5Finetuner"), "qa": "pretrain.finetuners.t5_qa:T5QaFinetuner"}))

register(ModelFamily(
    "gpt", "models.gpt", "GPTConfig", "GPT",
    hf=(HfCheckpoint("gpt2", "GPT-2", "models.convert.hf_gpt2:load_hf_gpt2", _gpt2_bpe),),
    width_key="d_model", positions_key="n_positions",
    body=Body("gpt", embeddings=("token_embedding", "position_embedding"), top=("final_norm",)),
    finetuners=_sequence("pretrain.finetuners.gpt:GPTFinetuner")))

register(ModelFamily(
    "electra", "models.electra", "ElectraConfig", "Electra",
    # A run's discriminator fine-tunes as a BERT (a fresh pooler); Hugging Face ELECTRA directories load as
    # BERTs directly (the bert family's checkpoints above).
    params_subtree="discriminator", architecture_keys=BERT_ARCHITECTURE, finetunes_as="bert",
    width_key="hidden_size", positions_key="max_position_embeddings"))

register(ModelFamily(  # DistilBERT (models/distillation/model.py): a student BERT beside its frozen teacher
    "distil", "models.distillation.model", "DistilConfig", "DistillationModel",
    params_subtree="student/bert", architecture_keys=BERT_ARCHITECTURE,
    width_key="hidden_size", positions_key="max_position_embeddings",
    finetunes_as="bert", finetuned_config="student",
    frozen=("teacher", "student/bert/pooler"),  # a BERT-shaped student's pooler: no loss reaches it
    teacher="pretrain.distillation.teacher:load_teacher"))

register(ModelFamily(  # ModernBERT (models/modernbert.py): pre-norm, RoPE, GeGLU, alternating local/global attention
    "modernbert", "models.modernbert", "ModernBertConfig", "ModernBertForMaskedLM",
    hf=(HfCheckpoint("modernbert", "ModernBERT", "models.convert.hf_modernbert:load_hf_modernbert", _tokenizer_json),),
    # the whole tree: the MLM's prediction head is the fine-tuning heads' too, as in Hugging Face's classes
    width_key="hidden_size", positions_key="max_position_embeddings",
    body=Body("modernbert", embeddings=("embeddings",), top=("final_norm",)),
    finetuners=ENCODER_FINETUNERS, task_model="models.modernbert_tasks:ModernBertForFineTuning"))
