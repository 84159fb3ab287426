"""Hugging Face ALBERT <-> our BERT with ALBERT's settings (factorised embeddings, one shared layer).

ALBERT (Lan et al., 2020) is our BERT encoder with `embedding_size` E < H, `shared_layers=True` and
`hidden_act="gelu_new"`; its sentence-order head is our NSP head (a 2-way Linear on the pooled output).
Names are transformers' `AlbertModel` / `AlbertForPreTraining` ones. One table (`_layout`) lists every
tensor once, so import and export cannot drift apart; the layouts are models/convert/layouts.py's.

What our model does not implement is refused with one line naming the key: several layer groups
(num_hidden_groups), several layers per group (inner_group_num), relative position embeddings, and
activations other than gelu / gelu_new. Hugging Face's E -> H projection exists even when E == H; ours
only when E < H, so an export at E == H writes the identity (exact) and an import at E == H accepts only
the identity. Reading and writing whole directories lives in models/convert/hf_io.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.core.meta
import numpy as np

from models.bert import BertConfig
from models.convert.hf_bert import linear_entries, norm_entries
from models.convert.layouts import drop_untied_head, lookup, place_tensor, take_tensor
from models.errors import ModelInputError
from models.qkv_layout import hf_layout, to_qkv_layout
from models.stack import SHARED

# config.json key -> BertConfig field
_CONFIG_KEYS = {
    "vocab_size": "vocab_size", "embedding_size": "embedding_size", "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
    "hidden_dropout_prob": "dropout_rate", "attention_probs_dropout_prob": "attention_dropout_rate",
    "layer_norm_eps": "layer_norm_eps", "initializer_range": "initializer_range", "hidden_act": "hidden_act",
}
# transformers' AlbertConfig defaults (albert-xxlarge's sizes) for keys a config.json leaves out
_HF_DEFAULTS = {"vocab_size": 30000, "embedding_size": 128, "hidden_size": 4096, "num_hidden_layers": 12,
                "num_attention_heads": 64, "intermediate_size": 16384, "max_position_embeddings": 512,
                "type_vocab_size": 2, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
                "layer_norm_eps": 1e-12, "initializer_range": 0.02, "hidden_act": "gelu_new"}
# (key, the only value we implement)
_UNSUPPORTED = (("num_hidden_groups", 1), ("inner_group_num", 1), ("position_embedding_type", "absolute"))
# The first tensor of each optional section; its presence decides whether the section is there.
_OPTIONAL = {"pooler": "pooler.weight", "mlm_head": "predictions.dense.weight",
             "nsp_head": "sop_classifier.classifier.weight"}
PREFIX = "albert."
MAPPING = "encoder.embedding_hidden_mapping_in"
_LAYER = "encoder.albert_layer_groups.0.albert_layers.0"


def _layout(config: BertConfig) -> dict[str, list[tuple[str, tuple[str, ...], str, tuple[int, ...]]]]:
    """section -> [(HF name without the 'albert.' prefix, our param path, layout, HF shape)]."""
    d, e, f = config.hidden_size, config.embedding_width, config.intermediate_size
    linear = linear_entries

    def norm(hf, ours, width=d):
        return norm_entries(hf, ours, width)

    def table(name, rows):
        return [(f"embeddings.{name}.weight", ("bert", "embeddings", name, "embedding"), "copy", (rows, e))]

    layer = ("bert", SHARED)
    body = (table("word_embeddings", config.vocab_size) + table("position_embeddings", config.max_position_embeddings)
            + table("token_type_embeddings", config.type_vocab_size)
            + norm("embeddings.LayerNorm", ("bert", "embeddings", "norm"), e))
    if e != d:
        body += linear(MAPPING, ("bert", "embeddings_project"), e, d)
    for name in ("query", "key", "value"):
        body += [(f"{_LAYER}.attention.{name}.weight", (*layer, "attention", name, "kernel"), "heads_in", (d, d)),
                 (f"{_LAYER}.attention.{name}.bias", (*layer, "attention", name, "bias"), "heads_bias", (d,))]
    body += [(f"{_LAYER}.attention.dense.weight", (*layer, "attention", "out", "kernel"), "heads_out", (d, d)),
             (f"{_LAYER}.attention.dense.bias", (*layer, "attention", "out", "bias"), "copy", (d,))]
    body += norm(f"{_LAYER}.attention.LayerNorm", (*layer, "attention_norm"))
    body += linear(f"{_LAYER}.ffn", (*layer, "mlp", "intermediate"), d, f)
    body += linear(f"{_LAYER}.ffn_output", (*layer, "mlp", "output"), f, d)
    body += norm(f"{_LAYER}.full_layer_layer_norm", (*layer, "output_norm"))
    return {
        "bert": body,
        "pooler": linear("pooler", ("bert", "pooler"), d, d),
        "mlm_head": (linear("predictions.dense", ("mlm_head", "transform"), d, e)
                     + norm("predictions.LayerNorm", ("mlm_head", "transform_norm"), e)
                     + [("predictions.bias", ("mlm_head", "bias"), "copy", (config.vocab_size,))]),
        "nsp_head": linear("sop_classifier.classifier", ("nsp_head", "classifier"), d, 2),
    }


def _normalise_names(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Drop the 'albert.' prefix; the MLM bias may have been saved as its tied copy only."""
    sd = {k.removeprefix(PREFIX): np.asarray(v) for k, v in state_dict.items()}
    if "predictions.bias" not in sd and "predictions.decoder.bias" in sd:
        sd["predictions.bias"] = sd["predictions.decoder.bias"]
    return sd


