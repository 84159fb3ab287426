"""Where fine-tuning starts from: a pretrain.train workdir (Orbax) or a Hugging Face directory.

`load_pretrained(path)` returns the family (bert | t5 | gpt), its architecture, the parameters the
fine-tuning model starts from (BERT: the `bert` encoder subtree; T5 and GPT: the whole model) and the
tokenizer that goes with them, so that `--config.init=PATH` is all a user has to give. Generation,
perplexity and few-shot evaluation (pretrain/lm/) load their model the same way. What differs per family
(the subtree and the fields it inherits) is its registration in models/families.py (FAMILIES), and the
Hugging Face directories it loads (their loaders and tokenizers, by config.json's model_type) are
HF_CHECKPOINTS'. `resolve_config` merges an init's architecture and tokenizer into a fine-tuning config.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
import numpy as np

import models
from models import qkv_layout, stack
from pretrain.runtime.errors import UserError
from pretrain.workdir import checkpoints, storage


@dataclasses.dataclass
class Pretrained:
    family: str                    # config.model.name of the checkpoint: 'bert' | 't5' | 'gpt'
    model: dict[str, Any]          # the family's config fields (architecture only)
    params: dict                   # BERT: the `bert` subtree (embeddings, layer_i, pooler); T5, GPT: all;
                                   # looped or scanned layers, fused qkv or not, as stored (models.stack.to_layout
                                   # and models.qkv_layout.to_qkv_layout convert)
    tokenizer: dict[str, Any]      # kind, path, lowercase (, extra_ids)
    source: str                    # 'orbax:<dir>/<step>' or 'huggingface:<dir>'


# Training-time fields the fine-tuning config sets itself rather than inheriting (a family that names its
# architecture_keys in models/families.py inherits those instead).
NOT_ARCHITECTURE = ("name", "dropout_rate", "attention_dropout_rate", "dtype", "param_dtype", "attention",
                    "scan_layers", "fused_qkv", "remat", "peft")  # peft: the fine-tuning config's own (config.peft)


def hf_model_type(path: str) -> str | None:
    """config.json's model_type where `path` is a Hugging Face directory, else None."""
    config = os.path.join(path, "config.json")
    if not storage.isfile(config):
        return None
    return json.loads(storage.read_text(config)).get("model_type")


def _hf_directories() -> str:
    """'a Hugging Face BERT, T5 or GPT-2 directory', from the registered checkpoints."""
    titles = [checkpoint.title for _, checkpoint in models.families.HF_CHECKPOINTS.items()]
    listed = f"{', '.join(titles[:-1])} or {titles[-1]}" if len(titles) > 1 else "".join(titles)
    return f"a Hugging Face {listed} directory"


def _inherited(family: models.ModelFamily, model: dict[str, Any], params: dict, heads: bool = False
               ) -> tuple[dict, dict]:
    """A checkpoint's config.model fields and params -> what fine-tuning starts from (see ModelFamily): the
    params at the "a/b" path params_subtree, or with `heads` at its parent (BERT's encoder with its pretraining
    heads: what a distillation teacher is, pretrain/distillation/teacher.py)."""
    if family.finetuned_config is not None:  # the architecture of the part that fine-tunes (a distilled student)
        model = dataclasses.asdict(getattr(models.model_config(model), family.finetuned_config)())
    if family.architecture_keys is not None:
        # a key a checkpoint's config.json lacks (a run from before the field existed) keeps the field's default
        model = {k: model[k] for k in family.architecture_keys if k in model}
    else:
        model = {k: v for k, v in model.items() if k not in NOT_ARCHITECTURE}
    path = family.params_subtree.split("/") if family.params_subtree else []
    for key in path[:-1] if heads else path:
        params = params[key]
    return model, params


def _load_hf(path: str, model_type: str, heads: bool = False) -> Pretrained:
    found = models.families.hf_checkpoint(model_type)
    if found is None:
        known = ", ".join(map(repr, models.families.HF_CHECKPOINTS.names()))
        raise UserError(f"{os.path.join(path, 'config.json')}: model_type={model_type!r} is not one this project "
                        f"loads ({known}); give {_hf_directories()}")
    family, checkpoint = found
    config, params = models.registry.resolve(checkpoint.loader)(path)
    model, params = _inherited(family, dataclasses.asdict(config), params, heads)
    return Pretrained(family.finetunes_as or family.name, model, params, checkpoint.tokenizer(path), f"huggingface:{path}")


