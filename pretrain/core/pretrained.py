"""Where fine-tuning starts from: a pretrain.train workdir (Orbax) or a Hugging Face directory.

`load_pretrained(path)` returns the family (bert | t5 | gpt), its architecture, the parameters the
fine-tuning model starts from (BERT: the `bert` encoder subtree; T5 and GPT: the whole model) and the
tokenizer that goes with them, so that `--config.init=PATH` is all a user has to give. Generation,
perplexity and few-shot evaluation (pretrain/lm/) load their model the same way.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np

from models import stack
from pretrain.core import checkpoints, storage
from pretrain.core.errors import UserError


@dataclasses.dataclass
class Pretrained:
    family: str                    # config.model.name of the checkpoint: 'bert' | 't5' | 'gpt'
    model: dict[str, Any]          # the family's config fields (architecture only)
    params: dict                   # BERT: the `bert` subtree (embeddings, layer_i, pooler); T5, GPT: all;
                                   # looped or scanned layers as stored (models.stack.to_layout converts)
    tokenizer: dict[str, Any]      # kind, path, lowercase (, extra_ids)
    source: str                    # 'orbax:<dir>/<step>' or 'huggingface:<dir>'


ARCHITECTURE_KEYS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "layer_norm_eps")
# Training-time fields the fine-tuning config sets itself rather than inheriting.
NOT_ARCHITECTURE = ("name", "dropout_rate", "attention_dropout_rate", "dtype", "param_dtype", "attention",
                    "scan_layers", "remat", "peft")  # peft: the fine-tuning config's own (config.peft)
FAMILIES = ("bert", "t5", "gpt")


def _hf_model_type(path: str) -> str | None:
    config = os.path.join(path, "config.json")
    if not storage.isfile(config):
        return None
    return json.loads(storage.read_text(config)).get("model_type")


def _load_hf(path: str, model_type: str) -> Pretrained:
    if model_type == "gpt2":
        from models.convert.hf_gpt2 import load_hf_gpt2
        config, params = load_hf_gpt2(path)
        model = {k: v for k, v in dataclasses.asdict(config).items() if k not in NOT_ARCHITECTURE}
        # GPT-2's byte-level BPE: vocab.json + merges.txt in the same directory, cased.
        return Pretrained("gpt", model, params, dict(kind="gpt2_bpe", path=path, lowercase=False),
                          f"huggingface:{path}")
    if model_type == "t5":
        from models.convert.hf_t5 import load_hf_t5
        config, params = load_hf_t5(path)
        model = {k: v for k, v in dataclasses.asdict(config).items() if k not in NOT_ARCHITECTURE}
        # T5's SentencePiece model (spiece.model) plus the 100 sentinels <extra_id_*>, cased.
        tokenizer = dict(kind="sentencepiece", path=os.path.join(path, "spiece.model"), lowercase=False,
                         extra_ids=100)
        return Pretrained("t5", model, params, tokenizer, f"huggingface:{path}")
    from models.convert import load_hf_bert
    config, params = load_hf_bert(path)
    lowercase = True
    tokenizer_config = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(tokenizer_config):
        with open(tokenizer_config) as f:
            lowercase = bool(json.load(f).get("do_lower_case", True))
    model = {k: getattr(config, k) for k in ARCHITECTURE_KEYS}
    return Pretrained("bert", model, params["bert"], dict(kind="wordpiece", path=path, lowercase=lowercase),
                      f"huggingface:{path}")


def _find_workdir(path: str, flag: str) -> tuple[str, str]:
    """path = a workdir, its checkpoints/ folder, or one step folder -> (workdir, checkpoint path)."""
    for workdir, ckpt in ((path, os.path.join(path, "checkpoints")),
                          (os.path.dirname(path), path),
                          (os.path.dirname(os.path.dirname(path)), path)):
        if storage.isfile(os.path.join(workdir, "config.json")) and storage.isdir(ckpt):
            return workdir, ckpt
    raise UserError(f"{flag}={path} is neither a pretrain.train workdir (config.json + checkpoints/) "
                    "nor a Hugging Face BERT, T5 or GPT-2 directory (config.json + model.safetensors or "
                    "pytorch_model.bin)")


def load_pretrained(path: str, flag: str = "--config.init") -> Pretrained:
    """`flag`: how the user gave `path`, for error messages."""
    if storage.is_url(path):  # a pretrain.train workdir in a bucket (gs://...)
        storage.check_url(path, flag)
    path = storage.absolute(os.path.expanduser(path))
    if not storage.exists(path):
        raise UserError(f"{flag}={path} does not exist (give a pretrain.train workdir or a "
                        "Hugging Face BERT, T5 or GPT-2 directory)")
    model_type = _hf_model_type(path)
    if model_type is not None:
        if storage.is_url(path):
            raise UserError(f"{flag}={path}: a Hugging Face directory is read from a local path; copy it "
                            "(gcloud storage cp -r) and give the copy")
        return _load_hf(path, model_type)

    workdir, ckpt = _find_workdir(path, flag)
    config = json.loads(storage.read_text(os.path.join(workdir, "config.json")))
    family = config.get("model", {}).get("name")
    if family not in FAMILIES:
        raise UserError(f"{flag}={path}: its config.json names model {family!r}; "
                        f"a pretrained model is one of {FAMILIES}")
    params, step = checkpoints.restore_params(ckpt)
    # A relative tokenizer path is relative to where pretraining ran; --config.tokenizer.path overrides it.
    tokenizer = dict(config["tokenizer"])
    if family == "bert":
        model, params = {k: config["model"][k] for k in ARCHITECTURE_KEYS}, params["bert"]
    else:
        model = {k: v for k, v in config["model"].items() if k not in NOT_ARCHITECTURE}
    return Pretrained(family, model, params, tokenizer, f"orbax:{ckpt}/{step}")


def merge_params(params: dict, pretrained_params: dict, source: str, prefix: str = "") -> tuple[dict, list[str]]:
    """Pretrained weights into a fresh parameter tree (shapes must agree) -> (params, fresh names).

    Every leaf of `params` found at the same path in `pretrained_params` is replaced; the others
    (a new task head) keep their random init and are listed as fresh.
    """
    fresh = []
    pretrained_params = stack.to_layout(pretrained_params, scan=stack.is_scanned(params))  # either layout loads

    def take(path, current):
        node = pretrained_params
        for key in path:
            node = node.get(key.key) if isinstance(node, dict) else None
        name = prefix + "/".join(str(k.key) for k in path)
        if node is None:
            fresh.append(name)
            return current
        if tuple(np.shape(node)) != tuple(current.shape):
            raise UserError(f"{source}: {name} has shape {tuple(np.shape(node))}, the model wants "
                            f"{tuple(current.shape)}")
        return np.asarray(node, current.dtype)

    return jax.tree_util.tree_map_with_path(take, jax.device_get(params)), fresh
