"""The model families and the Hugging Face checkpoints they load: one registration each, the only lists of them.

Everything that differs per family reads its `ModelFamily` from FAMILIES (a models/registry.py `Registry`):
`models.model_config` / `build_model` (the module, its config dataclass and pretraining module),
pretrain/training/pretrained.py (what fine-tuning inherits from a checkpoint), pretrain/training/validation.py (the
relations between config.model's keys) and pretrain/training/freezing.py (the pretrained body inside a fine-tuning
model). HF_CHECKPOINTS holds the Hugging Face directories the families load, by config.json's model_type. Adding a
family is one `register(ModelFamily(...))` below (and one `register_checkpoint` per kind of directory it loads).

This table names code of models/ only, by "module:attribute" strings imported on first use (the table costs no
JAX import). What the layers above add per family registers in their own rooms, against the family's name: its
finetuners in pretrain/finetuners/ (FINETUNERS), a distillation family's teacher in pretrain/distillation/
(TEACHERS), its exporter in pretrain/tools/export_hf_bert.py (EXPORTERS). tests/models/test_registry.py resolves
every name, so a typo fails there.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping

from models.errors import ModelInputError
from models.registry import Registry, resolve


@dataclasses.dataclass(frozen=True)
class HfCheckpoint:
    """A kind of Hugging Face checkpoint directory a family loads, known by config.json's model_type."""
    model_type: str                      # config.json's "model_type", e.g. 'gpt2'
    title: str                           # how messages name it: 'GPT-2'
    family: str                          # the family (config.model.name) that loads it
    loader: str                          # 'module:function': directory -> (config dataclass, params as numpy)
    tokenizer: Callable[[str], dict]     # directory -> the tokenizer spec (kind, path, lowercase(, extra_ids))


@dataclasses.dataclass(frozen=True)
class Body:
    """The pretrained body inside a fine-tuning model's parameters, as freezing strategies see it."""
    key: str                             # its top-level subtree; every other top-level subtree is a task head
    embeddings: tuple[str, ...]          # blocks below layer_0: freeze_embeddings freezes them, gradual thaws them last
    top: tuple[str, ...] = ()            # blocks above the top layer: they train with the head under gradual
    layers: str = "num_layers"           # the config.model key counting its layers (config validation's depth)


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    name: str                            # config.model.name
    module: str                          # the module that defines the two classes below
    config_class: str                    # its frozen config dataclass
    model_class: str                     # its pretraining module
    # What fine-tuning inherits from a pretrained checkpoint (pretrain/training/pretrained.py):
    params_subtree: str | None = None    # the params' subtree it starts from, "a/b" nested (None: the whole tree)
    architecture_keys: tuple[str, ...] | None = None  # config.model keys (None: all but the training-time ones)
    # Relations within config.model that pretrain/training/validation.py checks:
    width_key: str | None = None         # a width that num_heads must divide
    positions_key: str | None = None     # the position table the data's longest sequence must fit
    choices: Mapping[str, str] = dataclasses.field(default_factory=dict)  # key -> 'module:NAMES' it must be in
    body: Body | None = None             # for freezing (None: no pretrained body the strategies act on)
    task_model: str | None = None        # 'module:Class': the encoder with a task head (the encoder finetuners')
    finetunes_as: str | None = None      # the family its checkpoints fine-tune as (ELECTRA: its discriminator, a BERT)
    finetuned_config: str | None = None  # the config method giving what fine-tunes, where it differs (distil: student)
    causal: bool = False                 # a decoder-only causal LM: what generation, perplexity and few-shot read
    encoder_decoder: bool = False        # an encoder-decoder LM (T5): what lm-eval's model type scores as seq2seq
    frozen: tuple[str, ...] = ()         # params subtrees ("a/b" paths) pretraining never updates (a distillation teacher)
    # params subtrees ("a/b" paths) a checkpoint may lack: pretraining from it (config.init) starts them fresh; any
    # other weight it lacks is an error (pretrain/loops/pretraining.py)
    optional_params: tuple[str, ...] = ()

    def config_cls(self) -> type:
        return resolve(f"{self.module}:{self.config_class}")

    def model_cls(self) -> type:
        return resolve(f"{self.module}:{self.model_class}")


FAMILIES: Registry[ModelFamily] = Registry("model family", key="config.model.name", error=ModelInputError)
HF_CHECKPOINTS: Registry[HfCheckpoint] = Registry("Hugging Face checkpoint", key="model_type", error=ModelInputError)


