"""Hugging Face ModernBERT <-> ours (models/modernbert.py): tensor names, layouts and config.json fields.

Hugging Face fuses the attention projections into `Wqkv` [3 * H * K, D] and the GeGLU's two input projections
into `Wi` [2F, D] (the activated half first, then the gate); ours are separate Dense kernels, split and joined
here. One table (`_layout`) lists every tensor once, so import and export cannot drift apart. Whole directories:
`load_hf_modernbert` (config.json + model.safetensors -> our config and params) and `save_hf_modernbert` (the
other way, with the tokenizer.json and a tokenizer_config.json that AutoTokenizer reads), through
models/convert/hf_io.py's readers and atomic writer.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import flax.core.meta
import numpy as np

from models.convert import hf_io
from models.convert.layouts import lookup, place_tensor, take_tensor
from models.errors import ModelInputError
from models.modernbert import ModernBertConfig
from models.qkv_layout import hf_layout, to_qkv_layout

# config.json key -> ModernBertConfig field
_CONFIG_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "global_attn_every_n_layers": "global_attn_every_n_layers",
    "local_attention": "local_attention", "norm_eps": "norm_eps", "embedding_dropout": "embedding_dropout",
    "mlp_dropout": "dropout_rate", "attention_dropout": "attention_dropout_rate",
    "initializer_range": "initializer_range", "initializer_cutoff_factor": "initializer_cutoff_factor",
    "hidden_activation": "hidden_act", "classifier_activation": "classifier_activation",
    "classifier_pooling": "classifier_pooling", "decoder_bias": "decoder_bias",
}
# Options of Hugging Face's ModernBERT that ours does not implement: (key, the value ours computes).
_FIXED = (("norm_bias", False), ("attention_bias", False), ("mlp_bias", False), ("classifier_bias", False),
          ("tie_word_embeddings", True))
MASKED_LM = "ModernBertForMaskedLM"
# transformers' fine-tuning classes -> the Dense of our `head` (objectives/task_heads: the head kind's module) that
# holds their `classifier`. A head kind's hf_class names BERT's class: ModernBERT's is `task_class` of it.
TASK_CLASSES = {"ModernBertForSequenceClassification": "classifier", "ModernBertForTokenClassification": "classifier",
                "ModernBertForQuestionAnswering": "qa_outputs"}
# ModernBERT's special tokens, as its tokenizer_config.json names them, and their ids in config.json (transformers'
# defaults, ModernBERT-base's; bos and eos are [CLS] and [SEP])
SPECIAL_TOKENS = {"cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]", "pad_token": "[PAD]",
                  "unk_token": "[UNK]"}
_TOKEN_IDS = {"pad_token_id": ("pad_token", 50283), "cls_token_id": ("cls_token", 50281),
              "sep_token_id": ("sep_token", 50282), "bos_token_id": ("cls_token", 50281),
              "eos_token_id": ("sep_token", 50282)}

Entry = tuple[str, tuple[str, ...], str, tuple[int, ...]]  # (HF name, our param path, layout, HF shape)


def _encoder_layout(c: ModernBertConfig) -> list[Entry]:
    d, f, root = c.hidden_size, c.intermediate_size, ("modernbert",)
    body = [("model.embeddings.tok_embeddings.weight", (*root, "embeddings", "word_embeddings", "embedding"), "copy",
             (c.vocab_size, d)),
            ("model.embeddings.norm.weight", (*root, "embeddings", "norm", "scale"), "copy", (d,))]
    for i in range(c.num_layers):
        hf, ours = f"model.layers.{i}", (*root, f"layer_{i}")
        if i:  # layer 0 reads the embeddings' norm
            body.append((f"{hf}.attn_norm.weight", (*ours, "attention_norm", "scale"), "copy", (d,)))
        body += [(f"{hf}.attn.Wqkv.weight", (*ours, "attention"), "qkv", (3 * d, d)),
                 (f"{hf}.attn.Wo.weight", (*ours, "attention", "out", "kernel"), "heads_out", (d, d)),
                 (f"{hf}.mlp_norm.weight", (*ours, "mlp_norm", "scale"), "copy", (d,)),
                 (f"{hf}.mlp.Wi.weight", (*ours, "mlp"), "geglu_in", (2 * f, d)),
                 (f"{hf}.mlp.Wo.weight", (*ours, "mlp", "output", "kernel"), "linear", (d, f))]
    body.append(("model.final_norm.weight", (*root, "final_norm", "scale"), "copy", (d,)))
    return body


def _head_layout(c: ModernBertConfig) -> list[Entry]:
    """The prediction head: under the MLM decoder and under every fine-tuning head alike."""
    d = c.hidden_size
    return [("head.dense.weight", ("prediction_head", "dense", "kernel"), "linear", (d, d)),
            ("head.norm.weight", ("prediction_head", "norm", "scale"), "copy", (d,))]


def _classifier_layout(num_labels: int, c: ModernBertConfig, architecture: str) -> list[Entry]:
    """A fine-tuning model's classifier: Hugging Face's `classifier` [C, D] is our head/classifier, or QA's
    head/qa_outputs, kernel [D, C] (TASK_CLASSES)."""
    dense = _dense(architecture)
    return [("classifier.weight", ("head", dense, "kernel"), "linear", (num_labels, c.hidden_size)),
            ("classifier.bias", ("head", dense, "bias"), "copy", (num_labels,))]


def _dense(architecture: str) -> str:
    if architecture not in TASK_CLASSES:
        raise ModelInputError(f"{architecture!r} is no ModernBERT fine-tuning class this converts; use one of "
                              f"{', '.join(TASK_CLASSES)}")
    return TASK_CLASSES[architecture]


def task_class(head_class: str) -> str:
    """A head kind's transformers class (objectives/task_heads' hf_class, BERT's) -> ModernBERT's."""
    modern = f"Modern{head_class}"
    _dense(modern)
    return modern


# Hugging Face's fused tensors <-> our separate kernels, beside layouts.TO_OURS / TO_HF.
def _qkv_to_ours(w: np.ndarray, c: ModernBertConfig) -> dict:
    parts = w.reshape(3, c.num_heads, c.head_dim, w.shape[1])                           # [3, H, K, D]
    return {name: {"kernel": parts[i].transpose(2, 0, 1)} for i, name in enumerate(("query", "key", "value"))}


def _qkv_to_hf(node: dict, c: ModernBertConfig) -> np.ndarray:
    return np.concatenate([np.asarray(node[name]["kernel"], np.float32).reshape(c.hidden_size, -1).T
                           for name in ("query", "key", "value")])


def _geglu_to_ours(w: np.ndarray, c: ModernBertConfig) -> dict:
    activated, gate = np.split(w, 2)
    return {"intermediate": {"kernel": activated.T}, "intermediate_linear": {"kernel": gate.T}}


def _geglu_to_hf(node: dict, c: ModernBertConfig) -> np.ndarray:
    return np.concatenate([np.asarray(node[name]["kernel"], np.float32).T for name in ("intermediate",
                                                                                       "intermediate_linear")])


_FUSED = {"qkv": (_qkv_to_ours, _qkv_to_hf), "geglu_in": (_geglu_to_ours, _geglu_to_hf)}


def _place(params: dict, sd: Mapping, entry: Entry, c: ModernBertConfig, source: str) -> None:
    name, path, layout, shape = entry
    if layout not in _FUSED:
        place_tensor(params, sd, name, path, layout, shape, c, source=source,
                     missing_hint=f"is it a ModernBERT checkpoint with {c.num_layers} layers? check config.json")
        return
    place_tensor(params, sd, name, (*path, "_fused"), "copy", shape, c, source=source,
                 missing_hint=f"is it a ModernBERT checkpoint with {c.num_layers} layers? check config.json")
    node = lookup(params, path)
    node.update(_FUSED[layout][0](node.pop("_fused"), c))


def params_from_hf(state_dict: Mapping[str, Any], config: ModernBertConfig, *, source: str = "the checkpoint",
                   num_labels: int = 0, architecture: str = "ModernBertForSequenceClassification") -> dict:
    """state_dict (ModernBertForMaskedLM / ...For{Sequence,Token}Classification / ...ForQuestionAnswering names, or
    ModernBertModel's without the 'model.' prefix) -> our params: `modernbert`, and `prediction_head` (+ the MLM's
    `decoder_bias`, or with num_labels the `head` of `architecture`) where the checkpoint has them."""
    sd = {k if k.startswith(("model.", "head.", "decoder.", "classifier.")) else f"model.{k}": np.asarray(v)
          for k, v in state_dict.items()}
    params: dict = {}
    entries = _encoder_layout(config)
    if "head.dense.weight" in sd:
        entries += _head_layout(config)
    if num_labels:
        entries += _classifier_layout(num_labels, config, architecture)
    for entry in entries:
        _place(params, sd, entry, config, source)
    if "decoder.bias" in sd and config.decoder_bias:
        params["decoder_bias"] = sd["decoder.bias"]
    decoder = sd.get("decoder.weight")
    if decoder is not None and not np.array_equal(decoder, sd["model.embeddings.tok_embeddings.weight"]):
        raise ModelInputError(f"{source}: decoder.weight is not tied to the word embeddings; our ModernBERT ties them "
                              "(tie_word_embeddings=true), so this checkpoint cannot load")
    return to_qkv_layout(params, config.fused_qkv)


def hf_state_dict(params: dict, config: ModernBertConfig, num_labels: int = 0,
                  architecture: str = "ModernBertForSequenceClassification") -> dict[str, np.ndarray]:
    """Our tree {'modernbert', 'prediction_head', 'decoder_bias'} (ModernBertForMaskedLM) or, with num_labels, a
    fine-tuning tree {'modernbert', 'prediction_head', 'head'} of `architecture` -> Hugging Face's names,
    contiguous float32; the MLM's decoder.weight is left to tie_word_embeddings, as save_pretrained leaves it."""
    params = hf_layout(flax.core.meta.unbox(params))  # looped layers, separate q/k/v
    entries = _encoder_layout(config) + _head_layout(config)
    if num_labels:
        entries += _classifier_layout(num_labels, config, architecture)
    state_dict = {}
    for name, path, layout, _ in entries:
        if layout in _FUSED:
            node = lookup(params, path)
            if node is None:
                raise ModelInputError(f"parameter {'/'.join(path)} is missing from the params to export")
            state_dict[name] = np.ascontiguousarray(_FUSED[layout][1](node, config))
        else:
            state_dict[name] = take_tensor(params, path, layout, config)
    if not num_labels and config.decoder_bias:  # the decoder's weight is the word embeddings: written once, as
        state_dict["decoder.bias"] = take_tensor(params, ("decoder_bias",), "copy", config)  # save_pretrained does
    return state_dict


