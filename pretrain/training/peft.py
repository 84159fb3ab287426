"""Parameter-efficient fine-tuning on the training side: what trains, what is stored, how a run loads again.

The methods themselves are modules (models/peft/); here `config.peft` becomes their PeftConfig, and:
- only the PEFT parameters, the new task head and (adapters, as Houlsby et al. 2019 train them) the layer
  norms train: the others are held with `stop_gradient` (no weight gradient is computed for them) and get
  no optimizer state (`optax.multi_transform` with `set_to_zero`), so they stay bitwise unchanged;
- the fine-tuning checkpoint stores only the trained parameters, with a reference to the base checkpoint
  (its path and a fingerprint of its weights) in the checkpoint's data item;
- `restore_full_params` rebuilds the whole tree: the base from its path, checked against the fingerprint,
  then the stored parameters over it (pretrain.evaluate, and the end of pretrain.finetune).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable

import flax
import jax
import ml_collections
import numpy as np
import optax

import models
from models import peft as peft_modules
from pretrain.runtime.errors import ConfigError, UserError
from pretrain.training import freezing, pretrained
from pretrain.workdir import checkpoints, storage


def is_peft(config: ml_collections.ConfigDict | dict) -> bool:
    """Whether a (fine-tuning) config trains a PEFT method."""
    return config.get("peft", {}).get("method", "none") != "none"


def peft_config(config: ml_collections.ConfigDict | dict) -> peft_modules.PeftConfig:
    """config.peft -> the models' PeftConfig (peft.NONE when absent or method 'none'); bad values are one line."""
    if not is_peft(config):
        return peft_modules.NONE
    p = config["peft"]
    targets = tuple(t.strip() for t in p.lora.targets.split(",") if t.strip())
    try:
        return peft_modules.PeftConfig(
            method=p.method, adapter_size=p.adapters.size, adapter_placement=p.adapters.placement,
            lora_rank=p.lora.rank, lora_alpha=float(p.lora.alpha), lora_dropout=float(p.lora.dropout),
            lora_targets=targets, prefix_length=p.prefix.length, prefix_hidden_size=p.prefix.hidden_size,
            prompt_length=p.prompt.length)
    except ValueError as e:  # models.errors.ModelInputError names the field
        raise ConfigError(f"config.{e}") from None


def method_of(config: ml_collections.ConfigDict) -> peft_modules.PeftMethod:
    """The registered PEFT method config.peft.method names (models/peft/methods.py): what it does, as attributes."""
    return peft_modules.PEFT_METHODS.get(peft_config(config).method)


def trainable(params: Any, family: str, config: ml_collections.ConfigDict) -> Any:
    """-> a tree of bools like `params`: the PEFT parameters, the task head (every top-level subtree but the
    pretrained body) and, for adapters with train_norms, the layer norms. A family without a body in the table
    (T5: text to text) is its whole tree pretrained, with no head."""
    norms = method_of(config).trains_norms and config.peft.adapters.train_norms
    has_head = models.family(family).body is not None

    def trains(path, _) -> bool:
        names = freezing.path_names(path)
        if peft_modules.is_peft_path(names):
            return True
        if has_head and freezing.body(names[0]) is None:
            return True
        return norms and any(name.endswith("norm") for name in names)

    return jax.tree_util.tree_map_with_path(trains, params)


def unfreeze_steps(mask: Any) -> Any:
    """The freezing module's view (pretrain/training/freezing.py): 0 = trains, NEVER = frozen."""
    return jax.tree.map(lambda t: 0 if t else freezing.NEVER, mask)


def optimizer(tx: optax.GradientTransformation, mask: Any) -> optax.GradientTransformation:
    """`tx` on the trained parameters only; the frozen ones get a zero update and no optimizer state."""
    labels = jax.tree.map(lambda t: "train" if t else "frozen", mask)
    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def hold_frozen(apply_fn: Callable, mask: Any) -> Callable:
    """apply_fn with stop_gradient on the frozen parameters: their weight gradients are never computed."""
    def apply(variables, *args, **kwargs):
        params = jax.tree.map(lambda t, p: p if t else jax.lax.stop_gradient(p), mask, variables["params"])
        return apply_fn({**variables, "params": params}, *args, **kwargs)
    return apply


VOCABULARY_TABLES = (("embeddings", "word_embeddings"), ("token_embedding",), ("shared",))  # BERT, GPT, T5


def settle_pretrained(config, params: dict, fresh: list[str]) -> tuple[dict, list[str]]:
    """Pretrained weights just filled a fresh model: PEFT's own weights are not reported as fresh (new by design,
    as the head), and prompt tuning's prompt starts from vocabulary embeddings with config.peft.prompt.init=vocab."""
    fresh = [name for name in fresh if not peft_modules.is_peft_path(name.split("/"))]
    if method_of(config).prompt_from_vocabulary and config.peft.prompt.init == "vocab":
        params = prompt_from_vocabulary(params, config.seed)
    return params, fresh


