"""Hugging Face BERT <-> our BERT: tensor names, layouts and config.json fields.

torch Linear weights are [out, in]; our kernels are [in, ...out] with attention projections split
per head: query/key/value [D, H, K] and the output projection [H, K, D]. One table (`_layout`) lists
every tensor once, so import and export cannot drift apart. Reading and writing whole directories
lives in models/convert/hf_io.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.core.meta
import numpy as np

from models.bert import BertConfig
from models.convert.layouts import drop_untied_head, lookup, place_tensor, take_tensor
from models.qkv_layout import hf_layout, to_qkv_layout
from models.errors import ModelInputError

# config.json key -> BertConfig field
_CONFIG_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
    "hidden_dropout_prob": "dropout_rate", "attention_probs_dropout_prob": "attention_dropout_rate",
    "layer_norm_eps": "layer_norm_eps", "initializer_range": "initializer_range",
}
# The first tensor of each optional section; its presence decides whether the section is there.
_OPTIONAL = {"pooler": "pooler.dense.weight", "mlm_head": "cls.predictions.transform.dense.weight",
             "nsp_head": "cls.seq_relationship.weight"}


# A model without token types (DistilBERT-shaped) exports as BERT with this many rows of zeros: a sentence pair's
# segment ids 0 and 1 both index it, and add nothing, as in the model trained.
EXPORTED_TOKEN_TYPES = 2

Entry = tuple[str, tuple[str, ...], str, tuple[int, ...]]  # (HF name, our param path, layout, HF shape)


def linear_entries(hf: str, ours: tuple[str, ...], n_in: int, n_out: int) -> list[Entry]:
    return [(f"{hf}.weight", (*ours, "kernel"), "linear", (n_out, n_in)), (f"{hf}.bias", (*ours, "bias"), "copy", (n_out,))]


def norm_entries(hf: str, ours: tuple[str, ...], width: int) -> list[Entry]:
    return [(f"{hf}.weight", (*ours, "scale"), "copy", (width,)), (f"{hf}.bias", (*ours, "bias"), "copy", (width,))]


def encoder_layout(config: BertConfig, root: tuple[str, ...] = ("bert",),
                   embeddings_root: tuple[str, ...] | None = None) -> list[Entry]:
    """BERT's encoder, as ELECTRA's models name it too: the embeddings (E wide) at `embeddings_root` (default
    root; ELECTRA's generator reads the discriminator's), the E -> H projection where E != H, the layers."""
    d, f, e = config.hidden_size, config.intermediate_size, config.embedding_width
    emb = (*(embeddings_root or root), "embeddings")

    def table(hf, ours, rows):
        return [(f"{hf}.weight", (*emb, ours, "embedding"), "copy", (rows, e))]

    body = (table("embeddings.word_embeddings", "word_embeddings", config.vocab_size)
            + table("embeddings.position_embeddings", "position_embeddings", config.max_position_embeddings)
            + (table("embeddings.token_type_embeddings", "token_type_embeddings", config.type_vocab_size)
               if config.type_vocab_size else [])  # none: DistilBERT-shaped (exported as a zero table, below)
            + norm_entries("embeddings.LayerNorm", (*emb, "norm"), e))
    if e != d:
        body += linear_entries("embeddings_project", (*root, "embeddings_project"), e, d)
    for i in range(config.num_layers):
        hf, ours = f"encoder.layer.{i}", (*root, f"layer_{i}")
        for name in ("query", "key", "value"):
            body += [(f"{hf}.attention.self.{name}.weight", (*ours, "attention", name, "kernel"), "heads_in", (d, d)),
                     (f"{hf}.attention.self.{name}.bias", (*ours, "attention", name, "bias"), "heads_bias", (d,))]
        body += [(f"{hf}.attention.output.dense.weight", (*ours, "attention", "out", "kernel"), "heads_out", (d, d)),
                 (f"{hf}.attention.output.dense.bias", (*ours, "attention", "out", "bias"), "copy", (d,))]
        body += norm_entries(f"{hf}.attention.output.LayerNorm", (*ours, "attention_norm"), d)
        body += linear_entries(f"{hf}.intermediate.dense", (*ours, "mlp", "intermediate"), d, f)
        body += linear_entries(f"{hf}.output.dense", (*ours, "mlp", "output"), f, d)
        body += norm_entries(f"{hf}.output.LayerNorm", (*ours, "output_norm"), d)
    return body


def _layout(config: BertConfig) -> dict[str, list[Entry]]:
    """section -> [(HF name without the 'bert.' prefix, our param path, layout, HF shape)]."""
    d = config.hidden_size
    mlm = ("mlm_head",)
    return {
        "bert": encoder_layout(config),
        "pooler": linear_entries("pooler.dense", ("bert", "pooler"), d, d),
        "mlm_head": (linear_entries("cls.predictions.transform.dense", (*mlm, "transform"), d, d)
                     + norm_entries("cls.predictions.transform.LayerNorm", (*mlm, "transform_norm"), d)
                     + [("cls.predictions.bias", (*mlm, "bias"), "copy", (config.vocab_size,))]),
        "nsp_head": linear_entries("cls.seq_relationship", ("nsp_head", "classifier"), d, 2),
    }


def _normalise_names(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Drop the 'bert.' prefix and accept the older spellings transformers still reads."""
    sd = {}
    for k, v in state_dict.items():
        k = k.removeprefix("bert.").replace("LayerNorm.gamma", "LayerNorm.weight")
        k = k.replace("LayerNorm.beta", "LayerNorm.bias")
        sd[k] = np.asarray(v)
    if "cls.predictions.bias" not in sd and "cls.predictions.decoder.bias" in sd:  # the tied copy was the one saved
        sd["cls.predictions.bias"] = sd["cls.predictions.decoder.bias"]
    return sd


