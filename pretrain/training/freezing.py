"""Freezing strategies for fine-tuning, as optax masks: freezing the lower layers, and gradual unfreezing from
the top layer down (Howard & Ruder 2018, "Universal Language Model Fine-tuning for Text Classification", ULMFiT,
Section 3.3).

Every parameter gets the optimizer step from which it trains (`NEVER` = frozen for the whole run):

  none      everything trains from step 0
  head_only only the new task head trains; the whole pretrained encoder (pooler included) is frozen
  lowest    the embeddings (if freeze_embeddings) and the lowest `num_frozen_layers` layers are frozen
  gradual   gradual unfreezing: the head and the top layer train in epoch 0, then one more layer
            from the top down joins every `unfreeze_every_epochs` epochs, the embeddings last

A model whose layers share one set of weights (ALBERT: `shared_layer` in place of `layer_i`) has those weights
at every depth, so they train from the step the first of their layers would: under gradual with the top layer,
at step 0; under lowest only all or none of them can be frozen (num_frozen_layers 0 or num_layers, anything
between is a ConfigError). Blocks the family registers as embeddings (ALBERT's and ELECTRA's E -> H
`embeddings_project` too) freeze and thaw with the embeddings.

`freeze(tx, unfreeze_at)` zeroes the gradients of frozen parameters before `tx` (so clipping
and Adam's moments ignore them) and zeroes their updates after it (so weight decay cannot move
them either): a frozen parameter stays bitwise unchanged.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

# A fine-tuning model's top-level subtree -> the pretrained body it is (its family registers the key, the
# embedding blocks and the blocks above the top layer), or None: a new task head, which always trains.
from models.families import Body, body
from models.registry import Registry
from models.stack import LOOPED, SHARED
from pretrain.runtime.errors import ConfigError
from pretrain.training import config_keys
from pretrain.training.config_keys import BOOLEAN, NON_NEGATIVE, POSITIVE

NEVER = 2**31 - 1
StartStep = Callable[[str, Body], int]  # (a body block's name, the body) -> the step it trains from


def path_names(path) -> list[str]:
    """A tree path's dict keys, e.g. ['bert', 'layer_0', 'attention', 'query', 'kernel']."""
    return [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]


def unfreeze_steps(params: Any, config: ml_collections.ConfigDict, *, num_layers: int,
                   steps_per_epoch: int) -> Any:
    """params {'bert': {embeddings, layer_i (or shared_layer), pooler}, 'head': ...} or {'gpt': {token_embedding,
    position_embedding, layer_i, final_norm}, 'score': ...} -> same tree of int step numbers.

    config = config.freezing: strategy (one of FREEZING) and the keys it declares.
    """
    shared = any(SHARED in params[k] for k in params if body(k) is not None)
    start_of = FREEZING.get(config.strategy)(config, num_layers=num_layers, shared=shared,
                                             steps_per_epoch=steps_per_epoch)

    def start_step(path, _) -> int:
        names = path_names(path)
        pretrained = body(names[0])
        if pretrained is None:
            return 0                                   # the task head always trains
        return start_of(names[1], pretrained)

    return jax.tree_util.tree_map_with_path(start_step, params)


# A strategy: (config.freezing, num_layers=, shared=, steps_per_epoch=) -> (body block, its Body) -> first step.
# `layer_by_layer`: it freezes single layers, which a scanned stack holds as one weight (validation refuses that).
# `trains_body` (default True): False where no body weight ever trains (discriminative rates would scale nothing).
# `check` (optional): (config.freezing, num_layers=, num_epochs=, shared=) -> warnings; raises ConfigError for a
# config the strategy cannot mean. Config validation calls it before anything loads.
FREEZING = config_keys.chosen_by("freezing.strategy", Registry("freezing strategy", "config.freezing.strategy",
                                                               ConfigError))


@config_keys.declare(FREEZING, "none", {"layer_by_layer": False})
def train_everything(config, *, num_layers: int, shared: bool, steps_per_epoch: int) -> StartStep:
    """Everything trains from step 0."""
    return lambda part, pretrained: 0


@config_keys.declare(FREEZING, "head_only", {"layer_by_layer": False, "trains_body": False})
def train_the_head_only(config, *, num_layers: int, shared: bool, steps_per_epoch: int) -> StartStep:
    """Only the new task head trains; the whole pretrained body (pooler included) is frozen."""
    return lambda part, pretrained: NEVER


def _check_lowest(config, *, num_layers: int, num_epochs: int, shared: bool) -> list[str]:
    """Config validation's hook (`check`): the frozen count against the model's depth, before anything loads."""
    _check_frozen_layers(config.num_frozen_layers, num_layers, shared)
    return []


