"""Orbax checkpoints: asynchronous save every N steps, keep the last K, resume from the latest.

A checkpoint holds the train state (params, optimizer state, step) and the data position as JSON.
Orbax writes each step into a temporary directory and renames it only once complete, so a run
killed mid-save never leaves a half-written checkpoint as the latest.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from pretrain.core.errors import UserError


class CheckpointError(UserError):
    """A checkpoint that cannot be used with this config (one-line message)."""


class Checkpointer:
    def __init__(self, directory: str, *, save_every: int, keep: int, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        self.save_every = save_every
        self.manager = ocp.CheckpointManager(
            self.directory, item_names=("state", "data"),
            item_handlers={"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()},
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=async_save, create=True,
                cleanup_tmp_directories=True))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def should_save(self, step: int, last_step: int) -> bool:
        return step == last_step or (self.save_every > 0 and step % self.save_every == 0)

    def save(self, step: int, state: Any, data_position: dict, force: bool = False) -> None:
        """Starts an asynchronous save; training continues while it is written."""
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position)), force=force)

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """Restores onto the shardings in `abstract_state` (jax.ShapeDtypeStruct leaves)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        self._check_shapes(abstract_state, step)
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        except (ValueError, KeyError, TypeError) as e:
            first_line = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
            raise CheckpointError(
                f"checkpoint {self.directory}/{step} does not fit this config's model ({first_line}); "
                "resume with the config that wrote it or use a new --workdir") from None
        return restored["state"], dict(restored["data"]), step

    def _check_shapes(self, abstract_state: Any, step: int) -> None:
        """Compare parameter names and shapes with the checkpoint's metadata before restoring, so
        that a checkpoint of another model is a one-line error instead of an Orbax traceback."""
        params = getattr(abstract_state, "params", None)
        if params is None:
            return
        stored_meta = self.manager.item_metadata(step)["state"]
        stored = _shapes_by_name(stored_meta["params"]) if stored_meta is not None else {}
        wanted = _shapes_by_name(params)
        where = f"checkpoint {self.directory}/{step}"
        fix = "resume with the config that wrote it or use a new --workdir"
        for name in sorted(set(stored) ^ set(wanted)):
            side = "only in the checkpoint" if name in stored else "missing from the checkpoint"
            raise CheckpointError(f"{where} does not fit this config's model: {name} is {side}; {fix}")
        for name, shape in wanted.items():
            if stored[name] != shape:
                raise CheckpointError(f"{where} does not fit this config's model: {name} has shape "
                                      f"{stored[name]} there but {shape} here; {fix}")

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _shapes_by_name(tree: Any) -> dict[str, tuple[int, ...]]:
    def name(path) -> str:
        return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
    return {name(path): tuple(leaf.shape) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def abstract_with_shardings(tree: Any, shardings: Any) -> Any:
    """Abstract arrays that tell Orbax where each restored leaf should live."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def restore_params(directory: str, step: int | None = None) -> tuple[Any, int]:
    """Only the `params` of a checkpoint written by Checkpointer (no optimizer state is read).

    directory: the checkpoints/ folder (latest step, or `step`) or one step's folder inside it.
    Returns (params as host-side arrays, step).
    """
    directory = os.path.abspath(directory)
    if os.path.isdir(os.path.join(directory, "state")) and os.path.basename(directory).isdigit():
        directory, step = os.path.dirname(directory), int(os.path.basename(directory))
    steps = ocp.utils.checkpoint_steps(directory) if os.path.isdir(directory) else []
    if step is None:
        step = max(steps) if steps else None
    if step is None or step not in steps:
        where = f"at step {step} in" if step is not None else "in"
        raise CheckpointError(f"no checkpoint {where} {directory} (give a checkpoints/ folder written by "
                              "pretrain.train or pretrain.finetune)")
    path = os.path.join(directory, str(step), "state")
    checkpointer = ocp.PyTreeCheckpointer()
    with warnings.catch_warnings(), _quiet_absl():  # "no _CHECKPOINT_METADATA" for a bare item folder
        warnings.simplefilter("ignore")
        stored = checkpointer.metadata(path).item_metadata.tree
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), stored["params"])
    # As host numpy arrays: valid whatever mesh wrote the checkpoint; the caller places them.
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract)
    restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(
        item={"params": abstract}, restore_args={"params": as_numpy}, partial_restore=True))
    return jax.device_get(restored["params"]), step


@contextlib.contextmanager
def _quiet_absl():
    level = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)
    try:
        yield
    finally:
        logging.set_verbosity(level)
