"""Hugging Face DistilBERT <-> our BERT without token types and pooler.

DistilBERT (Sanh et al. 2019) is BERT's post-LayerNorm encoder with word and position embeddings only, no
pooler, and BERT's MLM head (vocab_transform, GELU, vocab_layer_norm, then vocab_projector tied to the word
embeddings): our `BertConfig(type_vocab_size=0, pooler=False, next_sentence=False)`, which is the student
models/distillation/model.py trains. Names are transformers' `DistilBertModel` / `DistilBertForMaskedLM` ones; one
table (`_layout`) lists every tensor once, so import and export cannot drift apart.

What our encoder does not compute is refused with one line naming the key: sinusoidal position embeddings and
activations other than gelu. Every LayerNorm of DistilBERT has eps 1e-12 (fixed in transformers' code).
"""
from __future__ import annotations

import os

import flax.core.meta
import numpy as np

from models.bert import BertConfig
from models.convert import hf_io
from models.convert.hf_bert import Entry, linear_entries, norm_entries
from models.convert.layouts import drop_untied_head, lookup, place_tensor, take_tensor
from models.errors import ModelInputError
from models.qkv_layout import hf_layout, to_qkv_layout

PREFIX = "distilbert."
LAYER_NORM_EPS = 1e-12
# config.json key -> BertConfig field, and transformers' DistilBertConfig defaults for keys a config.json leaves out
_CONFIG_KEYS = {"vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_layers", "n_heads": "num_heads",
                "hidden_dim": "intermediate_size", "max_position_embeddings": "max_position_embeddings",
                "dropout": "dropout_rate", "attention_dropout": "attention_dropout_rate",
                "initializer_range": "initializer_range"}
_HF_DEFAULTS = {"vocab_size": 30522, "dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072,
                "max_position_embeddings": 512, "dropout": 0.1, "attention_dropout": 0.1, "initializer_range": 0.02}
_UNSUPPORTED = (("sinusoidal_pos_embds", False), ("activation", "gelu"))  # (key, the only value we implement)
MLM_FIRST = "vocab_transform.weight"  # the MLM head's first tensor: its presence says the head is there


def _layout(config: BertConfig) -> dict[str, list[Entry]]:
    """section -> [(HF name without the 'distilbert.' prefix, our param path, layout, HF shape)]."""
    d, f = config.hidden_size, config.intermediate_size
    emb, mlm = ("bert", "embeddings"), ("mlm_head",)
    body = [(f"embeddings.{name}.weight", (*emb, name, "embedding"), "copy", (rows, d))
            for name, rows in (("word_embeddings", config.vocab_size),
                               ("position_embeddings", config.max_position_embeddings))]
    body += norm_entries("embeddings.LayerNorm", (*emb, "norm"), d)
    for i in range(config.num_layers):
        hf, ours = f"transformer.layer.{i}", ("bert", f"layer_{i}")
        for hf_name, name in (("q_lin", "query"), ("k_lin", "key"), ("v_lin", "value")):
            body += [(f"{hf}.attention.{hf_name}.weight", (*ours, "attention", name, "kernel"), "heads_in", (d, d)),
                     (f"{hf}.attention.{hf_name}.bias", (*ours, "attention", name, "bias"), "heads_bias", (d,))]
        body += [(f"{hf}.attention.out_lin.weight", (*ours, "attention", "out", "kernel"), "heads_out", (d, d)),
                 (f"{hf}.attention.out_lin.bias", (*ours, "attention", "out", "bias"), "copy", (d,))]
        body += norm_entries(f"{hf}.sa_layer_norm", (*ours, "attention_norm"), d)
        body += linear_entries(f"{hf}.ffn.lin1", (*ours, "mlp", "intermediate"), d, f)
        body += linear_entries(f"{hf}.ffn.lin2", (*ours, "mlp", "output"), f, d)
        body += norm_entries(f"{hf}.output_layer_norm", (*ours, "output_norm"), d)
    return {"bert": body,
            "mlm_head": (linear_entries("vocab_transform", (*mlm, "transform"), d, d)
                         + norm_entries("vocab_layer_norm", (*mlm, "transform_norm"), d)
                         + [("vocab_projector.bias", (*mlm, "bias"), "copy", (config.vocab_size,))])}


# ----- config.json -----
def hf_config_to_distilbert(hf_config: dict, source: str = "config.json") -> BertConfig:
    """A DistilBERT config.json dict -> our BertConfig (no token types, no pooler, no NSP); missing keys take
    transformers' DistilBertConfig defaults."""
    for key, supported in _UNSUPPORTED:
        if hf_config.get(key, supported) != supported:
            raise ModelInputError(f"{source}: {key}={hf_config[key]!r} is not supported (our DistilBERT implements "
                                  f"{key}={supported!r} only)")
    fields = {ours: type(getattr(BertConfig(), ours))(hf_config.get(hf, _HF_DEFAULTS[hf]))
              for hf, ours in _CONFIG_KEYS.items()}
    if fields["hidden_size"] % fields["num_heads"]:
        raise ModelInputError(f"{source}: dim={fields['hidden_size']} is not a multiple of n_heads={fields['num_heads']}")
    return BertConfig(**fields, type_vocab_size=0, pooler=False, next_sentence=False, layer_norm_eps=LAYER_NORM_EPS)


