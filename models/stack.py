"""A stack of identical Transformer layers, looped or scanned, with optional rematerialization.

`model.scan_layers=False` (the default) applies `layer_0 .. layer_{n-1}`, one module each, as Hugging
Face's checkpoints name them. `scan_layers=True` applies one layer under `nn.scan`: its weights are
stacked into `layers` with a leading [n] axis (logical axis "layers"), so XLA compiles one layer instead
of n (the compile time of a deep model stops growing with its depth) and the loop runs on the device.
`stack_layers` / `unstack_layers` turn one layout into the other; checkpoints of either load in both. A model
whose first layers differ in structure from the rest (ModernBERT's layer 0 has no attention norm) keeps them
looped beside the scanned `layers` (`build(..., first_index=1)` for the rest): `layers` then holds the layers
after them.

`model.remat` trades compute for memory in the backward pass (jax.checkpoint), with MaxText's names:
"none" keeps every activation; "minimal" keeps the matmul outputs that have no batch dimension in
their dot (the projections' results) and recomputes the rest (norms, softmax, GELU, dropout masks);
"full" keeps only each layer's input and recomputes the whole layer. Two between them, for the fit table to
measure (docs/training.md): "minimal_activation" keeps the MLP's activation output too (GELU's erf is a long
vector computation to redo), "dots" every matmul output, attention's scores and values included.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np

from models import ops

MLP_ACTIVATION = "mlp_activation"  # the name models/layers.py's MLP gives its activation output (`mlp_activation`)
REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,
    "minimal": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "minimal_activation": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
        jax.checkpoint_policies.save_only_these_names(MLP_ACTIVATION)),
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "full": jax.checkpoint_policies.nothing_saveable,
}


def mlp_activation(h: jax.Array) -> jax.Array:
    """h as it is, named for the remat policy "minimal_activation", which keeps it for the backward pass."""
    return jax.ad_checkpoint.checkpoint_name(h, MLP_ACTIVATION)


SCANNED = "layers"           # the scanned stack's name in the parameter tree
SHARED = "shared_layer"      # the one layer of a stack whose depths share their weights
LOOPED = re.compile(r"layer_(\d+)$")


def build(layer: type[nn.Module], count: int, *, scan: bool, remat: str, static_argnums: tuple[int, ...],
          per_layer_argnums: tuple[int, ...] = (), shared: bool = False, first_index: int = 0,
          **layer_kwargs) -> Callable[..., Any]:
    """-> apply(x, *args) -> x through `count` layers `layer(**layer_kwargs)`; call `build` in the
    parent's setup (or compact method), and `apply` in its call. `static_argnums` are the positions (x = 0)
    of the layer's Python-valued arguments (deterministic, decode), on which remat specialises. Arguments at
    `per_layer_argnums` carry a leading [count] axis (or are None), and layer i gets their [i] (its own extra
    keys and values); every other argument (masks, biases, encoder states) is the same for every layer.
    shared: one set of weights, `shared_layer`, applied `count` times (ALBERT); scanned, the weights are
    broadcast to every step rather than stacked.
    A layer may return (x, extra) rather than x (BERT's internals, for distillation): the stack then returns
    (x, every layer's extra stacked on a leading [count] axis), looped or scanned alike.
    first_index: the looped layers' first number (the model builds the layers below it itself).
    """
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat={remat!r} is not one of {', '.join(REMAT_POLICIES)}")
    if remat != "none":
        # +1: nn.remat counts the module itself as argument 0
        layer = nn.remat(layer, policy=REMAT_POLICIES[remat], prevent_cse=not scan,
                         static_argnums=tuple(i + 1 for i in static_argnums))
    per_layer = {i - 1 for i in per_layer_argnums}  # positions in *args
    if shared:
        return _shared(layer, count, scan, per_layer, layer_kwargs)
    if not scan:
        modules = [layer(**layer_kwargs, name=f"layer_{first_index + i}") for i in range(count)]

        def looped(x, *args):
            x, extras = ops.split_rows(x), []  # each layer's output is the next one's input: constrained once
            for i, module in enumerate(modules):
                x, extra = _split(module(x, *(_index(a, i) if j in per_layer else a for j, a in enumerate(args))))
                x = ops.split_rows(x)
                extras.append(extra)
            return _with_extras(x, extras)
        return looped

    module = layer(**layer_kwargs, name=SCANNED)

    def body(module, carry, *args):  # (carry, broadcast arguments) -> (carry, the layer's extra or None)
        x, extra = _split(module(carry, *args))
        return ops.split_rows(x), extra

    def scanned(x, *args):
        scan = nn.scan(body, variable_axes={"params": 0, "cache": 1},  # the cache keeps its leading batch axis
                       split_rngs={"params": True, "dropout": True},
                       in_axes=tuple(0 if j in per_layer else nn.broadcast for j in range(len(args))),
                       length=count, metadata_params={nn.PARTITION_NAME: SCANNED})
        x, extras = scan(module, ops.split_rows(x), *args)
        return x if extras is None else (x, extras)
    return scanned


def _shared(layer: type[nn.Module], count: int, scan: bool, per_layer: set[int], layer_kwargs: dict
            ) -> Callable[..., Any]:
    """One module applied `count` times: a Python loop, or nn.scan with its params broadcast (one compiled
    layer; dropout still draws a new mask at every depth)."""
    module = layer(**layer_kwargs, name=SHARED)
    if not scan:
        def looped(x, *args):
            extras = []
            for i in range(count):
                x, extra = _split(module(x, *(_index(a, i) if j in per_layer else a for j, a in enumerate(args))))
                x = ops.split_rows(x)
                extras.append(extra)
            return _with_extras(x, extras)
        return looped

    def body(module, carry, *args):
        x, extra = _split(module(carry, *args))
        return ops.split_rows(x), extra

    def scanned(x, *args):
        scan = nn.scan(body, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                       in_axes=tuple(0 if j in per_layer else nn.broadcast for j in range(len(args))), length=count)
        x, extras = scan(module, ops.split_rows(x), *args)
        return x if extras is None else (x, extras)
    return scanned


def _index(arg: Any, i: int) -> Any:
    return None if arg is None else jax.tree.map(lambda leaf: leaf[i], arg)


def _split(out: Any) -> tuple[jax.Array, Any]:
    """A layer's output -> (the next layer's input, its extra or None)."""
    return out if isinstance(out, tuple) else (out, None)


def _with_extras(x: jax.Array, extras: list) -> Any:
    """The looped stack's result: x alone, or (x, the layers' extras stacked [count, ...] as nn.scan stacks them)."""
    if not extras or extras[0] is None:  # no looped layer (a one-layer model builds its first itself)
        return x
    return x, jax.tree.map(lambda *leaves: jnp.stack(leaves), *extras)


def stack_layers(tree: Any) -> Any:
    """Any pytree (params, optimizer state, a whole train state) with `layer_0 .. layer_{n-1}` siblings ->
    the same with `layers` holding their leaves stacked on a new leading axis (the scanned layout). Leading layers
    of another structure than the last one stay looped."""
    def convert(node: dict) -> dict:
        looped = sorted((int(m.group(1)), k) for k in node if (m := LOOPED.match(k)))
        if not looped:
            return node
        if [i for i, _ in looped] != list(range(len(looped))):
            raise ValueError(f"layers {[k for _, k in looped]} are not numbered 0..{len(looped) - 1}")
        structure = jax.tree.structure(node[looped[-1][1]], is_leaf=is_box)
        first = next(n for n, (_, k) in enumerate(looped) if jax.tree.structure(node[k], is_leaf=is_box) == structure)
        stacked_keys = [k for _, k in looped[first:]]
        rest = {k: v for k, v in node.items() if k not in stacked_keys}
        stacked = jax.tree.map(_stack, *[node[k] for k in stacked_keys], is_leaf=is_box)
        return {**rest, SCANNED: stacked}
    return map_dicts(tree, convert)


def unstack_layers(tree: Any) -> Any:
    """The inverse of `stack_layers`: `layers` [n, ...] -> `layer_0 .. layer_{n-1}`, numbered after any looped
    layers beside it."""
    def convert(node: dict) -> dict:
        if SCANNED not in node:
            return node
        stacked = node[SCANNED]
        count = len(nn.unbox(jax.tree.leaves(stacked, is_leaf=is_box)[0]))
        offset = sum(1 for k in node if LOOPED.match(k))
        rest = {k: v for k, v in node.items() if k != SCANNED}
        return {**rest, **{f"layer_{offset + i}": jax.tree.map(lambda leaf: _take(leaf, i), stacked, is_leaf=is_box)
                           for i in range(count)}}
    return map_dicts(tree, convert)


def is_box(x) -> bool:
    return isinstance(x, nn.Partitioned)


def _stack(*leaves):
    """Per-layer leaves -> one [n, ...] leaf; a logical-axes box gains the "layers" axis."""
    if is_box(leaves[0]):
        return leaves[0].replace(value=np.stack([np.asarray(leaf.value) for leaf in leaves]),
                                 names=(SCANNED, *leaves[0].names))
    return np.stack([np.asarray(leaf) for leaf in leaves])


def _take(leaf, i: int):
    if is_box(leaf):
        return leaf.replace(value=np.asarray(leaf.value)[i], names=leaf.names[1:])
    return np.asarray(leaf)[i]


def is_scanned(tree: Any) -> bool:
    found = []
    map_dicts(tree, lambda node: found.append(SCANNED in node) or node)
    return any(found)


def to_layout(tree: Any, scan: bool) -> Any:
    """Parameters (or any state tree) in either layout -> the layout `scan` asks for."""
    if scan == is_scanned(tree):
        return tree
    return stack_layers(tree) if scan else unstack_layers(tree)


def map_dicts(tree: Any, convert: Callable[[dict], dict]) -> Any:
    """Rebuild `tree`, applying `convert` to every dict bottom-up (through tuples, named tuples such as
    optax's states, lists and flax struct dataclasses such as TrainState)."""
    if isinstance(tree, dict) or hasattr(tree, "items") and hasattr(tree, "keys"):
        return convert({k: map_dicts(v, convert) for k, v in tree.items()})
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(map_dicts(v, convert) for v in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_dicts(v, convert) for v in tree)
    if hasattr(tree, "__dataclass_fields__") and hasattr(tree, "replace"):
        return tree.replace(**{name: map_dicts(getattr(tree, name), convert)
                               for name, field in tree.__dataclass_fields__.items()
                               if field.metadata.get("pytree_node", True)})
    return tree