def find_workdir(path: str, flag: str) -> tuple[str, str]:
    """path = a workdir, its checkpoints/ folder, or one step folder -> (workdir, checkpoint path)."""
    for workdir, ckpt in ((path, os.path.join(path, "checkpoints")),
                          (os.path.dirname(path), path),
                          (os.path.dirname(os.path.dirname(path)), path)):
        if storage.isfile(os.path.join(workdir, "config.json")) and storage.isdir(ckpt):
            return workdir, ckpt
    raise UserError(f"{flag}={path} is neither a pretrain.train workdir (config.json + checkpoints/) "
                    f"nor {_hf_directories()} (config.json + model.safetensors or pytorch_model.bin)")


def family_of(path: str, flag: str = "--config.init") -> str:
    """The model family a workdir or Hugging Face directory holds (config.json's model.name, or the family that loads
    its model_type; the model_type itself where none does), without reading any weight."""
    path = os.path.expanduser(path)
    model_type = hf_model_type(path)
    if model_type is not None:
        found = models.families.hf_checkpoint(model_type)
        return found[0].name if found else model_type
    workdir = path if storage.isfile(os.path.join(path, "config.json")) else find_workdir(path, flag)[0]
    config = json.loads(storage.read_text(os.path.join(workdir, "config.json")))  # find_workdir: one line if neither
    return config.get("model", {}).get("name") or ""


def load_pretrained(path: str, flag: str = "--config.init", heads: bool = False) -> Pretrained:
    """`flag`: how the user gave `path`, for error messages. `heads`: params with the pretraining heads beside
    the encoder (BERT: {bert, mlm_head(, nsp_head)}, the heads only where the checkpoint has them)."""
    if storage.is_url(path):  # a pretrain.train workdir in a bucket (gs://...)
        storage.check_url(path, flag)
    path = storage.absolute(os.path.expanduser(path))
    if not storage.exists(path):
        raise UserError(f"{flag}={path} does not exist (give a pretrain.train workdir or {_hf_directories()})")
    model_type = hf_model_type(path)
    if model_type is not None:
        local = storage.local_copy(path, "hf_init_") if storage.is_url(path) else path
        return dataclasses.replace(_load_hf(local, model_type, heads), source=f"huggingface:{path}")

    workdir, ckpt = find_workdir(path, flag)
    config = json.loads(storage.read_text(os.path.join(workdir, "config.json")))
    name = config.get("model", {}).get("name")
    if name not in models.FAMILIES:
        raise UserError(f"{flag}={path}: its config.json names model {name!r}; "
                        f"a pretrained model is one of {tuple(models.FAMILIES)}")
    params, step = checkpoints.restore_params(ckpt)
    # A relative tokenizer path is relative to where pretraining ran; --config.tokenizer.path overrides it.
    tokenizer = dict(config["tokenizer"])
    family = models.family(name)
    model, params = _inherited(family, config["model"], params, heads)
    return Pretrained(family.finetunes_as or name, model, params, tokenizer, f"orbax:{ckpt}/{step}")


def resolve_config(config: ml_collections.ConfigDict, model_flags: Mapping[str, Any] | None = None,
                   ) -> tuple[ml_collections.ConfigDict, Pretrained | None]:
    """The architecture and tokenizer of `config.init` replace the config's defaults; model_flags, the
    --config.model.KEY=VALUE flags given (the head's pooling, dropout, dtype: as from_pretrained's keyword
    arguments), replace the init's. Returns the init whose weights to load: None with config.init_weights=random
    (the same architecture from fresh weights)."""
    config = copy.deepcopy(config)
    config.unlock()
    init = load_pretrained(config.init) if config.init else None
    if init is not None:
        if init.family != config.model.name:
            raise UserError(f"--config.init={config.init} holds a {init.family} model but the config fine-tunes "
                            f"{config.model.name}: use configs/glue.py:task={config.task},model={init.family}")
        config.model.update(init.model)
        config.model.update(model_flags or {})
        if not config.tokenizer.path:
            config.tokenizer.update(init.tokenizer)
    if not config.tokenizer.path:
        raise UserError("no tokenizer: give --config.init (a checkpoint with its tokenizer) or "
                        "--config.tokenizer.path")
    if config.get("init_weights") == "random":
        return config, None
    return config, init


def merge_params(params: dict, pretrained_params: dict, source: str, prefix: str = "") -> tuple[dict, list[str]]:
    """Pretrained weights into a fresh parameter tree (shapes must agree) -> (params, fresh names).

    Every leaf of `params` found at the same path in `pretrained_params` is replaced; the others
    (a new task head) keep their random init and are listed as fresh.
    """
    fresh = []
    # either layout loads: looped or scanned layers, separate or fused query/key/value
    pretrained_params = stack.to_layout(pretrained_params, scan=stack.is_scanned(params))
    pretrained_params = qkv_layout.to_qkv_layout(pretrained_params, fused=qkv_layout.is_fused(params))

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
