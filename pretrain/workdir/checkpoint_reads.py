"""Reading checkpoints: one failure policy for every reader (resume, fine-tuning init, export, evaluate, generate,
perplexity, lm-eval, a distillation teacher).

A step folder can be damaged after Orbax completed it (a disk that filled up, a copy cut short, a file removed or
overwritten by hand). Each reader tries the steps newest first through `first_usable`:
- a damaged step is named in one warning line, and the reader takes the complete step before it;
- when no step is usable, or the step asked for (--step) is damaged, one DamagedCheckpointError names each step
  and why (exit status 1: the files are damaged, the command line is fine);
- a checkpoint of another model is never skipped: an older one would not fit either (the caller raises it).
What Orbax, TensorStore and asyncio print about a failed read (absl lines, "Future exception was never retrieved",
"Event loop is closed") is dropped: the warning says it in one line.
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging as std_logging
import os
import sys
import types
import warnings
from asyncio import log as asyncio_log
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from pretrain.runtime.errors import UserError
from pretrain.workdir import storage

T = TypeVar("T")
ITEMS = ("state", "data")


class CheckpointError(UserError):
    """A checkpoint that cannot be used with this config (one-line message)."""


class DamagedCheckpointError(CheckpointError):
    """No usable checkpoint where one was asked for: its files are damaged (one line naming each step and why).
    Exit status 1, not a usage error's 2: the command line is right, the files are not."""
    exit_status = 1


def first_usable(directory: str, steps: list[int], read: Callable[[int], tuple[T | None, str | None]], *,
                 asked: int | None, fix: str) -> tuple[T, int]:
    """The first of `steps` (newest first) that `read(step)` -> (value, None) can read, and its step. A step it
    reports as damaged, (None, why), is named in one warning line before the one below it is tried; with none
    left, DamagedCheckpointError names them all and `fix`."""
    skipped = []
    for step in steps:
        value, problem = read(step)
        if problem is None:
            return value, step
        skipped.append(f"{step} ({problem})")
        if step != steps[-1]:
            print(f"warning: skipping checkpoint {directory}/{step}: {problem}; trying the one before it",
                  file=sys.stderr, flush=True)
    what = f"checkpoint {directory}/{asked} is unusable" if asked is not None else \
        f"no usable checkpoint in {directory}"
    raise DamagedCheckpointError(f"{what}: {'; '.join(skipped)}; {fix}")


def step_problem(directory: str, step: int, items: tuple[str, ...] = ITEMS) -> str | None:
    """Why DIR/<step> cannot be a complete checkpoint, or None. Reads only the small marker files:
    a save cut short leaves no commit marker (Orbax's commit_success.txt, or the commit time in
    _CHECKPOINT_METADATA) or misses an item folder."""
    path = os.path.join(directory, str(step))
    if not storage.isdir(path):
        return "no such folder"
    if not storage.listdir(path):
        return "the folder is empty"
    try:
        metadata = json.loads(storage.read_text(os.path.join(path, "_CHECKPOINT_METADATA")))
    except FileNotFoundError:
        return "no _CHECKPOINT_METADATA (the save did not finish)"
    except (OSError, ValueError):
        return "_CHECKPOINT_METADATA is unreadable"
    committed = isinstance(metadata, dict) and metadata.get("commit_timestamp_nsecs")
    if not committed and not storage.exists(os.path.join(path, "commit_success.txt")):
        return "no commit marker (the save did not finish)"
    missing = [item for item in items if not storage.isdir(os.path.join(path, item))]
    if missing:
        return f"item folder {missing[0]}/ is missing"
    return None


def latest_complete_step(directory: str) -> int | None:
    """The newest step folder of `directory` that holds a complete checkpoint (step_problem), or None."""
    if not storage.isdir(directory):
        return None
    steps = sorted((int(name) for name in storage.listdir(directory) if name.isdigit()), reverse=True)
    return next((step for step in steps if step_problem(directory, step) is None), None)


def restore_params(directory: str, step: int | None = None) -> tuple[Any, int]:
    """Only the `params` of a checkpoint written by Checkpointer (no optimizer state is read).

    directory: the checkpoints/ folder (latest usable step, or `step`) or one step's folder inside it.
    Returns (params as host-side arrays, step).
    """
    directory = storage.absolute(directory)
    if os.path.basename(directory).isdigit() and storage.isdir(os.path.join(directory, "state")):
        directory, step = os.path.dirname(directory), int(os.path.basename(directory))
    steps = ocp.utils.checkpoint_steps(directory) if storage.isdir(directory) else []
    if not steps or (step is not None and step not in steps):
        where = f"at step {step} in" if step is not None else "in"
        raise CheckpointError(f"no checkpoint {where} {directory} (give a checkpoints/ folder written by "
                              "pretrain.train or pretrain.finetune)")
    candidates = [step] if step is not None else sorted(steps, reverse=True)
    fix = "its files are damaged: copy the run again from where it was written, or give an earlier step"
    return first_usable(directory, candidates, lambda s: _read_params(directory, s), asked=step, fix=fix)


