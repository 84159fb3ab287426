"""Hugging Face ELECTRA <-> ours: ElectraForPreTraining (the discriminator), ElectraForMaskedLM (the
generator) and ElectraModel (either body).

An ELECTRA body is named as a BERT body (embeddings.*, embeddings_project, encoder.layer.i.*) under the
prefix 'electra.', so the tables of models/convert/hf_bert.py serve it: `encoder_layout` with the
embeddings E wide. Our models/electra.py keeps the shared embeddings in the discriminator; the generator's
checkpoint carries a copy of them, which export writes and import checks equal.

Directories: `load_hf_electra` reads either checkpoint's body as a BERT (the bert family fine-tunes it);
`load_hf_electra_pair` reads a discriminator and a generator into our pretraining model (to continue
pretraining); `save_hf_electra` writes both, as the paper's released models come.
"""
from __future__ import annotations

import dataclasses
import os

import flax.core.meta
import numpy as np

from models.bert import BertConfig
from models.convert import hf_io
from models.convert.hf_bert import Entry, linear_entries, norm_entries, bert_config_to_hf, encoder_layout, hf_config_to_bert
from models.convert.layouts import place_tensor, take_tensor
from models.electra import ElectraConfig
from models.errors import ModelInputError
from models.qkv_layout import hf_layout, to_qkv_layout

PREFIX = "electra."
DISCRIMINATOR, GENERATOR = "discriminator", "generator"  # the two directories save_hf_electra writes


def discriminator_layout(config: ElectraConfig) -> list[Entry]:
    """ElectraForPreTraining: the body ('electra.'-prefixed) and discriminator_predictions."""
    d, head = config.hidden_size, ("discriminator_head",)
    body = [(PREFIX + name, *rest) for name, *rest in encoder_layout(config.discriminator(), root=("discriminator",))]
    return (body + linear_entries("discriminator_predictions.dense", (*head, "dense"), d, d)
            + linear_entries("discriminator_predictions.dense_prediction", (*head, "dense_prediction"), d, 1))


def generator_layout(config: ElectraConfig) -> list[Entry]:
    """ElectraForMaskedLM: the body (its embeddings are the discriminator's), generator_predictions, the bias
    of generator_lm_head (its weight is the word embeddings, tied)."""
    e, head = config.embedding_width, ("generator_head",)
    body = [(PREFIX + name, *rest) for name, *rest in
            encoder_layout(config.generator(), root=("generator",), embeddings_root=("discriminator",))]
    return (body + linear_entries("generator_predictions.dense", (*head, "transform"), config.generator_hidden_size, e)
            + norm_entries("generator_predictions.LayerNorm", (*head, "transform_norm"), e)
            + [("generator_lm_head.bias", (*head, "bias"), "copy", (config.vocab_size,))])


# ----- config.json -----
def hf_config_to_body(hf_config: dict, source: str) -> BertConfig:
    """An ELECTRA config.json -> the BertConfig of its body (factorised embeddings, no pooler)."""
    bert_fields = {**hf_config, "model_type": "bert"}
    config = hf_config_to_bert(bert_fields, source=source)
    embedding_size = int(hf_config.get("embedding_size", 128))  # transformers' ElectraConfig default
    return dataclasses.replace(config, embedding_size=0 if embedding_size == config.hidden_size else embedding_size,
                               pooler=False)


def body_config_to_hf(config: BertConfig, architecture: str) -> dict:
    hf = bert_config_to_hf(config, architecture)
    return {**hf, "model_type": "electra", "embedding_size": config.embedding_width}


# ----- reading -----
def _read(directory: str) -> tuple[dict, dict[str, np.ndarray], str, str]:
    hf_config, config_path = hf_io.read_hf_config(os.path.expanduser(directory), "electra", "ELECTRA")
    state_dict, weights_path = hf_io.read_weights(os.path.expanduser(directory))
    return hf_config, state_dict, config_path, weights_path


