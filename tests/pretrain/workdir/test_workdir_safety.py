"""A finished workdir survives what comes next: a diverging continuation, a damaged latest checkpoint, a
metrics.jsonl cut mid-line. Each runs the real `pretrain.train` on a copy of one small finished run."""
from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pretrain.training import guards
from pretrain.workdir import checkpoints
from pretrain.workdir import run_files as workdir
from tests.helpers.commands import run_train
from tests.helpers.tiny_bert import tiny_overrides


@pytest.fixture(scope="module")
def finished(tiny_bert_workdir) -> str:
    """6 steps of the tiny BERT, checkpoints at 3 and 6 (the session's run, tests/conftest.py: read only)."""
    assert sorted(os.listdir(os.path.join(tiny_bert_workdir, "checkpoints"))) == ["3", "6"]
    return tiny_bert_workdir


@pytest.fixture
def run(finished, tmp_path) -> str:
    copy = str(tmp_path / "run")
    shutil.copytree(finished, copy)
    return copy


def files(directory: str) -> dict[str, bytes]:
    return {os.path.relpath(p, directory): pathlib.Path(p).read_bytes()
            for p in glob.glob(os.path.join(directory, "**"), recursive=True) if os.path.isfile(p)}


def strict_records(path: str) -> list[dict]:
    """metrics.jsonl as JSON proper: NaN / Infinity (Python's json extensions) are refused."""
    def refuse(constant):
        raise ValueError(f"{path} holds {constant}, which is not JSON")
    with open(path) as f:
        return [json.loads(line, parse_constant=refuse) for line in f]


@pytest.mark.slow
def test_a_diverging_continuation_keeps_the_good_checkpoints(run, corpus_and_tokenizer):
    good = {k: v for k, v in files(run).items() if k.startswith("checkpoints/")}
    proc = run_train(run, tiny_overrides(*corpus_and_tokenizer, num_train_steps=30,
                                         **{"optimizer.learning_rate": 1e9}), check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "%|" not in line]
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "not finite" in errors[0] and "step" in errors[0], errors[0]
    step = int(errors[0].split("step ")[1].split()[0])
    assert 6 < step <= 30
    # the learning rate is a schedule change: allowed, with a warning that names it
    assert any(line.startswith("warning:") and "optimizer.learning_rate" in line for line in lines), lines
    after = files(run)
    for name, content in good.items():  # every good checkpoint, byte for byte
        assert after.get(name) == content, f"{name} changed or went"
    for step_dir in os.listdir(os.path.join(run, "checkpoints")):  # anything new is finite
        params, _ = checkpoints.restore_params(os.path.join(run, "checkpoints"), int(step_dir))
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(params)), step_dir
    records = strict_records(os.path.join(run, "metrics.jsonl"))
    assert [r["step"] for r in records if "loss" in r][:6] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_a_truncated_latest_checkpoint_resumes_from_the_one_before(run, corpus_and_tokenizer):
    state_files = [p for p in glob.glob(os.path.join(run, "checkpoints", "6", "state", "**"), recursive=True)
                   if os.path.isfile(p)]
    largest = max(state_files, key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.truncate(os.path.getsize(largest) // 2)
    proc = run_train(run, tiny_overrides(*corpus_and_tokenizer, num_train_steps=9))
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: skipping checkpoint")]
    assert len(warnings) == 1 and f"{run}/checkpoints/6:" in warnings[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]  # TensorStore's late callbacks stay quiet
    assert f"Resumed from {run}/checkpoints/3" in proc.stdout
    assert "9" in os.listdir(os.path.join(run, "checkpoints"))
    steps = [r["step"] for r in strict_records(os.path.join(run, "metrics.jsonl")) if "loss" in r]
    assert steps == list(range(1, 10)), steps  # 4..6 of the damaged run dropped and redone, once each


@pytest.mark.slow
def test_a_metrics_file_cut_mid_line_is_trimmed_on_resume(run, corpus_and_tokenizer):
    path = os.path.join(run, "metrics.jsonl")
    with open(path, "a") as f:
        f.write('{"step": 7, "loss": 9.6')  # killed while writing
    proc = run_train(run, tiny_overrides(*corpus_and_tokenizer, num_train_steps=8))
    assert "metrics.jsonl:" in proc.stderr and "not a JSON record" in proc.stderr
    steps = [r["step"] for r in strict_records(path) if "loss" in r]
    assert steps == list(range(1, 9)), steps


@pytest.mark.slow
def test_tensorboard_shows_each_step_once_after_a_resume_that_redoes_steps(run, corpus_and_tokenizer):
    """The killed run logged steps 4..6 past checkpoint 3; the resumed run logs them again. TensorBoard's
    own reader (purge on SessionLog.START) must show every step once, with the values of the resumed run."""
    from tensorboard.backend.event_processing import event_accumulator
    shutil.rmtree(os.path.join(run, "checkpoints", "6"))  # as if killed between the save at 3 and the one at 6
    run_train(run, tiny_overrides(*corpus_and_tokenizer, num_train_steps=8))
    events = event_accumulator.EventAccumulator(os.path.join(run, "tensorboard"), purge_orphaned_data=True)
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 9))
    logged = {r["step"]: r["loss"] for r in strict_records(os.path.join(run, "metrics.jsonl")) if "loss" in r}
    assert [pytest.approx(logged[e.step], rel=1e-6) for e in loss] == [e.value for e in loss]