def _read_params(directory: str, step: int) -> tuple[Any, str | None]:
    """-> (params of DIR/<step> as host numpy arrays, None), or (None, why they cannot be read)."""
    problem = step_problem(directory, step, items=("state",))
    if problem is not None:
        return None, problem
    path = os.path.join(directory, str(step), "state")
    checkpointer = ocp.PyTreeCheckpointer()
    with quiet_failed_reads(), warnings.catch_warnings():  # "no _CHECKPOINT_METADATA" for a bare item folder
        warnings.simplefilter("ignore")
        try:
            metadata = checkpointer.metadata(path)
        except Exception as e:  # noqa: BLE001 - Orbax and TensorStore raise plain Exceptions
            collect_failed_reads()
            return None, f"unreadable metadata ({first_line(e)})"
        stored = getattr(getattr(metadata, "item_metadata", None), "tree", None)
        if not isinstance(stored, dict) or "params" not in stored:
            return None, unreadable_metadata(path)
        abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), stored["params"])
        # As host numpy arrays: valid whatever mesh wrote the checkpoint; the caller places them.
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract)
        try:
            restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(
                item={"params": abstract}, restore_args={"params": as_numpy}, partial_restore=True))
        except Exception as e:  # noqa: BLE001
            collect_failed_reads()
            return None, f"unreadable ({first_line(e)})"
    return jax.device_get(restored["params"]), None


def unreadable_metadata(item: str) -> str:
    """Why Orbax read no metadata from an item folder (it logs the cause and returns None)."""
    if not storage.exists(os.path.join(item, "_METADATA")):
        return f"{os.path.basename(item)}/_METADATA is missing"
    return f"the metadata of {os.path.basename(item)}/ is unreadable (its files are damaged)"


def restore_data(directory: str, step: int) -> Any:
    """The JSON `data` item saved beside a checkpoint's state (the data position, or what a loop recorded)."""
    path = os.path.join(storage.absolute(directory), str(step), "data")
    try:
        return ocp.JsonCheckpointHandler().restore(epath.Path(path))
    except (OSError, ValueError) as e:
        raise DamagedCheckpointError(f"{path}: unreadable ({first_line(e)}); its files are damaged: copy the run "
                                     "again from where it was written") from None


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:120] if text else type(e).__name__


@contextlib.contextmanager
def quiet_failed_reads() -> Iterator[None]:
    """Around a read that may meet damaged files: only our one warning line comes out of it (see the module)."""
    drop_late_callbacks()
    with quiet_absl(logging.FATAL), _quiet_unraisable():
        yield


def drop_late_callbacks() -> None:
    """When a restore fails on a damaged file, or a save on a full disk, TensorStore's other reads or writes still
    finish, some later: each one's callback finds Orbax's event loop closed, or its future's error is never
    retrieved, and Python or asyncio would print dozens of tracebacks around the one line, even minutes later.
    Drop exactly those, for the rest of the process; every other unraisable and asyncio record is shown."""
    asyncio_log.logger.addFilter(_failed_tensorstore_future)  # asyncio's own logger object; added once
    previous = sys.unraisablehook
    if getattr(previous, "drops_late_callbacks", False):
        return

    def hook(unraisable) -> None:
        if not (unraisable.object is None and isinstance(unraisable.exc_value, RuntimeError)
                and str(unraisable.exc_value) == "Event loop is closed"):
            previous(unraisable)
    hook.drops_late_callbacks = True
    sys.unraisablehook = hook


def _failed_tensorstore_future(record: std_logging.LogRecord) -> bool:
    """False (drop) for asyncio's "Future/Task exception was never retrieved" of a TensorStore read or write (its
    error names the TensorStore spec of the damaged file the warning already named), and for a late callback's
    "Event loop is closed" that asyncio logs instead of raising."""
    message = record.getMessage()
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return False
    return "exception was never retrieved" not in message or "tensorstore_spec" not in f"{message} {error}"


@contextlib.contextmanager
def _quiet_unraisable():
    """A truncated file makes each of Orbax's other read coroutines fail unobserved, and Python would
    print every one (with TensorStore's whole spec) after our one-line warning; drop those."""
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: None if isinstance(u.object, types.CoroutineType) else previous(u)
    try:
        yield
    finally:
        sys.unraisablehook = previous


def collect_failed_reads() -> None:
    """Inside quiet_failed_reads, once a read failed: its other coroutines, failed unobserved, are reported when
    collected: here, quietly, not later. (Not after a read that succeeded: a collection there would report what
    the caller's own code left to the garbage collector, inside this read.)"""
    gc.collect()


@contextlib.contextmanager
def quiet_absl(quiet_below: int = logging.ERROR):
    level = logging.get_verbosity()
    logging.set_verbosity(min(level, quiet_below))  # absl: a lower verbosity shows less
    try:
        yield
    finally:
        logging.set_verbosity(level)