def prompt_from_vocabulary(params: dict, seed: int) -> dict:
    """Prompt tuning's embeddings replaced by copies of distinct vocabulary entries drawn with `seed`
    (Lester et al. 2021, Section 3; peft's SAMPLE_VOCAB). The vocabulary is the model's own table."""
    def find(tree, names):
        for name in names:
            tree = tree[name]
        return tree
    # the fine-tuning body (the family's, models/families.py), or T5's whole tree
    body = next((params[key] for key in params if freezing.body(key) is not None), params)
    vocabulary = next(find(body, names) for names in VOCABULARY_TABLES if names[0] in body)["embedding"]
    prompt = body["prompt"]["embedding"]
    value = getattr(prompt, "value", prompt)  # an nn.Partitioned box or an array
    rows = peft_modules.sample_vocabulary(np.asarray(getattr(vocabulary, "value", vocabulary)), value.shape[0], seed)
    new = np.asarray(rows, value.dtype)
    body["prompt"]["embedding"] = prompt.replace(value=new) if hasattr(prompt, "replace") else new
    return params


# ---------------------------------------------------------------------------------------------
# What is stored, and how it loads again
# ---------------------------------------------------------------------------------------------
def fingerprint(params: Any) -> str:
    """A short hash of a parameter tree: every leaf's path, shape, dtype and up to 4096 evenly spaced values
    (enough to tell checkpoints apart without reading every weight of a large model twice)."""
    digest = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        array = np.asarray(leaf)
        flat = array.reshape(-1)
        sample = flat[:: max(1, flat.size // 4096)][:4096]
        digest.update(f"{jax.tree_util.keystr(path)}{array.shape}{array.dtype}".encode())
        digest.update(np.ascontiguousarray(sample).tobytes())
    return digest.hexdigest()[:16]


def stored_part(params: Any, mask: Any) -> dict:
    """The trained leaves only, in their nested dicts (what a PEFT checkpoint holds)."""
    def keep(tree, keep_mask):
        if isinstance(tree, dict):
            kept = {k: keep(v, keep_mask[k]) for k, v in tree.items()}
            return {k: v for k, v in kept.items() if v is not None}
        return tree if keep_mask else None
    return keep(params, mask) or {}


def overlay(params: Any, part: dict) -> Any:
    """`params` with every leaf that `part` holds replaced by it (the inverse of stored_part)."""
    if not isinstance(part, dict):
        return part
    missing = [k for k in part if k not in params]
    if missing:
        raise UserError(f"the PEFT checkpoint holds {missing[0]!r}, which the model does not have: it was written "
                        "by another PEFT method or architecture")
    return {k: overlay(v, part[k]) if k in part else v for k, v in params.items()}


def base_reference(config: ml_collections.ConfigDict, base_params: Any, source: str) -> dict:
    """The checkpoint's record of its base: where it is and what its weights hash to."""
    return {"init": config.init, "source": source, "fingerprint": fingerprint(base_params)}


def check_base(reference: dict, base_params: Any, where: str) -> None:
    found = fingerprint(base_params)
    if found != reference.get("fingerprint"):
        raise UserError(f"{where} was fine-tuned from {reference.get('source')} (fingerprint "
                        f"{reference.get('fingerprint')}), but the base found at {reference.get('init')} has "
                        f"fingerprint {found}: give the checkpoint it was trained from")


def read_reference(directory: str, step: int) -> dict:
    """The base reference stored with a PEFT checkpoint (one line if there is none)."""
    data = checkpoints.restore_data(directory, step)
    if not isinstance(data, dict) or "peft_base" not in data:
        raise UserError(f"{directory}/{step} holds no PEFT base reference: it was not written by a PEFT run")
    return data["peft_base"]


def peft_workdir(path: str) -> ml_collections.ConfigDict | None:
    """The config of a pretrain.finetune workdir that trained a PEFT method; None for anything else."""
    config_path = os.path.join(path, "config.json")
    if not storage.isfile(config_path):
        return None
    stored = json.loads(storage.read_text(config_path))
    if not isinstance(stored, dict) or "task" not in stored or not is_peft(stored):
        return None
    return ml_collections.ConfigDict(stored)


def load_stored(workdir: str, step: int | None = None) -> tuple[dict, pretrained.Pretrained, int]:
    """A PEFT workdir's best checkpoint (or `step`) -> (its stored parameters, the base it names, fingerprint
    checked, the step)."""
    directory = os.path.join(workdir, "checkpoints")
    part, step = checkpoints.restore_params(directory, step)
    return part, load_base(directory, step), step


def load_base(directory: str, step: int) -> pretrained.Pretrained:
    """The base a PEFT checkpoint (checkpoints/ folder, step) names, checked against its fingerprint."""
    reference = read_reference(directory, step)
    init = pretrained.load_pretrained(reference["init"], flag=f"the base of {directory}/{step}")
    check_base(reference, init.params, f"{directory}/{step}")
    return init


def rebuild(model, example: dict, part: dict, init: pretrained.Pretrained, merge: Callable) -> dict:
    """The whole parameter tree of a PEFT model: a blank tree of its shapes (from `example`, [1, ...] inputs),
    the base weights in it (`merge(blank, init) -> (params, fresh)`: a family's merge_pretrained), the stored
    trained weights over both."""
    abstract = flax.core.meta.unbox(jax.eval_shape(
        lambda: model.init(jax.random.key(0), **example, deterministic=True)["params"]))
    blank = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), abstract)
    merged, _ = merge(blank, init)
    return overlay(merged, part)

