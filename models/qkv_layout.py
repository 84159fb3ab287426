"""Self-attention's query, key and value projections as three Dense layers or as one fused `qkv`.

`model.fused_qkv=False` (the default) keeps `query`, `key`, `value`, each kernel [D, H, K] (bias [H, K]), as
Hugging Face's BERT and T5 name them. `fused_qkv=True` holds them in one Dense `qkv`, kernel [D, 3, H, K]
(logical axes ("embed", None, "heads", "kv"), bias [3, H, K]), one matmul instead of three (GPT-2's c_attn,
nanoGPT). LoRA's per-projection updates keep their targets' names inside it: `query/lora_a` becomes
`qkv/query/lora_a`, the same arrays. `fuse_qkv` / `split_qkv` turn one layout into the other on any pytree
(params, optimizer state, looped or scanned layers), so checkpoints of either load in both. Cross-attention
(T5's decoder reading the encoder) is never fused: its keys and values read another sequence.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from models.stack import is_box, map_dicts, to_layout

FUSED = "qkv"
PARTS = ("query", "key", "value")   # qkv's slices, in order, on the axis after the input's
UNFUSED = ("cross_attention",)      # attention modules whose projections stay separate
LORA = ("lora_a", "lora_b")         # a projection's LoRA pair (models/peft/lora.py low_rank_update)


def fuse_qkv(tree: Any) -> Any:
    """Any pytree whose attention nodes hold `query`, `key`, `value` -> the same with one `qkv` each."""
    def convert(node: dict) -> dict:
        return {k: _fused(v) if k not in UNFUSED and _is_unfused(v) else v for k, v in node.items()}
    return map_dicts(tree, convert)


def split_qkv(tree: Any) -> Any:
    """The inverse of `fuse_qkv`: each `qkv` -> `query`, `key`, `value`."""
    def convert(node: dict) -> dict:
        if FUSED not in node:
            return node
        return {**{k: v for k, v in node.items() if k != FUSED}, **_split(node[FUSED])}
    return map_dicts(tree, convert)


def is_fused(tree: Any) -> bool:
    found = []
    map_dicts(tree, lambda node: found.append(FUSED in node) or node)
    return any(found)


def to_qkv_layout(tree: Any, fused: bool) -> Any:
    """Parameters (or any state tree) in either layout -> the layout `fused` asks for (each function leaves a
    tree already in its layout as it is)."""
    return fuse_qkv(tree) if fused else split_qkv(tree)


def hf_layout(tree: Any) -> Any:
    """The layout the Hugging Face converters read and write: looped layers, separate query/key/value."""
    return split_qkv(to_layout(tree, scan=False))


def _is_unfused(node: Any) -> bool:
    return isinstance(node, dict) and all(isinstance(node.get(p), dict) and "kernel" in node[p] for p in PARTS)


def _fused(attention: dict) -> dict:
    """{query, key, value, ...} -> {qkv, ...}: kernels and biases stacked, LoRA pairs kept per part."""
    weights = [{k: v for k, v in attention[p].items() if k not in LORA} for p in PARTS]
    qkv = jax.tree.map(_stack_parts, *weights, is_leaf=is_box)
    qkv.update({p: lora for p in PARTS if (lora := {k: v for k, v in attention[p].items() if k in LORA})})
    return {**{k: v for k, v in attention.items() if k not in PARTS}, FUSED: qkv}


def _split(qkv: dict) -> dict:
    weights = {k: v for k, v in qkv.items() if k not in PARTS}
    return {p: {**jax.tree.map(lambda leaf: _take_part(leaf, i), weights, is_leaf=is_box), **qkv.get(p, {})}
            for i, p in enumerate(PARTS)}


# The parts axis sits before the last two (heads, head dim): [.., D, 3, H, K] and [.., 3, H, K], whatever
# comes first (a scanned stack's [n]).
def _stack_parts(*leaves):
    if is_box(leaves[0]):
        names = leaves[0].names
        return leaves[0].replace(value=_stack_parts(*(leaf.value for leaf in leaves)),
                                 names=(*names[:-2], None, *names[-2:]))
    if not hasattr(leaves[0], "shape"):  # a placeholder (optax's MaskedNode for a frozen weight): one stands for all
        return leaves[0]
    return np.stack([np.asarray(leaf) for leaf in leaves], axis=-3)


def _take_part(leaf, i: int):
    if is_box(leaf):
        return leaf.replace(value=_take_part(leaf.value, i), names=(*leaf.names[:-3], *leaf.names[-2:]))
    if not hasattr(leaf, "shape"):
        return leaf
    return np.asarray(leaf)[..., i, :, :]