def distilbert_config_to_hf(config: BertConfig, architecture: str = "DistilBertForMaskedLM") -> dict:
    """Our BertConfig (checked: DistilBERT's shape) -> a config.json dict transformers loads as DistilBERT."""
    _check_exportable(config)
    return {"architectures": [architecture], "model_type": "distilbert",
            **{hf: getattr(config, ours) for hf, ours in _CONFIG_KEYS.items()},
            "activation": "gelu", "sinusoidal_pos_embds": False, "pad_token_id": 0, "tie_word_embeddings": True}


def _check_exportable(config: BertConfig) -> None:
    different = {"type_vocab_size": (config.type_vocab_size, 0), "embedding_size": (config.embedding_width,
                                                                                    config.hidden_size),
                 "shared_layers": (config.shared_layers, False), "hidden_act": (config.hidden_act, "gelu"),
                 "layer_norm_eps": (config.layer_norm_eps, LAYER_NORM_EPS)}
    for key, (value, wanted) in different.items():
        if value != wanted:
            raise ModelInputError(f"model.{key}={value!r}: a DistilBERT export needs {key}={wanted!r} (DistilBERT has "
                                  "no token types, factorised embeddings or shared layers); export it as BERT")


# ----- tensors -----
def distilbert_params_from_hf(state_dict: dict[str, np.ndarray], config: BertConfig, *,
                              source: str = "the checkpoint") -> dict:
    """DistilBertModel names, or 'distilbert.'-prefixed ones with the MLM head -> {'bert'(, 'mlm_head')} of our
    BertForPreTraining(config); an untied MLM decoder is left out (ours ties it), with a warning."""
    sd = {k.removeprefix(PREFIX): np.asarray(v) for k, v in state_dict.items()}
    params: dict = {}
    for section, entries in _layout(config).items():
        if section == "mlm_head" and MLM_FIRST not in sd:
            continue
        for name, path, layout, shape in entries:
            place_tensor(params, sd, name, path, layout, shape, config, source=source,
                         missing_hint=f"is it a DistilBERT checkpoint with {config.num_layers} layers? check config.json")
    drop_untied_head(params, sd.get("vocab_projector.weight"), sd["embeddings.word_embeddings.weight"], source,
                     "vocab_projector.weight")
    return to_qkv_layout(params, config.fused_qkv)


def hf_state_dict_from_distilbert(params: dict, config: BertConfig, prefix: str = PREFIX) -> dict[str, np.ndarray]:
    """Our {'bert'(, 'mlm_head')} -> HF names, contiguous float32; the body takes `prefix` ('' : DistilBertModel),
    the MLM head never does. The tied vocab_projector.weight is written out too. A pooler or token-type table in
    `params` has no DistilBERT place and is not read."""
    _check_exportable(config)
    params = hf_layout(flax.core.meta.unbox(params))
    state_dict = {}
    for section, entries in _layout(config).items():
        for name, path, layout, _ in entries:
            if section == "bert" or lookup(params, path) is not None:
                state_dict[prefix + name if section == "bert" else name] = take_tensor(params, path, layout, config)
    if "vocab_projector.bias" in state_dict:
        state_dict["vocab_projector.weight"] = state_dict[f"{prefix}embeddings.word_embeddings.weight"].copy()
    return state_dict


# ----- directories -----
def load_hf_distilbert(directory: str) -> tuple[BertConfig, dict]:
    """A Hugging Face DistilBERT directory -> (BertConfig, {'bert'(, 'mlm_head')} as numpy arrays)."""
    directory = os.path.expanduser(directory)
    hf_config, config_path = hf_io.read_hf_config(directory, "distilbert", "DistilBERT")
    state_dict, weights_path = hf_io.read_weights(directory)
    config = hf_config_to_distilbert(hf_config, config_path)
    return config, distilbert_params_from_hf(state_dict, config, source=weights_path)


def save_hf_distilbert(directory: str, params: dict, config: BertConfig, *, vocab_file: str | None = None,
                       lowercase: bool = True) -> str:
    """Export as DistilBertForMaskedLM (params with 'mlm_head') or DistilBertModel, with the vocabulary when one is
    given; the target is checked as save_hf_bert checks it. -> the architecture written."""
    directory = hf_io.check_export_target(directory)
    architecture = "DistilBertForMaskedLM" if "mlm_head" in params else "DistilBertModel"
    state_dict = hf_state_dict_from_distilbert(params, config, prefix=PREFIX if "mlm_head" in params else "")
    hf_io.write_export(directory, distilbert_config_to_hf(config, architecture), state_dict,
                       hf_io.bert_tokenizer_files(vocab_file, lowercase, config))
    return architecture
