"""Checkpointer.restore past a damaged latest checkpoint: each kind of damage falls back to the step
before it with a one-line warning, nothing is deleted, and the next save sets the damaged folder
aside instead of colliding with it; a checkpoint of another model stays an error."""
from __future__ import annotations

import glob
import json
import os

import jax
import jax.numpy as jnp
import optax
import pytest

from pretrain.training.train_state import TrainState
from pretrain.workdir import checkpoints
from tests.helpers.asserts import assert_same_leaves


def make_state(seed: int, shape=(64, 64)) -> TrainState:
    """Random (incompressible) weights, so that a truncated data file cannot still decode."""
    params = {"dense": {"kernel": jax.random.normal(jax.random.key(seed), shape),
                        "bias": jax.random.normal(jax.random.key(seed + 100), shape[-1:])}}
    return TrainState.create(apply_fn=None, params=params, tx=optax.adam(1e-3))


def abstract(state: TrainState) -> TrainState:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), state)


def write_steps(directory, steps=(1, 2, 3)) -> dict[int, TrainState]:
    ckpt = checkpoints.Checkpointer(str(directory), save_every=1, keep=5)
    states = {}
    for step in steps:
        states[step] = make_state(step)
        ckpt.save(step, states[step], {"step": step})
    ckpt.close()
    return states


def files_under(directory) -> dict[str, int]:
    """Every file below `directory` -> its size (what a deletion would change)."""
    return {os.path.relpath(p, directory): os.path.getsize(p)
            for p in glob.glob(os.path.join(str(directory), "**"), recursive=True) if os.path.isfile(p)}


def truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def damage(directory, kind: str) -> str:
    """Damages the latest checkpoint (step 3) or adds a damaged step 4; returns the damaged folder."""
    step3 = os.path.join(str(directory), "3")
    if kind == "truncated data file":  # the largest file holds the weights
        largest = max((p for p in glob.glob(step3 + "/state/**", recursive=True) if os.path.isfile(p)),
                      key=os.path.getsize)
        assert os.path.getsize(largest) > 10_000
        truncate(largest)
    elif kind == "truncated metadata file":
        truncate(os.path.join(step3, "state", "_METADATA"))
    elif kind == "truncated data position":
        truncate(os.path.join(step3, "data", "metadata"))
    elif kind == "missing state item":
        for p in sorted(glob.glob(step3 + "/state/**", recursive=True), reverse=True):
            os.rmdir(p) if os.path.isdir(p) else os.remove(p)
    elif kind == "missing data item":
        for name in os.listdir(os.path.join(step3, "data")):
            os.remove(os.path.join(step3, "data", name))
        os.rmdir(os.path.join(step3, "data"))
    elif kind == "no step metadata":
        os.remove(os.path.join(step3, "_CHECKPOINT_METADATA"))
    elif kind == "no commit marker":  # a commit-file save cut short: metadata without a commit time
        meta_path = os.path.join(step3, "_CHECKPOINT_METADATA")
        with open(meta_path) as f:
            meta = json.load(f)
        meta.pop("commit_timestamp_nsecs")
        with open(meta_path, "w") as f:
            json.dump(meta, f)
        os.remove(os.path.join(step3, "commit_success.txt"))
    elif kind == "empty step folder":
        os.mkdir(os.path.join(str(directory), "4"))
        return os.path.join(str(directory), "4")
    else:
        raise ValueError(kind)
    return step3


KINDS = ["truncated data file", "truncated metadata file", "truncated data position", "missing state item",
         "missing data item", "no step metadata", "no commit marker", "empty step folder"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(tmp_path, capsys, kind):
    states = write_steps(tmp_path)
    damaged = damage(tmp_path, kind)
    before = files_under(tmp_path)

    ckpt = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=5)
    restored, position, step = ckpt.restore(abstract(states[2]))
    ckpt.close()
    expected_step = 3 if damaged.endswith("4") else 2
    assert step == expected_step and position == {"step": expected_step}
    assert_same_leaves(restored, states[expected_step])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"checkpoint {damaged}:" in warnings[0], warnings
    assert files_under(tmp_path) == before  # neither the manager nor the restore deleted anything