def _prefixed(state_dict: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """ElectraModel names (no prefix) -> the 'electra.'-prefixed names of the pretraining models."""
    if any(k.startswith(PREFIX) for k in state_dict):
        return state_dict
    return {PREFIX + k: v for k, v in state_dict.items()}


def _place(params: dict, state_dict: dict, entries: list[Entry], config, source: str) -> None:
    for name, path, layout, shape in entries:
        place_tensor(params, state_dict, name, path, layout, shape, config, source=source,
                     missing_hint="is it an ELECTRA checkpoint of this size? check config.json")


def load_hf_electra(directory: str) -> tuple[BertConfig, dict]:
    """Any ELECTRA directory -> (its body's BertConfig, {'bert': body params}): what BERT fine-tuning reads."""
    hf_config, state_dict, config_path, weights_path = _read(directory)
    config = hf_config_to_body(hf_config, config_path)
    state_dict = {k.removeprefix(PREFIX): v for k, v in state_dict.items()}
    params: dict = {}
    _place(params, state_dict, encoder_layout(config), config, weights_path)
    return config, to_qkv_layout(params, config.fused_qkv)


def electra_config_from_hf(discriminator: dict, generator: dict, source: str) -> ElectraConfig:
    body, gen = hf_config_to_body(discriminator, source), hf_config_to_body(generator, source)
    if gen.embedding_width != body.embedding_width or gen.vocab_size != body.vocab_size:
        raise ModelInputError(f"{source}: the generator's embeddings ({gen.vocab_size} x {gen.embedding_width}) are "
                              f"not the discriminator's ({body.vocab_size} x {body.embedding_width}); ELECTRA shares them")
    fields = {f.name: getattr(body, f.name) for f in dataclasses.fields(BertConfig)}
    return ElectraConfig(**{**fields, "embedding_size": body.embedding_width}, generator_hidden_size=gen.hidden_size,
                         generator_num_heads=gen.num_heads, generator_intermediate_size=gen.intermediate_size,
                         generator_num_layers=gen.num_layers)


def electra_params_from_hf(discriminator: dict[str, np.ndarray], generator: dict[str, np.ndarray],
                           config: ElectraConfig, *, source: str = "the checkpoint") -> dict:
    """ElectraForPreTraining's and ElectraForMaskedLM's state dicts -> the params of models.electra.Electra."""
    discriminator, generator = _prefixed(discriminator), _prefixed(generator)
    params: dict = {}
    _place(params, discriminator, discriminator_layout(config), config.discriminator(), source)
    own = [entry for entry in generator_layout(config) if entry[1][0] != DISCRIMINATOR]  # all but the shared tables
    _place(params, generator, own, config.generator(), source)
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        key = f"{PREFIX}embeddings.{name}.weight"
        if key in generator and not np.array_equal(generator[key], discriminator[key]):
            raise ModelInputError(f"{source}: the generator's {key} differs from the discriminator's; ELECTRA's "
                                  "are shared (give a generator and discriminator trained together)")
    return to_qkv_layout(params, config.fused_qkv)


def load_hf_electra_pair(discriminator_dir: str, generator_dir: str) -> tuple[ElectraConfig, dict]:
    """A discriminator and a generator directory -> (ElectraConfig, params of models.electra.Electra)."""
    disc_config, disc_sd, config_path, weights_path = _read(discriminator_dir)
    gen_config, gen_sd, _, _ = _read(generator_dir)
    config = electra_config_from_hf(disc_config, gen_config, config_path)
    return config, electra_params_from_hf(disc_sd, gen_sd, config, source=weights_path)


# ----- writing -----
def hf_state_dicts_from_electra(params: dict, config: ElectraConfig) -> tuple[dict, dict]:
    """Our Electra params -> (ElectraForPreTraining's state dict, ElectraForMaskedLM's), float32; the
    generator gets a copy of the shared embeddings and its tied decoder."""
    params = hf_layout(flax.core.meta.unbox(params))

    def state_dict(entries: list[Entry], body: BertConfig) -> dict[str, np.ndarray]:
        return {name: take_tensor(params, path, layout, body) for name, path, layout, _ in entries}

    discriminator = state_dict(discriminator_layout(config), config.discriminator())
    generator = state_dict(generator_layout(config), config.generator())
    generator["generator_lm_head.weight"] = generator[f"{PREFIX}embeddings.word_embeddings.weight"].copy()
    return discriminator, generator


def save_hf_electra(directory: str, params: dict, config: ElectraConfig, *, vocab_file: str | None = None,
                    lowercase: bool = True) -> None:
    """DIRECTORY/discriminator (ElectraForPreTraining) and DIRECTORY/generator (ElectraForMaskedLM), each a
    directory transformers' from_pretrained loads, with the vocabulary when one is given."""
    discriminator, generator = hf_state_dicts_from_electra(params, config)
    for name, state_dict, body, architecture in (
            (DISCRIMINATOR, discriminator, config.discriminator(), "ElectraForPreTraining"),
            (GENERATOR, generator, config.generator(), "ElectraForMaskedLM")):
        target = hf_io.check_export_target(os.path.join(directory, name))
        hf_io.write_export(target, body_config_to_hf(body, architecture), state_dict,
                           hf_io.bert_tokenizer_files(vocab_file, lowercase, body))
