"""Hugging Face T5ForConditionalGeneration <-> our T5 (models/t5.py): tensors, config.json, directories.

Both layouts: T5 1.0 (feed_forward_proj "relu": DenseReluDense.wi/wo; lm_head tied to `shared`,
decoder output scaled by d_model**-0.5) and T5 1.1 ("gated-gelu": wi_0/wi_1/wo; separate lm_head,
no scaling). One table (`_layout`) lists every tensor once, so import and export cannot drift.
Tensor layouts (torch [out, in] <-> our [in, H, K] ...) are those of the BERT converter.

transformers >= 5 always writes tie_word_embeddings=true and says "untied" with
scale_decoder_outputs=false; older versions wrote tie_word_embeddings=false. Both are read. A
checkpoint without a separate lm_head but without the scaling (a 1.1 model saved by transformers 5)
becomes our untied model with lm_head = a copy of the embedding: the same function.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

import flax.core.meta
import numpy as np
from absl import logging

from models.convert.layouts import place_tensor, take_tensor
from models.convert.hf_io import SPIECE, check_export_target, read_hf_config, read_weights, write_export
from models.t5 import T5Config
from models.qkv_layout import hf_layout, to_qkv_layout
from models.errors import ModelInputError

# config.json key -> T5Config field (feed_forward_proj and the tying are handled apart)
_CONFIG_KEYS = {
    "vocab_size": "vocab_size", "d_model": "d_model", "d_kv": "head_dim", "d_ff": "d_ff", "num_heads": "num_heads",
    "num_layers": "num_encoder_layers", "num_decoder_layers": "num_decoder_layers",
    "relative_attention_num_buckets": "relative_attention_num_buckets",
    "relative_attention_max_distance": "relative_attention_max_distance",
    "dropout_rate": "dropout_rate", "layer_norm_epsilon": "layer_norm_eps", "initializer_factor": "initializer_factor",
}
# Tensors transformers saves or used to save that carry nothing of their own.
_REDUNDANT = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
              "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")


def _layout(config: T5Config) -> list[tuple[str, tuple[str, ...], str, tuple[int, ...]]]:
    """[(HF name, our param path, layout, HF shape)] for every tensor of the model."""
    d, f, inner = config.d_model, config.d_ff, config.num_heads * config.head_dim
    gated = config.feed_forward == "gated-gelu"

    def attention(hf, ours):
        return ([(f"{hf}.{p}.weight", (*ours, name, "kernel"), "heads_in", (inner, d))
                 for p, name in (("q", "query"), ("k", "key"), ("v", "value"))]
                + [(f"{hf}.o.weight", (*ours, "out", "kernel"), "heads_out", (d, inner))])

    def norm(hf, ours):
        return [(f"{hf}.weight", (*ours, "scale"), "copy", (d,))]

    entries = [("shared.weight", ("shared", "embedding"), "copy", (config.vocab_size, d))]
    for stack, num_layers in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        entries.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                        (stack, "relative_position_bias", "embedding"), "copy",
                        (config.relative_attention_num_buckets, config.num_heads)))
        for i in range(num_layers):
            hf, ours = f"{stack}.block.{i}.layer", (stack, f"layer_{i}")
            entries += norm(f"{hf}.0.layer_norm", (*ours, "self_attention_norm"))
            entries += attention(f"{hf}.0.SelfAttention", (*ours, "self_attention"))
            ff = 1
            if stack == "decoder":
                entries += norm(f"{hf}.1.layer_norm", (*ours, "cross_attention_norm"))
                entries += attention(f"{hf}.1.EncDecAttention", (*ours, "cross_attention"))
                ff = 2
            entries += norm(f"{hf}.{ff}.layer_norm", (*ours, "mlp_norm"))
            mlp_in = [("wi_0", "intermediate"), ("wi_1", "intermediate_linear")] if gated else [("wi", "intermediate")]
            entries += [(f"{hf}.{ff}.DenseReluDense.{p}.weight", (*ours, "mlp", name, "kernel"), "linear", (f, d))
                        for p, name in mlp_in]
            entries.append((f"{hf}.{ff}.DenseReluDense.wo.weight", (*ours, "mlp", "output", "kernel"), "linear",
                            (d, f)))
        entries += norm(f"{stack}.final_layer_norm", (stack, "final_norm"))
    if not config.tie_word_embeddings:
        entries.append(("lm_head.weight", ("lm_head", "kernel"), "linear", (config.vocab_size, d)))
    return entries


def hf_config_to_t5(hf_config: dict, *, untied_lm_head: bool, source: str = "config.json") -> T5Config:
    """A config.json dict -> T5Config. untied_lm_head: the weights hold an lm_head unequal to `shared`."""
    feed_forward = hf_config.get("feed_forward_proj", "relu")
    if feed_forward not in ("relu", "gated-gelu"):
        raise ModelInputError(f"{source}: feed_forward_proj={feed_forward!r} is not supported (our T5 implements "
                              "'relu' (T5 1.0) and 'gated-gelu' (T5 1.1))")
    scaled = hf_config.get("scale_decoder_outputs", hf_config.get("tie_word_embeddings", True))
    if scaled and untied_lm_head:
        raise ModelInputError(f"{source}: the decoder output is scaled as for a tied lm_head but the checkpoint's "
                              "lm_head differs from the embedding (set tie_word_embeddings to false in config.json "
                              "if it is T5 1.1)")
    default = T5Config()
    fields = {ours: type(getattr(default, ours))(hf_config[hf]) for hf, ours in _CONFIG_KEYS.items()
              if hf_config.get(hf) is not None}
    fields.setdefault("num_decoder_layers", fields.get("num_encoder_layers", default.num_decoder_layers))
    return T5Config(**fields, feed_forward=feed_forward, tie_word_embeddings=bool(scaled))


def t5_config_to_hf(config: T5Config) -> dict:
    """T5Config -> a config.json dict that transformers 4.x and 5.x both read as this model."""
    return {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
            **{hf: getattr(config, ours) for hf, ours in _CONFIG_KEYS.items()},
            "feed_forward_proj": config.feed_forward, "tie_word_embeddings": config.tie_word_embeddings,
            "is_encoder_decoder": True, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}


def _normalise(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    sd = {k: np.asarray(v) for k, v in state_dict.items()}
    if "shared.weight" not in sd and "encoder.embed_tokens.weight" in sd:  # some saves keep only the stack's copy
        sd["shared.weight"] = sd["encoder.embed_tokens.weight"]
    return sd


def has_untied_lm_head(state_dict: Mapping[str, Any]) -> bool:
    sd = _normalise(state_dict)
    return "lm_head.weight" in sd and not np.array_equal(sd["lm_head.weight"], sd.get("shared.weight"))


def t5_params_from_hf(state_dict: Mapping[str, Any], config: T5Config, *, source: str = "the checkpoint") -> dict:
    """HF name -> array (T5ForConditionalGeneration naming) -> the `params` of models.t5.T5."""
    sd = _normalise(state_dict)
    if not config.tie_word_embeddings and "lm_head.weight" not in sd:  # transformers 5 save of a 1.1 model
        sd["lm_head.weight"] = sd.get("shared.weight")
    params: dict = {}
    used = set()
    for name, path, layout, shape in _layout(config):
        place_tensor(params, sd, name, path, layout, shape, config, source=source,
                     missing_hint=f"is it a T5 checkpoint with {config.num_encoder_layers}+{config.num_decoder_layers} "
                                  f"layers and feed_forward_proj={config.feed_forward!r}? check config.json")
        used.add(name)
    unused = sorted(set(sd) - used - set(_REDUNDANT) - {"lm_head.weight"})
    if unused:
        logging.warning("%s: %d tensors are not part of T5ForConditionalGeneration and were ignored: %s",
                        source, len(unused), ", ".join(unused[:5]))
    return to_qkv_layout(params, config.fused_qkv)  # the layout the model asks for


def hf_state_dict_from_t5(params: dict, config: T5Config) -> dict[str, np.ndarray]:
    """Our params -> HF names, contiguous float32; the tensors transformers itself saves (tied copies left out)."""
    params = flax.core.meta.unbox(params)  # accept trees straight from model.init (nn.Partitioned boxes)
    params = hf_layout(params)  # a scanned run's stacked layers, one per HF layer; fused qkv split
    state_dict = {}
    for name, path, layout, _ in _layout(config):
        state_dict[name] = take_tensor(params, path, layout, config)
    return state_dict


def load_hf_t5(directory: str) -> tuple[T5Config, dict]:
    """A Hugging Face T5ForConditionalGeneration directory -> (T5Config, our params as numpy arrays)."""
    directory = os.path.expanduser(directory)
    hf_config, config_path = read_hf_config(directory, "t5", "T5")
    state_dict, weights_path = read_weights(directory)
    config = hf_config_to_t5(hf_config, untied_lm_head=has_untied_lm_head(state_dict), source=config_path)
    return config, t5_params_from_hf(state_dict, config, source=weights_path)


def save_hf_t5(directory: str, params: dict, config: T5Config, *, spm_file: str | None = None) -> None:
    """Export as a directory transformers' T5ForConditionalGeneration.from_pretrained loads (with the
    SentencePiece model as spiece.model when given). Written to a temporary directory and renamed
    into place; an existing directory is replaced only if it holds nothing but files an export writes.
    """
    directory = check_export_target(directory)
    if spm_file is not None and not os.path.isfile(spm_file):
        raise ModelInputError(f"SentencePiece model not found: {spm_file} (give the .model the T5 was trained with)")
    state_dict = hf_state_dict_from_t5(params, config)

    def tokenizer_files(tmp: str) -> None:
        if spm_file is not None:
            shutil.copyfile(spm_file, os.path.join(tmp, SPIECE))
    write_export(directory, t5_config_to_hf(config), state_dict, tokenizer_files)
