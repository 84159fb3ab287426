"""Orbax checkpoints: asynchronous save every N steps, keep the last K, resume from the latest.

A checkpoint holds the train state (params, optimizer state, step) and the data position as JSON.
Orbax writes each step into a temporary directory and renames it only once complete, so a run
killed mid-save never leaves a half-written checkpoint as the latest. A step folder can still be
damaged afterwards (a disk that filled up, a copy cut short, a file removed by hand): `restore`
skips such a latest checkpoint with a one-line warning and takes the one before it, as every other reader
does (pretrain.workdir.checkpoint_reads: the one reading policy, and restore_params for readers of parameters
alone). A restore never
deletes or moves anything; the first save of the resumed run sets the skipped folders aside as
`<step>.unusable`, so that its own saves of those steps cannot collide with them.

The directory may be in a bucket (gs://): Orbax writes the arrays there itself (TensorStore) and marks a
finished step with commit_success.txt; the step folders and marker files read here go through
pretrain.workdir.storage (etils.epath), where setting a folder aside copies and deletes its objects (not atomic).

A save that the storage refuses (a full disk, a quota, a file-size limit: pretrain.workdir.write_failures) stops the
run with one CheckpointWriteError naming the step, the cause, the checkpoint that stays the latest and the fix,
wherever the asynchronous save's error comes out (the next save, wait or close); Orbax's and asyncio's
tracebacks of it are not printed, and its unfinished temporary folder goes.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp

from pretrain.workdir import checkpoint_reads as reads
from pretrain.workdir import storage, write_failures
# What every reader of a checkpoint uses, from where the callers and their tests have always found it.
from pretrain.workdir.checkpoint_reads import (  # noqa: F401
    ITEMS, CheckpointError, DamagedCheckpointError, latest_complete_step, restore_data, restore_params, step_problem)


class CheckpointWriteError(CheckpointError):
    """A checkpoint the storage refused to hold (one line: the step, the cause, what stays the latest, the fix).
    A UserError (exit status 2), not a preemption (75): a launcher's automatic rerun would fail the same way until
    a person frees space."""


_TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Orbax's unfinished saves (atomic rename on a local disk)


class Checkpointer:
    def __init__(self, directory: str, *, save_every: int, keep: int, async_save: bool = True):
        self.directory = storage.absolute(directory)
        self.save_every, self.keep = save_every, keep
        self._unusable: list[int] = []   # steps restore() skipped; set aside by the first save
        self._writing = False
        self._in_flight: int | None = None  # the step of the asynchronous save not waited for yet
        self._failed = False                # a CheckpointWriteError was raised: Orbax repeats it on every wait
        # cleanup_tmp_directories=False: where Orbax marks commits with a file (GCS) it would delete
        # every step folder without that file when the manager is created, a damaged one included.
        # Leftover temporary folders are removed by the first save instead (`_prepare_to_write`).
        with reads.quiet_absl():  # "Metadata file does not exist" for a damaged step: restore() says it better
            self.manager = ocp.CheckpointManager(
                self.directory, item_names=ITEMS,
                item_handlers={"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()},
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=keep, enable_async_checkpointing=async_save, create=True,
                    cleanup_tmp_directories=False))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def should_save(self, step: int, last_step: int) -> bool:
        return step == last_step or (self.save_every > 0 and step % self.save_every == 0)

    def save(self, step: int, state: Any, data_position: dict, force: bool = False) -> None:
        """Starts an asynchronous save; training continues while it is written. The previous save is waited for
        first (as Orbax would), so that its failure is reported as its own step's."""
        if not self._writing:
            self._prepare_to_write()
        self.wait()
        # _quiet_absl: Orbax's "Waiting for previous save to complete took N seconds" reports the wait above,
        # ours, at every save once a save outlasts the steps between saves (a bucket under load).
        with self._reporting(step), reads.quiet_absl():
            self._in_flight = step
            self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position)), force=force)

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """Restores onto the shardings in `abstract_state` (jax.ShapeDtypeStruct leaves).

        Without `step`: the latest usable checkpoint. A damaged one (no commit marker, a missing item,
        an empty folder, a truncated file) is skipped with a one-line warning naming it; a checkpoint
        of another model is an error, never skipped: an older one would not fit either.
        """
        steps = [step] if step is not None else sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        restored, found = reads.first_usable(
            self.directory, steps, lambda candidate: self._try_restore(abstract_state, candidate), asked=step,
            fix="move the damaged step folders away or use a new --workdir")
        return restored["state"], dict(restored["data"]), found

    def _try_restore(self, abstract_state: Any, step: int) -> tuple[Any, str | None]:
        """-> (restored items, None), or (None, why this step is damaged), that step then set aside by the first
        save; CheckpointError for a checkpoint of another model."""
        restored, problem = self._read(abstract_state, step)
        if problem is not None:
            self._unusable.append(step)
        return restored, problem

    def _read(self, abstract_state: Any, step: int) -> tuple[Any, str | None]:
        problem = reads.step_problem(self.directory, step)
        if problem is not None:
            return None, problem
        with reads.quiet_failed_reads():  # our warning names the problem instead
            try:
                stored = self.manager.item_metadata(step)["state"]
            except Exception as e:  # noqa: BLE001 - Orbax and TensorStore raise plain Exceptions
                reads.collect_failed_reads()
                return None, f"unreadable metadata ({reads.first_line(e)})"
            if stored is None:
                return None, reads.unreadable_metadata(os.path.join(self.directory, str(step), "state"))
            self._check_shapes(abstract_state, stored, step)
            try:
                return self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())), None
            except Exception as e:  # noqa: BLE001
                reads.collect_failed_reads()
                if _shapes_by_name(stored) != _shapes_by_name(abstract_state):  # e.g. another optimizer
                    raise CheckpointError(
                        f"checkpoint {self.directory}/{step} does not fit this config's model "
                        f"({reads.first_line(e)}); resume with the config that wrote it or use a new --workdir"
                    ) from None
                return None, f"unreadable ({reads.first_line(e)})"

    def _prepare_to_write(self) -> None:
        """Before the first save: the damaged steps restore() skipped move aside (Orbax would refuse
        to save those steps again, or skip saves below them), and Orbax's temporary folders of
        unfinished saves go. Nothing else in the directory is touched."""
        self._writing = True
        write_failures.drop_from_logs()
        reads.drop_late_callbacks()
        if jax.process_index() == 0:
            set_aside(self.directory, self._unusable)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("checkpoints: prepared to write")
        if self._unusable:
            self.manager.reload()
            self._unusable = []

    def finish_rotation(self) -> list[int]:
        """Deletes the oldest checkpoints beyond `keep`, as the save of the newest does once that one is complete:
        a run killed between the two finds its newest at the last step and saves nothing more."""
        steps = sorted(self.manager.all_steps())
        extra = steps[:-self.keep] if len(steps) > self.keep else []
        for step in extra:
            self.manager.delete(step)
        return extra

    def discard_after(self, step: int) -> list[int]:
        """Deletes the checkpoints after `step` (those of a run that was killed and is redone from
        `step`, so that the redone saves neither collide with them nor get pruned in their favour)."""
        later = [s for s in self.manager.all_steps() if s > step]
        for s in later:
            self.manager.delete(s)
        return later

    def _check_shapes(self, abstract_state: Any, stored_meta: Any, step: int) -> None:
        """Compare parameter names and shapes with the checkpoint's metadata before restoring, so
        that a checkpoint of another model is a one-line error instead of an Orbax traceback."""
        params = getattr(abstract_state, "params", None)
        if params is None:
            return
        try:
            stored = _shapes_by_name(stored_meta["params"])
        except (KeyError, TypeError):
            stored = {}
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
        """Blocks until the save in flight is complete; CheckpointWriteError if the storage refused it."""
        if self._in_flight is not None:
            with self._reporting(self._in_flight):
                self.manager.wait_until_finished()
            self._in_flight = None

    def close(self) -> None:
        if self._failed:  # reported already; Orbax's threads are done, and its close() would raise it again
            with contextlib.suppress(Exception):
                self.manager.close()
            return
        self.wait()
        self.manager.close()

    @contextlib.contextmanager
    def _reporting(self, step: int) -> Iterator[None]:
        """Around a save of `step` or a wait for it: write_failures_as_errors, and then the save's temporary
        folder removed (on one process: with several, another may still write into it; the next start's first
        save removes it then). On a full disk that is the space the rerun needs."""
        try:
            with write_failures_as_errors(step, self.directory):
                yield
        except CheckpointWriteError:
            self._failed, self._in_flight = True, None
            write_failures.close_abandoned_writes()
            if jax.process_count() == 1:
                for name in storage.listdir(self.directory):
                    if name.startswith(f"{step}{_TMP_SUFFIX}"):
                        storage.rmtree(os.path.join(self.directory, name), ignore_errors=True)
            raise

    def close_when_unwound(self, stack: contextlib.ExitStack) -> None:
        """close() when `stack` unwinds (Orbax's threads stop before the process exits; the saves in flight hold
        good states and complete), except on KeyboardInterrupt: a second Ctrl-C stops now, without waiting."""
        stack.push(lambda exc_type, exc, tb: None if exc_type is KeyboardInterrupt else self.close())