def bert_params_from_hf(state_dict: Mapping[str, Any], config: BertConfig, *, source: str = "the checkpoint") -> dict:
    """state_dict: HF name -> array (BertModel names, or 'bert.'-prefixed ones with cls.* heads).

    Returns the `params` collection of models.bert.BertForPreTraining. Sections absent from the
    checkpoint (pooler, MLM head, NSP head; NSP also when config.next_sentence is False) are left
    out: the caller keeps freshly initialised ones. `source` names the file in error messages.
    """
    sd = _normalise_names(state_dict)
    params: dict = {}
    for section, entries in _layout(config).items():
        if section != "bert" and (_OPTIONAL[section] not in sd or (section == "nsp_head" and not config.next_sentence)):
            continue
        for name, path, layout, shape in entries:
            place_tensor(params, sd, name, path, layout, shape, config, source=source,
                         missing_hint=f"is it a BERT checkpoint with {config.num_layers} layers? check config.json")
    drop_untied_head(params, sd.get("cls.predictions.decoder.weight"), sd["embeddings.word_embeddings.weight"], source,
                     "cls.predictions.decoder.weight")
    return to_qkv_layout(params, config.fused_qkv)  # the layout the model asks for


def hf_state_dict_from_bert(params: dict, config: BertConfig, prefix: str = "bert.") -> dict[str, np.ndarray]:
    """Our tree {'bert', optional 'mlm_head', 'nsp_head'} -> HF names, contiguous float32.

    prefix='bert.' gives BertForPreTraining / BertForMaskedLM naming, prefix='' BertModel naming
    (cls.* heads never take the prefix). The tied MLM decoder is written out too, so transformers
    loads the export without reporting missing keys.
    """
    params = flax.core.meta.unbox(params)  # accept trees straight from model.init (nn.Partitioned boxes)
    params = hf_layout(params)  # a scanned run's stacked layers, one per HF layer; fused qkv split
    state_dict = {}
    for section, entries in _layout(config).items():
        for name, path, layout, _ in entries:
            if section == "bert" or lookup(params, path) is not None:  # the heads are optional
                hf = name if name.startswith("cls.") else prefix + name
                state_dict[hf] = take_tensor(params, path, layout, config)
    if not config.type_vocab_size:  # a zero table adds nothing, whatever segment ids a BERT tokenizer gives
        state_dict[f"{prefix}embeddings.token_type_embeddings.weight"] = np.zeros(
            (EXPORTED_TOKEN_TYPES, config.embedding_width), np.float32)
    if "cls.predictions.bias" in state_dict:
        state_dict["cls.predictions.decoder.weight"] = state_dict[f"{prefix}embeddings.word_embeddings.weight"].copy()
        state_dict["cls.predictions.decoder.bias"] = state_dict["cls.predictions.bias"].copy()
    return state_dict


def hf_config_to_bert(hf_config: dict, *, next_sentence: bool = False, source: str = "config.json") -> BertConfig:
    """A config.json dict -> BertConfig. next_sentence=True only when the checkpoint has NSP weights.

    Missing keys take transformers' defaults (equal to BertConfig's). Options our BERT does not
    implement are rejected rather than silently computing a different function.
    """
    for key, supported in (("hidden_act", "gelu"), ("position_embedding_type", "absolute")):
        value = hf_config.get(key, supported)
        if value != supported:
            raise ModelInputError(f"{source}: {key}={value!r} is not supported (our BERT implements "
                                  f"{key}={supported!r} only)")
    default = BertConfig()
    fields = {ours: type(getattr(default, ours))(hf_config[hf]) for hf, ours in _CONFIG_KEYS.items() if hf in hf_config}
    config = BertConfig(**fields, next_sentence=next_sentence)
    if config.hidden_size % config.num_heads:
        raise ModelInputError(f"{source}: hidden_size={config.hidden_size} is not a multiple of "
                              f"num_attention_heads={config.num_heads}")
    return config


def bert_config_to_hf(config: BertConfig, architecture: str = "BertForPreTraining") -> dict:
    """BertConfig -> a config.json dict transformers loads (AutoModel picks `architecture`)."""
    if config.pre_norm:
        raise ModelInputError("model.pre_norm=True (pre-LN blocks, a final LayerNorm) has no transformers BERT form: "
                              "fine-tune it here (pretrain.finetune) rather than exporting it")
    return {"architectures": [architecture], "model_type": "bert",
            **{hf: getattr(config, ours) for hf, ours in _CONFIG_KEYS.items()},
            "type_vocab_size": config.type_vocab_size or EXPORTED_TOKEN_TYPES, "hidden_act": "gelu", "position_embedding_type": "absolute", "pad_token_id": 0, "tie_word_embeddings": True}