def _check_gradual(config, *, num_layers: int, num_epochs: int, shared: bool) -> list[str]:
    """Config validation's hook (`check`): a run too short to thaw the whole body (ULMFiT thaws every layer, then
    trains them together) leaves the lowest layers and the embeddings at their pretrained values; a choice, but
    rarely the one meant, so a warning."""
    every = max(1, config.get("unfreeze_every_epochs", 1))
    thawed = -(-num_epochs // every)  # blocks from the top that train at least one epoch: the ceiling
    if shared or thawed > num_layers:
        return []
    return [f"config.freezing.strategy='gradual' thaws one block every config.freezing.unfreeze_every_epochs={every} "
            f"epochs: in config.num_epochs={num_epochs} only the top {thawed} of {num_layers} layers train, the "
            f"embeddings never; raise num_epochs to {num_layers * every + 1} to thaw them all"]


@config_keys.declare(FREEZING, "lowest", {"layer_by_layer": True, "check": _check_lowest},
                     num_frozen_layers=NON_NEGATIVE, freeze_embeddings=BOOLEAN)
def freeze_the_lowest(config, *, num_layers: int, shared: bool, steps_per_epoch: int) -> StartStep:
    """The embeddings (if freeze_embeddings) and the lowest `num_frozen_layers` layers are frozen. Shared weights
    are every layer, so they train once any of theirs would: the top one, which freezing from the bottom keeps."""
    frozen = config.num_frozen_layers
    _check_frozen_layers(frozen, num_layers, shared)

    def start(part: str, pretrained: Body) -> int:
        if part in pretrained.embeddings:
            return NEVER if config.freeze_embeddings else 0
        layer = num_layers - 1 if part == SHARED else _layer_index(part)
        return NEVER if layer is not None and layer < frozen else 0
    return start


@config_keys.declare(FREEZING, "gradual", {"layer_by_layer": True, "check": _check_gradual},
                     unfreeze_every_epochs=POSITIVE)
def unfreeze_gradually(config, *, num_layers: int, shared: bool, steps_per_epoch: int) -> StartStep:
    """ULMFiT's gradual unfreezing: one more block from the top down every `unfreeze_every_epochs` epochs."""
    every = max(1, config.get("unfreeze_every_epochs", 1)) * steps_per_epoch
    return lambda part, pretrained: depth_from_top(part, pretrained, num_layers) * every


def depth_from_top(part: str, pretrained: Body, num_layers: int) -> int:
    """A body block's distance below the top layer, which gradual unfreezing and discriminative rates count: 0 for
    the top layer, the blocks above it and shared weights (they are the top layer too), num_layers - 1 - i for
    layer_i, num_layers for the embeddings and any other block below layer 0."""
    if part in pretrained.top or part == SHARED:
        return 0
    layer = _layer_index(part)
    return num_layers - 1 - layer if layer is not None else num_layers


def _check_frozen_layers(frozen: int, num_layers: int, shared: bool) -> None:
    """A count of frozen layers the model can have."""
    if not 0 <= frozen <= num_layers:
        raise ConfigError(f"config.freezing.num_frozen_layers={frozen} must be in [0, {num_layers}] "
                          f"(the encoder has {num_layers} layers)")
    if shared and 0 < frozen < num_layers:  # the one set of weights cannot be both frozen and trained
        raise ConfigError(f"config.freezing.num_frozen_layers={frozen} freezes some of the {num_layers} layers, but "
                          "they share one set of weights (config.model.shared_layers, ALBERT): freezing one freezes "
                          f"all; use 0 or {num_layers}, or strategy head_only")


def _layer_index(part: str) -> int | None:
    """'layer_3' -> 3; None for any other block."""
    match = LOOPED.match(part)
    return int(match.group(1)) if match else None


def train_fresh(unfreeze_at: Any, fresh: Collection[str]) -> Any:
    """A body weight the checkpoint did not have (the pooler of an ELECTRA discriminator or a distilled student,
    which pretraining never built) is as new as the task head: it trains from step 0 whatever the strategy, rather
    than staying frozen at its random init. fresh: "bert/pooler/kernel"-style names (pretrained.merge_params')."""
    def start(path, step: int) -> int:
        return 0 if "/".join(path_names(path)) in fresh else step
    return jax.tree_util.tree_map_with_path(start, unfreeze_at)


class FreezeState(NamedTuple):
    count: jax.Array        # optimizer steps taken so far
    inner: optax.OptState


def freeze(tx: optax.GradientTransformation, unfreeze_at: Any) -> optax.GradientTransformation:
    """Wraps `tx` so that a parameter is updated only once count >= its entry in `unfreeze_at`."""
    def mask(tree, count):
        def keep(x, start):  # decided in Python where the start allows: no pass over always-trained weights
            if start == 0:
                return x
            if start == NEVER:
                return jnp.zeros_like(x)
            return jnp.where(count >= start, x, jnp.zeros_like(x))
        return jax.tree.map(keep, tree, unfreeze_at)

    def init(params):
        return FreezeState(jnp.zeros([], jnp.int32), tx.init(params))

    def update(grads, state, params=None):
        updates, inner = tx.update(mask(grads, state.count), state.inner, params)
        return mask(updates, state.count), FreezeState(state.count + 1, inner)

    return optax.GradientTransformation(init, update)


def trainable_count(params: Any, unfreeze_at: Any, step: int) -> int:
    """Parameters that train at `step`."""
    starts = jax.tree.leaves(unfreeze_at)  # the same structure, so the leaves line up
    return int(sum(p.size for p, s in zip(jax.tree.leaves(params), starts) if step >= s))


def trainable_fraction(params: Any, unfreeze_at: Any, step: int) -> float:
    """Share of parameters that train at `step` (printed at start so a user sees the strategy act)."""
    return trainable_count(params, unfreeze_at, step) / max(sum(p.size for p in jax.tree.leaves(params)), 1)


def without_subtrees(tx: optax.GradientTransformation, frozen: tuple[str, ...]) -> optax.GradientTransformation:
    """`tx` on every parameter but those under the "a/b" paths `frozen` (a family's, models/families.py: a
    distillation teacher): those get a zero update and no optimizer state (no moments, no weight decay)."""
    if not frozen:
        return tx
    prefixes = [tuple(path.split("/")) for path in frozen]

    def labels(params):  # boxed (nn.Partitioned) at init, plain arrays in the step: one label per weight either way
        def label(path, _) -> str:
            names = tuple(path_names(path))
            return "frozen" if any(names[:len(p)] == p for p in prefixes) else "train"
        return jax.tree_util.tree_map_with_path(label, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))

    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