def albert_params_from_hf(state_dict: Mapping[str, Any], config: BertConfig, *,
                          source: str = "the checkpoint") -> dict:
    """state_dict: HF name -> array (AlbertModel names, or 'albert.'-prefixed ones with predictions.* and
    sop_classifier.*). Returns the `params` of models.bert.BertForPreTraining(config) (config.shared_layers);
    sections absent from the checkpoint (pooler, MLM head, SOP head) are left out."""
    sd = _normalise_names(state_dict)
    hint = f"is it an ALBERT checkpoint with embedding_size={config.embedding_width}? check config.json"
    params: dict = {}
    for section, entries in _layout(config).items():
        if section != "bert" and (_OPTIONAL[section] not in sd or (section == "nsp_head" and not config.next_sentence)):
            continue
        for name, path, layout, shape in entries:
            place_tensor(params, sd, name, path, layout, shape, config, source=source, missing_hint=hint)
    if config.embedding_width == config.hidden_size:
        _check_identity(sd, config.hidden_size, source)
    drop_untied_head(params, sd.get("predictions.decoder.weight"), sd["embeddings.word_embeddings.weight"], source,
                     "predictions.decoder.weight")
    return to_qkv_layout(params, config.fused_qkv)


def _check_identity(sd: dict[str, np.ndarray], width: int, source: str) -> None:
    """At E == H our model has no projection: Hugging Face's must be the identity to be left out."""
    weight, bias = sd.get(f"{MAPPING}.weight"), sd.get(f"{MAPPING}.bias")
    if weight is not None and not (np.array_equal(weight, np.eye(width, dtype=weight.dtype))
                                   and (bias is None or not bias.any())):
        raise ModelInputError(f"{source}: embedding_size equals hidden_size but {MAPPING} is not the identity (our "
                              "model has no projection at equal widths; only checkpoints with embedding_size < "
                              "hidden_size or an identity mapping load)")


def hf_state_dict_from_albert(params: dict, config: BertConfig, prefix: str = PREFIX) -> dict[str, np.ndarray]:
    """Our tree {'bert', optional 'mlm_head', 'nsp_head'} -> HF names, contiguous float32.

    prefix='albert.' gives AlbertForPreTraining / AlbertForMaskedLM naming, '' AlbertModel naming (the heads'
    names never take it). The tied decoder (weight and bias) is written out too."""
    if not config.shared_layers:
        raise ModelInputError("an ALBERT export needs model.shared_layers=True (one layer's weights at every depth); "
                              "export a model with a layer per depth as BERT")
    params = hf_layout(flax.core.meta.unbox(params))  # fused qkv split
    state_dict = {}
    for section, entries in _layout(config).items():
        for name, path, layout, _ in entries:
            if section == "bert" or lookup(params, path) is not None:
                hf = prefix + name if section in ("bert", "pooler") else name
                state_dict[hf] = take_tensor(params, path, layout, config)
    if config.embedding_width == config.hidden_size:  # Hugging Face always projects: the identity is exact
        state_dict[f"{prefix}{MAPPING}.weight"] = np.eye(config.hidden_size, dtype=np.float32)
        state_dict[f"{prefix}{MAPPING}.bias"] = np.zeros(config.hidden_size, np.float32)
    if "predictions.bias" in state_dict:
        state_dict["predictions.decoder.weight"] = state_dict[f"{prefix}embeddings.word_embeddings.weight"].copy()
        state_dict["predictions.decoder.bias"] = state_dict["predictions.bias"].copy()
    return state_dict


def hf_config_to_albert(hf_config: dict, *, next_sentence: bool = False, source: str = "config.json") -> BertConfig:
    """An ALBERT config.json dict -> BertConfig(shared_layers=True). next_sentence=True only when the checkpoint
    has the SOP head. Missing keys take transformers' AlbertConfig defaults."""
    for key, supported in _UNSUPPORTED:
        if hf_config.get(key, supported) != supported:
            raise ModelInputError(f"{source}: {key}={hf_config[key]!r} is not supported (our ALBERT implements "
                                  f"{key}={supported!r} only)")
    act = hf_config.get("hidden_act", _HF_DEFAULTS["hidden_act"])
    if act not in ("gelu", "gelu_new"):
        raise ModelInputError(f"{source}: hidden_act={act!r} is not supported (our ALBERT implements gelu_new and "
                              "gelu)")
    fields = {ours: type(getattr(BertConfig(), ours))(hf_config.get(hf, _HF_DEFAULTS[hf]))
              for hf, ours in _CONFIG_KEYS.items()}
    if fields["hidden_size"] % fields["num_heads"]:
        raise ModelInputError(f"{source}: hidden_size={fields['hidden_size']} is not a multiple of "
                              f"num_attention_heads={fields['num_heads']}")
    if fields["embedding_size"] > fields["hidden_size"]:
        raise ModelInputError(f"{source}: embedding_size={fields['embedding_size']} is above hidden_size="
                              f"{fields['hidden_size']} (our ALBERT projects a narrower table up)")
    if fields["embedding_size"] == fields["hidden_size"]:
        fields["embedding_size"] = 0  # no projection (the checkpoint's must be the identity)
    return BertConfig(**fields, shared_layers=True, next_sentence=next_sentence)


def albert_config_to_hf(config: BertConfig, architecture: str = "AlbertForPreTraining") -> dict:
    """BertConfig (shared_layers) -> a config.json dict transformers loads as ALBERT."""
    values = {hf: getattr(config, ours) for hf, ours in _CONFIG_KEYS.items()}
    values["embedding_size"] = config.embedding_width
    return {"architectures": [architecture], "model_type": "albert", **values, "num_hidden_groups": 1,
            "inner_group_num": 1, "position_embedding_type": "absolute", "classifier_dropout_prob": 0.1,
            "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3, "tie_word_embeddings": True}