def test_a_non_finite_parameter_is_never_saved():
    finite = {"a": jnp.ones((3,)), "b": {"c": jnp.zeros((2, 2))}}
    guards.check_params_finite(4, finite)
    poisoned = {"a": jnp.ones((3,)), "b": {"c": jnp.zeros((2, 2)).at[1, 1].set(jnp.inf)}}
    with pytest.raises(guards.NonFiniteParamsError, match="after step 4 are not finite"):
        guards.check_params_finite(4, poisoned)


def test_resume_comparison_sorts_the_keys(tmp_path):
    import ml_collections
    config = ml_collections.ConfigDict({"batch_size": 8, "num_train_steps": 10, "log_every": 1,
                                        "optimizer": {"name": "adamw", "learning_rate": 1e-3},
                                        "model": {"hidden_size": 32}})
    workdir.save_config(str(tmp_path), config)
    stored = (tmp_path / "config.json").read_bytes()
    same = ml_collections.ConfigDict(config.to_dict())
    assert workdir.check_resume(str(tmp_path), same) == []
    schedule = ml_collections.ConfigDict(config.to_dict())
    schedule.optimizer.learning_rate, schedule.num_train_steps, schedule.log_every = 5e-4, 20, 5
    assert workdir.check_resume(str(tmp_path), schedule) == ["num_train_steps", "optimizer.learning_rate"]
    for key, value in (("batch_size", 16), ("model.hidden_size", 64), ("optimizer.name", "adafactor")):
        changed = ml_collections.ConfigDict(config.to_dict())
        changed.update_from_flattened_dict({key: value})
        with pytest.raises(workdir.ConfigError, match=key.replace(".", r"\.")):
            workdir.check_resume(str(tmp_path), changed)
    assert (tmp_path / "config.json").read_bytes() == stored  # comparing never writes


@pytest.mark.slow
def test_a_finetuning_rerun_over_a_best_checkpoint_without_results_restarts_cleanly(finished, tmp_path):
    """Killed after its best-epoch save but before results.json (and with no resume checkpoint): the same
    command trains again from the start and replaces that checkpoint instead of colliding with it."""
    from tests.helpers.commands import run_module
    from tests.helpers.paths import SHARED_DATA
    ft = str(tmp_path / "ft")
    args = ["--config=configs/glue.py:task=mrpc", f"--workdir={ft}", f"--config.init={finished}",
            "--config.data.max_train_examples=32", "--config.num_epochs=1", "--config.data.max_seq_length=32",
            f"--config.data.glue_dir={os.path.join(SHARED_DATA, 'glue')}", "--config.write_test_predictions=false"]
    run_module("pretrain.finetune", args)
    first = json.loads(pathlib.Path(ft, "results.json").read_text())
    os.remove(os.path.join(ft, "results.json"))
    assert os.listdir(os.path.join(ft, "checkpoints")) == [str(first["epochs"][0]["step"])]
    proc = run_module("pretrain.finetune", args, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = json.loads(pathlib.Path(ft, "results.json").read_text())
    assert again["metrics"] == first["metrics"] and again["best_epoch"] == first["best_epoch"]


@pytest.mark.slow
def test_ctrl_c_before_the_loop_is_one_line_and_exit_130(tmp_path, corpus_and_tokenizer):
    """Ctrl-C while the model is built and compiled (the preemption handler is not installed yet)."""
    import signal
    import subprocess
    import sys

    from tests.helpers.paths import REPO
    command = [sys.executable, "-m", "pretrain.train", "--config=configs/bert.py:size=tiny",
               f"--workdir={tmp_path / 'run'}", *tiny_overrides(*corpus_and_tokenizer)]
    proc = subprocess.Popen(command, cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"},
                            text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
    for line in proc.stdout:
        if line.startswith("Corpus:"):  # printed before the model is built
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=300)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130, err[-2000:]
    assert lines == ["interrupted (Ctrl-C): stopped at once; the workdir keeps its latest complete checkpoint"], err


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_written_files_get_the_mode_a_plain_open_would(tmp_path, umask):
    """mkstemp makes its file 0600 whatever the umask: config.json and results.json written through it were
    unreadable to TensorBoard or a notebook run by another user."""
    import ml_collections

    old = os.umask(umask)
    try:
        workdir.save_config(str(tmp_path), ml_collections.ConfigDict({"seed": 1}))
        workdir.write_json_atomic(str(tmp_path / "results.json"), {"best_score": 0.5})
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    expected = 0o666 & ~umask
    assert os.stat(tmp_path / "plain.txt").st_mode & 0o777 == expected
    for name in ("config.json", "results.json"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == expected, name
    assert sorted(os.listdir(tmp_path)) == ["config.json", "plain.txt", "results.json"]  # no temporary left
