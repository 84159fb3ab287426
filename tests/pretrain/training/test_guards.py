"""The non-finite guard: train_step's `nonfinite` flag and skip_nonfinite, guards.check_finite, and
the pretraining loop stopping with one line before a NaN state can be saved (or, with
skip_nonfinite_updates, counting the skipped updates and keeping the weights)."""
from __future__ import annotations

import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pretrain.loops.steps import train_step
from pretrain.runtime import errors
from pretrain.training import guards
from pretrain.training.train_state import TrainState
from tests.helpers.asserts import assert_same_leaves
from tests.helpers.tiny_bert import tiny_config


class Linear(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        return nn.Dense(1)(x)[..., 0]


class SquaredError:
    """The StepObjective protocol, as small as it gets."""

    def model_inputs(self, batch):
        return {"x": batch["x"]}

    def loss(self, outputs, batch):
        loss = jnp.mean((outputs - batch["y"]) ** 2)
        return loss, {"loss": loss, "tokens": jnp.float32(batch["y"].size)}


def setup():
    model = Linear()
    params = model.init(jax.random.key(0), jnp.zeros((1, 4)))["params"]
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
    state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    # two updates first, so that Adam's moments and count are not zeros (an unchanged zero proves little)
    step = jax.jit(functools.partial(train_step, objective=SquaredError(), schedule=lambda s: 1e-2))
    for seed in (1, 2):
        state, _ = step(state, batch(seed), jax.random.key(0))
    return state


def batch(seed: int, poison=None):
    x = np.asarray(jax.random.normal(jax.random.key(seed), (1, 8, 4)))
    y = np.array(jax.random.normal(jax.random.key(seed + 1), (1, 8)))
    if poison is not None:
        y[0, 3] = poison
    return {"x": x, "y": y}


def run_step(state, b, skip: bool):
    step = jax.jit(functools.partial(train_step, objective=SquaredError(), schedule=lambda s: 1e-2,
                                     skip_nonfinite=skip))
    return step(state, b, jax.random.key(0))


def host(tree):
    return jax.tree.map(np.asarray, tree)


def test_a_finite_step_is_flagged_0_and_skipping_changes_nothing():
    state = setup()
    plain, metrics = run_step(state, batch(3), skip=False)
    skipping, metrics_skip = run_step(state, batch(3), skip=True)
    assert float(metrics["nonfinite"]) == 0.0 and float(metrics_skip["nonfinite"]) == 0.0
    assert_same_leaves(plain, skipping)  # bitwise: the guard costs nothing to a finite update
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(host(state.params)),
                                                         jax.tree.leaves(host(plain.params))))


@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_a_non_finite_step_is_flagged_and_skipped_bitwise(poison):
    state = setup()
    before = host(state)
    applied, metrics = run_step(state, batch(3, poison), skip=False)
    assert float(metrics["nonfinite"]) == 1.0
    assert any(np.isnan(np.asarray(x)).any() for x in jax.tree.leaves(applied.params))  # what skipping avoids

    skipped, metrics = run_step(state, batch(3, poison), skip=True)
    assert float(metrics["nonfinite"]) == 1.0
    assert int(skipped.step) == int(state.step) + 1  # the step counts batches: it still advances
    for a, b in zip(jax.tree.leaves((before.params, before.opt_state)),
                    jax.tree.leaves(host((skipped.params, skipped.opt_state)))):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_check_finite():
    finite = {"loss": 1.0, "grad_norm": 2.0, "nonfinite": 0.0}
    bad = {"loss": float("nan"), "grad_norm": float("inf"), "nonfinite": 1.0}
    assert guards.check_finite(5, finite, skip=False) is False
    assert guards.check_finite(5, bad, skip=True) is True
    with pytest.raises(guards.NonFiniteError) as info:
        guards.check_finite(5, bad, skip=False)
    message = str(info.value)
    assert "\n" not in message and "step 5" in message and "loss nan" in message and "gradient norm inf" in message
    assert "--config.skip_nonfinite_updates=true" in message and "learning_rate" in message
    assert isinstance(info.value, errors.UserError)
    # metrics of a step function without the flag: judged from the loss and gradient norm
    assert guards.check_finite(1, {"loss": 1.0, "grad_norm": float("nan")}, skip=True) is True
    assert guards.check_finite(1, {"loss": 1.0, "grad_norm": 3.0}, skip=False) is False


# ---------------------------------------------------------------------------------------------
# The pretraining loop, in process, with a learning rate that blows up on the third update.
# ---------------------------------------------------------------------------------------------
def checkpoint_steps(workdir) -> list[int]:
    return sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())


def test_a_non_finite_update_stops_the_run_with_one_line_before_any_save(tmp_path, corpus_and_tokenizer,
                                                                           capsys, monkeypatch):
    from pretrain.loops import pretraining
    from pretrain.workdir import checkpoints
    monkeypatch.delenv("LMPRETRAIN_TRACEBACK", raising=False)
    workdir = tmp_path / "run"
    config = tiny_config(*corpus_and_tokenizer, num_train_steps=8, checkpoint_every=1, keep_checkpoints=10,
                         **{"optimizer.learning_rate": 1e9})
    with pytest.raises(SystemExit) as exit_info:
        with errors.one_line_errors():
            pretraining.train_and_evaluate(config, str(workdir))
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    bad = int(line.split("the update of step ")[1].split()[0])
    assert line.startswith("error: the update of step") and "skip_nonfinite_updates=true" in line, line
    # every step before the bad one was saved (checkpoint_every=1), the bad one and later ones never
    assert checkpoint_steps(workdir) == list(range(1, bad)) and bad > 1
    params, _ = checkpoints.restore_params(str(workdir / "checkpoints"))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def test_skipping_keeps_the_weights_and_counts_the_skipped_updates(tmp_path, corpus_and_tokenizer):
    from pretrain.loops import pretraining
    from pretrain.workdir import checkpoints
    workdir = tmp_path / "run"
    config = tiny_config(*corpus_and_tokenizer, num_train_steps=8, checkpoint_every=1, keep_checkpoints=10,
                         skip_nonfinite_updates=True, **{"optimizer.learning_rate": 1e9})
    pretraining.train_and_evaluate(config, str(workdir))
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "skipped_updates" in r]
    assert [r["step"] for r in train] == list(range(1, 9))
    skipped = [r["step"] for r in train if r["skipped_updates"]]
    assert skipped and train[-1]["skipped_updates_total"] == len(skipped)
    assert all("loss" not in r for r in train if r["skipped_updates"])  # no NaN averaged into the log
    # from the first skipped update on nothing was applied: the last weights are those before it
    first = skipped[0]
    assert skipped == list(range(first, 9)), skipped
    last, _ = checkpoints.restore_params(str(workdir / "checkpoints"), 8)
    kept, _ = checkpoints.restore_params(str(workdir / "checkpoints"), first - 1)
    assert_same_leaves(last, kept)

    # a resume keeps counting: the total covers the whole run, not just this process
    config.num_train_steps = 10
    pretraining.train_and_evaluate(config, str(workdir))
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    resumed = [r for r in records if "skipped_updates" in r and r["step"] > 8]
    assert [r["step"] for r in resumed] == [9, 10] and all(r["skipped_updates"] == 1 for r in resumed)
    assert resumed[-1]["skipped_updates_total"] == len(skipped) + 2