def config_from_hf(hf_config: dict, *, source: str = "config.json") -> ModernBertConfig:
    """A config.json dict -> ModernBertConfig; options ours does not compute are rejected, one line each."""
    for key, supported in _FIXED:
        if hf_config.get(key, supported) != supported:
            raise ModelInputError(f"{source}: {key}={hf_config[key]!r} is not supported (our ModernBERT computes "
                                  f"{key}={supported!r})")
    rope = hf_config.get("rope_parameters") or {}
    thetas = {"global_rope_theta": (rope.get("full_attention") or {}).get("rope_theta",
                                                                          hf_config.get("global_rope_theta")),
              "local_rope_theta": (rope.get("sliding_attention") or {}).get("rope_theta",
                                                                            hf_config.get("local_rope_theta"))}
    for part in (rope.get("full_attention"), rope.get("sliding_attention")):
        if part and part.get("rope_type", "default") != "default":
            raise ModelInputError(f"{source}: rope_type={part['rope_type']!r} is not supported (ours: 'default')")
    default = ModernBertConfig()
    fields = {ours: type(getattr(default, ours))(hf_config[hf]) for hf, ours in _CONFIG_KEYS.items() if hf in hf_config}
    fields.update({k: float(v) for k, v in thetas.items() if v is not None})
    layer_types = hf_config.get("layer_types")
    if layer_types:  # transformers 5 writes the pattern out: ours is one global layer every n, from layer 0
        n = next((i for i, kind in enumerate(layer_types) if i and kind == "full_attention"), len(layer_types))
        if list(layer_types) != _layer_types(n, len(layer_types)):
            raise ModelInputError(f"{source}: layer_types is not one global layer every n layers from layer 0 (ours "
                                  "alternates so)")
        fields["global_attn_every_n_layers"] = n
    return ModernBertConfig(**fields)