def set_aside(directory: str, unusable: list[int]) -> None:
    """DIR/<step> of each `unusable` step -> DIR/<step>.unusable (or .unusable1, ...), and Orbax's temporary
    folders of unfinished saves removed. In a bucket a folder's move is a copy + delete per object."""
    if not storage.isdir(directory):
        return
    for step in unusable:
        source = os.path.join(directory, str(step))
        if storage.isdir(source):
            target, n = f"{source}.unusable", 1
            while storage.exists(target):
                target, n = f"{source}.unusable{n}", n + 1
            storage.rename(source, target)
            print(f"Moved the unusable checkpoint {source} aside to {target}", file=sys.stderr)
    for name in storage.listdir(directory):
        if _TMP_SUFFIX in name:
            storage.rmtree(os.path.join(directory, name), ignore_errors=True)


@contextlib.contextmanager
def write_failures_as_errors(step: int, directory: str) -> Iterator[None]:
    """Around a write of checkpoint `step` into `directory` (or a wait for one): a failure that
    write_failures.write_failure recognises becomes one CheckpointWriteError naming the step, the cause, the
    checkpoint that stays the latest and the fix; any other exception passes through."""
    try:
        yield
    except Exception as e:
        failure = write_failures.write_failure(e)
        if failure is None:
            raise
        latest = reads.latest_complete_step(directory)
        kept = f"checkpoint {latest} stays the latest" if latest is not None else "no earlier checkpoint there"
        rerun = "rerun the same command to resume" if latest is not None else "rerun the same command"
        raise CheckpointWriteError(f"checkpoint {step} could not be written to {directory}: {failure.what}; "
                                   f"{kept}: {failure.fix} and {rerun}") from e


def _shapes_by_name(tree: Any) -> dict[str, tuple[int, ...]]:
    def name(path) -> str:
        return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
    return {name(path): tuple(getattr(leaf, "shape", ()))
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def abstract_with_shardings(tree: Any, shardings: Any) -> Any:
    """Abstract arrays that tell Orbax where each restored leaf should live."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