def test_without_the_fallback_the_truncated_file_does_fail(tmp_path):
    """The damage above is real: restoring exactly that step is an error, not a silent success."""
    states = write_steps(tmp_path)
    damage(tmp_path, "truncated data file")
    ckpt = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=5)
    with pytest.raises(checkpoints.CheckpointError, match="checkpoint .*/3 is unusable: 3 \\(unreadable"):
        ckpt.restore(abstract(states[2]), step=3)
    ckpt.close()


def test_the_next_save_sets_the_damaged_folder_aside(tmp_path, capsys):
    states = write_steps(tmp_path)
    damage(tmp_path, "no step metadata")
    damaged_files = {k[2:]: v for k, v in files_under(tmp_path).items() if k.startswith("3/")}
    leftover = tmp_path / "5.orbax-checkpoint-tmp"  # an unfinished save of an earlier process
    leftover.mkdir()

    ckpt = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=5)
    ckpt.restore(abstract(states[2]))
    assert leftover.exists()  # a restore removes nothing
    ckpt.save(3, states[3], {"step": 3})  # Orbax alone: StepAlreadyExistsError
    ckpt.close()
    assert not leftover.exists()  # the writer clears Orbax's temporary folders
    assert {k[len("3.unusable/"):]: v for k, v in files_under(tmp_path).items()
            if k.startswith("3.unusable/")} == damaged_files
    assert "aside to" in capsys.readouterr().err

    ckpt = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=5)
    restored, _, step = ckpt.restore(abstract(states[2]))
    ckpt.close()
    assert step == 3
    assert_same_leaves(restored, states[3])


def test_a_checkpoint_of_another_model_is_an_error_not_a_fallback(tmp_path, capsys):
    write_steps(tmp_path)
    ckpt = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=5)
    with pytest.raises(checkpoints.CheckpointError, match="3 does not fit this config's model.*dense/kernel"):
        ckpt.restore(abstract(make_state(0, shape=(32, 64))))
    ckpt.close()
    assert "warning" not in capsys.readouterr().err


def test_another_optimizer_is_an_error_not_a_fallback(tmp_path):
    write_steps(tmp_path)
    other = TrainState.create(apply_fn=None, params=make_state(0).params, tx=optax.sgd(1e-3, momentum=0.9))
    ckpt = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=5)
    with pytest.raises(checkpoints.CheckpointError, match="3 does not fit this config's model"):
        ckpt.restore(abstract(other))
    ckpt.close()


def test_no_usable_checkpoint_is_one_error_naming_each(tmp_path):
    states = write_steps(tmp_path, steps=(1, 2))
    for step in ("1", "2"):
        os.remove(os.path.join(str(tmp_path), step, "_CHECKPOINT_METADATA"))
    before = files_under(tmp_path)
    ckpt = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=5)
    with pytest.raises(checkpoints.CheckpointError) as info:
        ckpt.restore(abstract(states[1]))
    ckpt.close()
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"no usable checkpoint in {tmp_path}: 2 (")
    assert "; 1 (" in message
    assert files_under(tmp_path) == before


def test_restore_params_skips_a_damaged_latest_step(tmp_path, capsys):
    states = write_steps(tmp_path)
    damage(tmp_path, "empty step folder")
    damage(tmp_path, "no step metadata")
    params, step = checkpoints.restore_params(str(tmp_path))
    assert step == 2
    assert_same_leaves(params, states[2].params)
    assert capsys.readouterr().err.count("warning: skipping checkpoint") == 2


def test_finishing_the_rotation_keeps_the_newest_and_deletes_only_the_oldest_beyond_keep(tmp_path):
    """What a run killed after its final save completed, before Orbax's rotation deleted the oldest, is left with."""
    states = write_steps(tmp_path, steps=(1, 2, 3, 4))
    ckpt = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=3)
    assert ckpt.finish_rotation() == [1]
    assert ckpt.finish_rotation() == []
    restored, _, step = ckpt.restore(abstract(states[4]))
    ckpt.close()
    assert step == 4 and sorted(os.listdir(tmp_path)) == ["2", "3", "4"]
    assert_same_leaves(restored, states[4])