def register(family: ModelFamily) -> ModelFamily:
    return FAMILIES.register(family.name, family)


def register_checkpoint(checkpoint: HfCheckpoint) -> HfCheckpoint:
    return HF_CHECKPOINTS.register(checkpoint.model_type, checkpoint)


def family(name: str) -> ModelFamily:
    """config.model.name -> its family, or ModelInputError naming the known ones."""
    return FAMILIES.get(name)


def hf_checkpoint(model_type: str) -> tuple[ModelFamily, HfCheckpoint] | None:
    """config.json's model_type -> (the family that loads it, how), or None."""
    if model_type not in HF_CHECKPOINTS:
        return None
    checkpoint = HF_CHECKPOINTS.get(model_type)
    return family(checkpoint.family), checkpoint


def body(key: str) -> Body | None:
    """A fine-tuning model's top-level subtree -> the family body it is, or None (a task head)."""
    bodies = [f.body for _, f in FAMILIES.find(lambda f: f.body is not None and f.body.key == key)]
    return bodies[0] if bodies else None


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


# ----- The families -----
BERT_ARCHITECTURE = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "layer_norm_eps",
                     "embedding_size", "shared_layers", "hidden_act", "pre_norm")

register(ModelFamily(
    "bert", "models.bert", "BertConfig", "BertForPreTraining",
    params_subtree="bert",  # the encoder (embeddings, layer_i, pooler) without the pretraining heads
    # Hugging Face's BertForMaskedLM directories (most BERTs on the Hub, RoBERTa-style runs) hold neither the pooler
    # nor the NSP head: both serve NSP alone, and a fresh two-way classifier learns it from the continued pretraining
    optional_params=("bert/pooler", "nsp_head"),
    architecture_keys=BERT_ARCHITECTURE,
    width_key="hidden_size", positions_key="max_position_embeddings",
    # embeddings_project: the E -> H projection of factorised embeddings (ALBERT, ELECTRA), part of the embeddings
    # final_norm: a pre_norm BERT's LayerNorm above the top layer
    body=Body("bert", embeddings=("embeddings", "embeddings_project"), top=("pooler", "final_norm")),
    task_model="models.bert_tasks:BertForFineTuning"))
register_checkpoint(HfCheckpoint("bert", "BERT", "bert", "models.convert.hf_io:load_hf_bert", _wordpiece))
register_checkpoint(HfCheckpoint("albert", "ALBERT", "bert", "models.convert.hf_io:load_hf_albert",
                                 _albert_sentencepiece))
register_checkpoint(HfCheckpoint("electra", "ELECTRA", "bert", "models.convert.hf_electra:load_hf_electra", _wordpiece))
register_checkpoint(HfCheckpoint("distilbert", "DistilBERT", "bert", "models.convert.hf_distilbert:load_hf_distilbert",
                                 _wordpiece))

register(ModelFamily(
    "t5", "models.t5", "T5Config", "T5",
    choices={"feed_forward": "models.t5:FEED_FORWARDS"}, encoder_decoder=True))
register_checkpoint(HfCheckpoint("t5", "T5", "t5", "models.convert.hf_t5:load_hf_t5", _t5_sentencepiece))

register(ModelFamily(
    "gpt", "models.gpt", "GPTConfig", "GPT",
    width_key="d_model", positions_key="n_positions",
    body=Body("gpt", embeddings=("token_embedding", "position_embedding"), top=("final_norm",)),
    causal=True))
register_checkpoint(HfCheckpoint("gpt2", "GPT-2", "gpt", "models.convert.hf_gpt2:load_hf_gpt2", _gpt2_bpe))

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
    frozen=("teacher", "student/bert/pooler")))  # a BERT-shaped student's pooler: no loss reaches it

register(ModelFamily(  # ModernBERT (models/modernbert.py): pre-norm, RoPE, GeGLU, alternating local/global attention
    "modernbert", "models.modernbert", "ModernBertConfig", "ModernBertForMaskedLM",
    # the whole tree: the MLM's prediction head is the fine-tuning heads' too, as in Hugging Face's classes
    width_key="hidden_size", positions_key="max_position_embeddings",
    body=Body("modernbert", embeddings=("embeddings",), top=("final_norm",)),
    task_model="models.modernbert_tasks:ModernBertForFineTuning"))
register_checkpoint(HfCheckpoint("modernbert", "ModernBERT", "modernbert",
                                 "models.convert.hf_modernbert:load_hf_modernbert", _tokenizer_json))
