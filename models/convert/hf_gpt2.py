"""Hugging Face GPT2LMHeadModel <-> our GPT (models/gpt.py): tensors, config.json, directories.

GPT-2's checkpoints keep OpenAI's TensorFlow layout: `Conv1D` weights are [in, out] (not torch
Linear's [out, in]) and the query/key/value projections are one fused `c_attn` [D, 3D] (+ bias
[3D], in that order). On import they are split and transposed to the Linear layout of the other
converters, so one table (`_layout`) with the shared layouts of models/convert/layouts.py lists
every tensor once and import and export cannot drift. Both namings are read: transformers' saves
("transformer.h.0...") and OpenAI's original upload ("h.0..."); the causal-mask buffers old saves
hold (attn.bias, attn.masked_bias) are ignored, and the output layer is tied to `wte` (an lm_head
that differs from it is refused: our GPT ties them).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import flax.core.meta
import numpy as np
from absl import logging

from models.convert.hf_io import (check_export_target, read_hf_config, read_weights, tokenizer_json_writer,
                                  write_export)
from models.convert.layouts import place_tensor, take_tensor
from models.gpt import GPTConfig
from models.qkv_layout import hf_layout, to_qkv_layout
from models.errors import ModelInputError

PREFIX = "transformer."   # transformers' GPT2LMHeadModel naming; OpenAI's upload has none
QKV = ("q", "k", "v")      # the thirds of c_attn, in order
# config.json key -> GPTConfig field (n_inner, dropout and the architecture checks are handled apart)
_CONFIG_KEYS = {"vocab_size": "vocab_size", "n_positions": "n_positions", "n_embd": "d_model", "n_layer": "num_layers",
                "n_head": "num_heads", "attn_pdrop": "attention_dropout_rate", "layer_norm_epsilon": "layer_norm_eps",
                "initializer_range": "initializer_range"}
# config.json settings our GPT does not implement -> the value it implements (absent keys are fine)
_REQUIRED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False}
_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")  # GELU's tanh approximation under its two HF names
_BUFFERS = (".attn.bias", ".attn.masked_bias")   # causal-mask buffers of old saves, not weights
_CONV1D = ("attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # [in, out] weights besides c_attn


def _layout(config: GPTConfig) -> list[tuple[str, tuple[str, ...], str, tuple[int, ...]]]:
    """[(name in the Linear layout, our param path, layout, shape)] for every tensor. c_attn appears as
    its three thirds 'h.i.attn.c_attn.q.weight' ...; names carry no 'transformer.' prefix."""
    d, f = config.d_model, config.d_ff
    entries = [("wte.weight", ("token_embedding", "embedding"), "copy", (config.vocab_size, d)),
               ("wpe.weight", ("position_embedding", "embedding"), "copy", (config.n_positions, d))]

    def norm(hf, ours):
        return [(f"{hf}.weight", (*ours, "scale"), "copy", (d,)), (f"{hf}.bias", (*ours, "bias"), "copy", (d,))]

    for i in range(config.num_layers):
        hf, ours = f"h.{i}", (f"layer_{i}",)
        entries += norm(f"{hf}.ln_1", (*ours, "attention_norm"))
        for part, name in zip(QKV, ("query", "key", "value")):
            entries += [(f"{hf}.attn.c_attn.{part}.weight", (*ours, "attention", name, "kernel"), "heads_in", (d, d)),
                        (f"{hf}.attn.c_attn.{part}.bias", (*ours, "attention", name, "bias"), "heads_bias", (d,))]
        entries += [(f"{hf}.attn.c_proj.weight", (*ours, "attention", "out", "kernel"), "heads_out", (d, d)),
                    (f"{hf}.attn.c_proj.bias", (*ours, "attention", "out", "bias"), "copy", (d,))]
        entries += norm(f"{hf}.ln_2", (*ours, "mlp_norm"))
        entries += [(f"{hf}.mlp.c_fc.weight", (*ours, "mlp", "intermediate", "kernel"), "linear", (f, d)),
                    (f"{hf}.mlp.c_fc.bias", (*ours, "mlp", "intermediate", "bias"), "copy", (f,)),
                    (f"{hf}.mlp.c_proj.weight", (*ours, "mlp", "output", "kernel"), "linear", (d, f)),
                    (f"{hf}.mlp.c_proj.bias", (*ours, "mlp", "output", "bias"), "copy", (d,))]
    entries += norm("ln_f", ("final_norm",))
    return entries


# ---------------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------------
def hf_config_to_gpt(hf_config: dict, *, source: str = "config.json") -> GPTConfig:
    activation = hf_config.get("activation_function", "gelu_new")
    if activation not in _ACTIVATIONS:
        raise ModelInputError(f"{source}: activation_function={activation!r} is not supported (our GPT implements "
                              f"GELU's tanh approximation: {' or '.join(_ACTIVATIONS)})")
    for key, value in _REQUIRED.items():
        if key in hf_config and bool(hf_config[key]) != value:
            raise ModelInputError(f"{source}: {key}={hf_config[key]!r} is not supported "
                                  f"(our GPT implements {key}={value})")
    fields = {ours: type(getattr(GPTConfig(), ours))(hf_config[hf]) for hf, ours in _CONFIG_KEYS.items()
              if hf_config.get(hf) is not None}
    d_model = fields.get("d_model", GPTConfig().d_model)
    fields["d_ff"] = int(hf_config.get("n_inner") or 4 * d_model)  # n_inner null = 4 * n_embd
    resid, embd = hf_config.get("resid_pdrop"), hf_config.get("embd_pdrop")
    if resid is not None and embd is not None and resid != embd:
        logging.warning("%s: embd_pdrop=%s differs from resid_pdrop=%s; our GPT uses one rate (resid_pdrop) for both",
                        source, embd, resid)
    rate = resid if resid is not None else embd
    if rate is not None:
        fields["dropout_rate"] = float(rate)
    return GPTConfig(**fields)


def gpt_config_to_hf(config: GPTConfig) -> dict:
    """GPTConfig -> a config.json dict transformers reads as this model. GPT-2's BOS/EOS id 50256
    (<|endoftext|>) is written only for its 50,257-token vocabulary."""
    if not config.use_bias:
        raise ValueError("GPTConfig.use_bias=False has no GPT2LMHeadModel equivalent (GPT-2 always has biases); "
                         "export a model trained with use_bias=True")
    hf = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
          **{key: getattr(config, ours) for key, ours in _CONFIG_KEYS.items()},
          "n_inner": config.d_ff, "resid_pdrop": config.dropout_rate, "embd_pdrop": config.dropout_rate,
          "scale_attn_weights": True, "tie_word_embeddings": True}
    if config.vocab_size == 50257:
        hf.update(bos_token_id=50256, eos_token_id=50256)
    return hf


# ---------------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------------
def _to_linear_layout(state_dict: Mapping[str, Any], config: GPTConfig, source: str) -> dict[str, np.ndarray]:
    """HF names -> unprefixed names in the Linear [out, in] layout, c_attn split into its thirds."""
    sd = {(k[len(PREFIX):] if k.startswith(PREFIX) else k): np.asarray(v) for k, v in state_dict.items()
          if not k.endswith(_BUFFERS)}
    lm_head = sd.pop("lm_head.weight", None)
    if lm_head is not None and "wte.weight" in sd and not np.array_equal(lm_head, sd["wte.weight"]):
        raise ModelInputError(f"{source}: lm_head.weight differs from transformer.wte.weight; our GPT ties the "
                              "output layer to the token embedding (give a GPT-2 checkpoint with tied embeddings)")
    d = config.d_model
    for i in range(config.num_layers):
        for kind in ("weight", "bias"):
            fused = sd.pop(f"h.{i}.attn.c_attn.{kind}", None)
            if fused is None:
                continue  # place_tensor names the missing thirds
            if fused.shape[-1] != 3 * d:
                raise ModelInputError(f"{source}: tensor 'h.{i}.attn.c_attn.{kind}' has shape {list(fused.shape)}, "
                                      f"config.json implies a last axis of 3 * n_embd = {3 * d} (config and weights "
                                      "disagree)")
            for part, third in zip(QKV, np.split(fused, 3, axis=-1)):
                sd[f"h.{i}.attn.c_attn.{part}.{kind}"] = third.T if kind == "weight" else third
        for name in _CONV1D:
            if f"h.{i}.{name}" in sd:
                sd[f"h.{i}.{name}"] = sd[f"h.{i}.{name}"].T
    return sd


def gpt_params_from_hf(state_dict: Mapping[str, Any], config: GPTConfig, *, source: str = "the checkpoint") -> dict:
    """HF name -> array (GPT2LMHeadModel or GPT2Model naming) -> the `params` of models.gpt.GPT."""
    sd = _to_linear_layout(state_dict, config, source)
    params: dict = {}
    for name, path, layout, shape in _layout(config):
        place_tensor(params, sd, name, path, layout, shape, config, source=source,
                     missing_hint=f"is it a GPT-2 checkpoint with {config.num_layers} layers? check config.json")
    unused = sorted(set(sd) - {name for name, *_ in _layout(config)})
    if unused:
        logging.warning("%s: %d tensors are not part of GPT2LMHeadModel and were ignored: %s",
                        source, len(unused), ", ".join(unused[:5]))
    return to_qkv_layout(params, config.fused_qkv)  # the layout the model asks for


def hf_state_dict_from_gpt(params: dict, config: GPTConfig) -> dict[str, np.ndarray]:
    """Our params -> GPT2LMHeadModel's tensors as transformers saves them ('transformer.' names, Conv1D
    [in, out] weights, fused c_attn, no lm_head: it is tied), contiguous float32."""
    params = flax.core.meta.unbox(params)  # accept trees straight from model.init (nn.Partitioned boxes)
    params = hf_layout(params)  # a scanned run's stacked layers, one per HF layer; fused qkv split
    linear = {}
    for name, path, layout, _ in _layout(config):
        linear[name] = take_tensor(params, path, layout, config)
    for i in range(config.num_layers):
        for kind in ("weight", "bias"):
            thirds = [linear.pop(f"h.{i}.attn.c_attn.{part}.{kind}") for part in QKV]
            linear[f"h.{i}.attn.c_attn.{kind}"] = np.concatenate(
                [t.T for t in thirds] if kind == "weight" else thirds, axis=-1)
        for name in _CONV1D:
            linear[f"h.{i}.{name}"] = linear[f"h.{i}.{name}"].T
    return {PREFIX + name: np.ascontiguousarray(array) for name, array in linear.items()}


# ---------------------------------------------------------------------------------------------
# Directories
# ---------------------------------------------------------------------------------------------
def load_hf_gpt2(directory: str) -> tuple[GPTConfig, dict]:
    """A Hugging Face GPT-2 directory (config.json + model.safetensors or pytorch_model.bin) ->
    (GPTConfig, our params as numpy arrays)."""
    directory = os.path.expanduser(directory)
    hf_config, config_path = read_hf_config(directory, "gpt2", "GPT-2")
    state_dict, weights_path = read_weights(directory)
    config = hf_config_to_gpt(hf_config, source=config_path)
    return config, gpt_params_from_hf(state_dict, config, source=weights_path)


def save_hf_gpt2(directory: str, params: dict, config: GPTConfig, *, tokenizer_file: str | None = None,
                 special_tokens: Mapping[str, str] | None = None) -> None:
    """Export as a directory transformers' GPT2LMHeadModel.from_pretrained loads. Written to a temporary
    directory and renamed into place; an existing directory is replaced only if it is a previous export.
    tokenizer_file: a tokenizer.json, copied with a tokenizer_config.json naming `special_tokens`
    (eos_token, ...), so that AutoTokenizer loads the directory; config.json's bos/eos ids are then the tokenizer's."""
    directory = check_export_target(directory)
    hf_config, writer = gpt_config_to_hf(config), None
    if tokenizer_file is not None:
        writer, ids = tokenizer_json_writer(tokenizer_file, config.vocab_size, config.n_positions,
                                            special_tokens or {})
        hf_config.update({f"{name}_id": ids[name] for name in ("bos_token", "eos_token") if name in ids})
    write_export(directory, hf_config, hf_state_dict_from_gpt(params, config), writer)