def _layer_types(every: int, count: int) -> list[str]:
    """transformers' layer_types for a global layer every `every` layers from layer 0."""
    return ["full_attention" if i % every == 0 else "sliding_attention" for i in range(count)]


def config_to_hf(config: ModernBertConfig, architecture: str = "ModernBertForMaskedLM", num_labels: int = 0) -> dict:
    """ModernBertConfig -> a config.json dict transformers loads (AutoModel picks `architecture`)."""
    hf = {"architectures": [architecture], "model_type": "modernbert",
          **{key: getattr(config, ours) for key, ours in _CONFIG_KEYS.items()}, **dict(_FIXED),
          "global_rope_theta": config.global_rope_theta, "local_rope_theta": config.local_rope_theta,
          "layer_types": _layer_types(config.global_attn_every_n_layers, config.num_layers),
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": config.global_rope_theta},
                              "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta}}}
    if num_labels:
        hf["num_labels"] = num_labels
    return hf


# ----- Directories -----
def load_hf_modernbert(directory: str) -> tuple[ModernBertConfig, dict]:
    """A Hugging Face ModernBERT directory (config.json + model.safetensors or pytorch_model.bin) -> (ModernBertConfig,
    our params as numpy): `modernbert` and, where the checkpoint has them, `prediction_head` and `decoder_bias`. A
    fine-tuned checkpoint's classifier is task-specific and left out, as load_hf_bert leaves BERT's."""
    directory = os.path.expanduser(directory)
    if not os.path.isdir(directory):
        raise ModelInputError(f"Hugging Face checkpoint directory not found: {directory} (give a directory with "
                              f"{hf_io.CONFIG} and {hf_io.SAFETENSORS})")
    hf_config, config_path = hf_io.read_hf_config(directory, "modernbert", "ModernBERT")
    state_dict, weights_path = hf_io.read_weights(directory)
    config = config_from_hf(hf_config, source=config_path)
    return config, params_from_hf(state_dict, config, source=weights_path)


def save_hf_modernbert(directory: str, params: dict, config: ModernBertConfig, *, tokenizer_file: str | None = None,
                       num_labels: int = 0, architecture: str = MASKED_LM,
                       id2label: Sequence[str] | Mapping[int, str] | None = None,
                       special_tokens: Mapping[str, str] = SPECIAL_TOKENS) -> None:
    """Our params as a directory that transformers' `architecture` loads whole (from_pretrained).

    ModernBertForMaskedLM: params {'modernbert', 'prediction_head', 'decoder_bias'}. A fine-tuning class
    (TASK_CLASSES): params {'modernbert', 'prediction_head', 'head'} with num_labels outputs (QA: 2) and the class
    names in id2label (none for one regression output). tokenizer_file: a tokenizer.json, copied with a
    tokenizer_config.json naming `special_tokens` (those the file has), so AutoTokenizer loads the directory.
    The target is checked and written as hf_io.save_hf_bert does it.
    """
    if architecture == MASKED_LM:
        if num_labels:
            raise ModelInputError(f"num_labels={num_labels} is for a fine-tuning class, not {MASKED_LM} (give one "
                                  f"of {', '.join(TASK_CLASSES)})")
    elif num_labels < 1 or (TASK_CLASSES.get(architecture) == "qa_outputs" and num_labels != 2):
        _dense(architecture)
        raise ModelInputError(f"{architecture} needs num_labels (its outputs; question answering: 2), got "
                              f"{num_labels}")
    directory = hf_io.check_export_target(directory)
    tokenizer, token_ids = _tokenizer_writer(tokenizer_file, config, special_tokens)
    hf_config = {**config_to_hf(config, architecture, num_labels), **token_ids}
    if id2label is not None:
        names = dict(id2label) if isinstance(id2label, Mapping) else dict(enumerate(id2label))
        hf_config["id2label"] = {str(i): name for i, name in names.items()}
        hf_config["label2id"] = {name: int(i) for i, name in names.items()}
    elif architecture == "ModernBertForSequenceClassification" and num_labels == 1:
        hf_config["problem_type"] = "regression"
    state_dict = hf_state_dict(params, config, num_labels, architecture)
    hf_io.write_export(directory, hf_config, state_dict, tokenizer)


def _tokenizer_writer(tokenizer_file: str | None, config: ModernBertConfig, special_tokens: Mapping[str, str]):
    """-> (a writer of the tokenizer.json and its tokenizer_config.json, or None without one; config.json's special
    token ids: the tokenizer's, else transformers' defaults where the vocabulary holds them, else null)."""
    defaults = {key: default if default < config.vocab_size else None for key, (_, default) in _TOKEN_IDS.items()}
    if tokenizer_file is None:
        return None, defaults
    write, ids = hf_io.tokenizer_json_writer(tokenizer_file, config.vocab_size, config.max_position_embeddings,
                                             special_tokens)
    return write, {key: ids.get(name, defaults[key]) for key, (name, _) in _TOKEN_IDS.items()}
