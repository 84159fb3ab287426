"""The fine-tuning loop takes the step its config names: config.grad_accum_steps micro-batches per update and
config.mesh_mode's step (pretrain/loops/setup.py builds both for every loop), in process, from the tiny BERT."""
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from configs import glue
from pretrain.loops import finetuning, setup
from pretrain.runtime.errors import ConfigError
from tests.helpers.paths import SHARED_DATA

STEPS = 2  # 16 examples, batches of 8, one epoch


def _finetune(workdir, tiny_bert_workdir: str, **overrides) -> list[dict]:
    """The metrics.jsonl records of a 2-step SST-2 run without dropout (every row weighs the same in the loss)."""
    config = glue.get_config("task=sst2")
    config.init = tiny_bert_workdir
    config.update_from_flattened_dict({
        "data.glue_dir": os.path.join(SHARED_DATA, "glue"), "data.max_train_examples": 16, "batch_size": 8,
        "num_epochs": 1, "log_every": 1, "write_test_predictions": False, "model.dropout_rate": 0.0,
        "model.attention_dropout_rate": 0.0, "model.classifier_dropout": 0.0, **overrides})
    finetuning.finetune(config, str(workdir))
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "loss" in r]


@pytest.fixture
def step_spy(monkeypatch) -> dict:
    """Records what reaches the jitted train step: each batch's micro-batch count (its leading axis) and
    whether the shard_map step was traced."""
    seen = {"micro_batches": [], "shard_map_traced": False}
    jit_train_step, shard_map_step = setup.train_state.jit_train_step, setup.shard_map_train_step

    def recording_jit(step, shardings, mesh):
        jitted = jit_train_step(step, shardings, mesh)

        def call(state, batch, rng):
            seen["micro_batches"].append(jax.tree.leaves(batch)[0].shape[0])
            return jitted(state, batch, rng)
        return call

    def recording_shard_map(*args, **kwargs):
        seen["shard_map_traced"] = True
        return shard_map_step(*args, **kwargs)
    monkeypatch.setattr(setup.train_state, "jit_train_step", recording_jit)
    monkeypatch.setattr(setup, "shard_map_train_step", recording_shard_map)
    return seen


@pytest.mark.slow
def test_accumulated_and_shard_map_steps_train_as_the_plain_step(tmp_path, tiny_bert_workdir, step_spy):
    plain = _finetune(tmp_path / "plain", tiny_bert_workdir)
    assert step_spy == {"micro_batches": [1] * STEPS, "shard_map_traced": False}
    accumulated = _finetune(tmp_path / "accum", tiny_bert_workdir, grad_accum_steps=2)
    assert step_spy["micro_batches"][STEPS:] == [2] * STEPS
    shard_map = _finetune(tmp_path / "shard_map", tiny_bert_workdir, mesh_mode="shard_map")
    assert step_spy["shard_map_traced"]
    assert [r["step"] for r in plain] == list(range(1, STEPS + 1))
    for other in (accumulated, shard_map):
        # full batches, equal row weights, no dropout: the mean of 2 micro-batch means is the batch's mean, and a
        # one-device shard_map step is the jit step; float32 sums in another order
        np.testing.assert_allclose([r["loss"] for r in other], [r["loss"] for r in plain], rtol=1e-5)
        np.testing.assert_allclose([r["grad_norm"] for r in other], [r["grad_norm"] for r in plain], rtol=1e-4)


def test_accumulation_must_divide_the_fine_tuning_batch():
    config = glue.get_config("task=sst2")
    config.update_from_flattened_dict({"batch_size": 8, "grad_accum_steps": 3})
    from pretrain.training import validation
    with pytest.raises(ConfigError, match="config.batch_size=8 is not divisible by config.grad_accum_steps=3"):
        validation.check_relations(config)
