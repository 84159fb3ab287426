"""Where fine-tuning starts from: a pretrain.train workdir (Orbax) or a Hugging Face BERT directory.

`load_pretrained(path)` returns the encoder's architecture, its `bert` parameters and the tokenizer
that goes with them, so that `--config.init=PATH` is all a user has to give.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from pretrain import checkpoints
from pretrain.errors import UserError


@dataclasses.dataclass
class Pretrained:
    model: dict[str, Any]          # BertConfig fields (architecture only)
    bert_params: dict              # the `bert` subtree: embeddings, layer_i, pooler
    tokenizer: dict[str, Any]      # kind, path, lowercase
    source: str                    # 'orbax:<dir>/<step>' or 'huggingface:<dir>'


ARCHITECTURE_KEYS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "layer_norm_eps")


def _is_hf_dir(path: str) -> bool:
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return False
    with open(config) as f:
        return "model_type" in json.load(f)


def _find_workdir(path: str) -> tuple[str, str]:
    """path = a workdir, its checkpoints/ folder, or one step folder -> (workdir, checkpoint path)."""
    for workdir, ckpt in ((path, os.path.join(path, "checkpoints")),
                          (os.path.dirname(path), path),
                          (os.path.dirname(os.path.dirname(path)), path)):
        if os.path.isfile(os.path.join(workdir, "config.json")) and os.path.isdir(ckpt):
            return workdir, ckpt
    raise UserError(f"--config.init={path} is neither a pretrain.train workdir (config.json + checkpoints/) "
                    "nor a Hugging Face BERT directory (config.json + model.safetensors or pytorch_model.bin)")


def load_pretrained(path: str) -> Pretrained:
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(path):
        raise UserError(f"--config.init={path} does not exist (give a pretrain.train workdir or a "
                        "Hugging Face BERT directory)")
    if _is_hf_dir(path):
        from models.convert import load_hf_bert
        config, params = load_hf_bert(path)
        lowercase = True
        tokenizer_config = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(tokenizer_config):
            with open(tokenizer_config) as f:
                lowercase = bool(json.load(f).get("do_lower_case", True))
        model = {k: getattr(config, k) for k in ARCHITECTURE_KEYS}
        return Pretrained(model, params["bert"], dict(kind="wordpiece", path=path, lowercase=lowercase),
                          f"huggingface:{path}")

    workdir, ckpt = _find_workdir(path)
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    if config.get("model", {}).get("name") != "bert":
        raise UserError(f"--config.init={path}: only BERT encoders can be fine-tuned here "
                        f"(its config.json names model {config.get('model', {}).get('name')!r})")
    params, step = checkpoints.restore_params(ckpt)
    # A relative tokenizer path is relative to where pretraining ran; --config.tokenizer.path overrides it.
    tokenizer = dict(config["tokenizer"])
    model = {k: config["model"][k] for k in ARCHITECTURE_KEYS}
    return Pretrained(model, params["bert"], tokenizer, f"orbax:{ckpt}/{step}")
