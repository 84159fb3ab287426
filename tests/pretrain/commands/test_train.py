"""The real command end to end: smoke run, outputs, checkpoints, kill-and-resume, 8 devices, errors."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.helpers.commands import run_train
from tests.helpers.paths import REPO
from tests.helpers.tiny_bert import prepare_tiny_corpus, tiny_overrides

pytestmark = pytest.mark.slow  # every test here runs the real command in a subprocess

REQUIRED_METRICS = {"step", "loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy",
                    "learning_rate", "grad_norm", "tokens_per_sec", "step_time_sec"}


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if "loss" in r], [r for r in records if "eval_loss" in r]


def final_params(workdir, step=None):
    ckpt_dir = os.path.join(workdir, "checkpoints")
    step = step or max(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())
    restored = ocp.StandardCheckpointer().restore(os.path.join(ckpt_dir, str(step), "state"))
    return step, restored


def one_step_flags(corpus_and_tokenizer) -> list[str]:
    return tiny_overrides(*corpus_and_tokenizer, num_train_steps=1, checkpoint_every=1)


@pytest.fixture(scope="module")
def one_step(corpus_and_tokenizer, tmp_path_factory):
    """(workdir, process) of one step of the tiny BERT through the real command, shared by the tests that read
    it (those that run a command on it take a copy)."""
    workdir = tmp_path_factory.mktemp("one_step") / "run"
    return workdir, run_train(workdir, one_step_flags(corpus_and_tokenizer))


def test_one_step_smoke_run_writes_every_output(one_step):
    workdir, proc = one_step
    train, evals = read_metrics(workdir)
    assert len(train) == 1 and REQUIRED_METRICS <= set(train[0])
    assert np.isfinite(train[0]["loss"]) and train[0]["tokens_per_sec"] > 0
    assert abs(train[0]["loss"] - train[0]["mlm_loss"] - train[0]["nsp_loss"]) < 1e-4
    assert evals and "eval_mlm_accuracy" in evals[0]
    assert os.path.isdir(workdir / "checkpoints" / "1")
    assert glob.glob(str(workdir / "tensorboard" / "events.out.tfevents.*"))
    config = json.loads((workdir / "config.json").read_text())
    assert config["model"]["hidden_size"] == 32 and config["batch_size"] == 8
    assert "parameters" in proc.stdout and "final:" in proc.stdout


def test_loss_falls_and_checkpoints_keep_last_k(tmp_path, corpus_and_tokenizer):
    workdir = tmp_path / "run"
    run_train(workdir, tiny_overrides(*corpus_and_tokenizer, num_train_steps=40, checkpoint_every=10,
                                      keep_checkpoints=2, **{"optimizer.learning_rate": 3e-3}))
    train, _ = read_metrics(workdir)
    assert [r["step"] for r in train] == list(range(1, 41))
    assert np.mean([r["loss"] for r in train[-5:]]) < np.mean([r["loss"] for r in train[:5]]) - 0.5
    assert sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit()) == [30, 40]
    lrs = [r["learning_rate"] for r in train]
    assert max(lrs) == pytest.approx(3e-3, rel=0.1) and lrs[-1] < lrs[10]  # warmup then decay


def test_checkpoint_round_trip_is_exact(tmp_path, corpus_and_tokenizer):
    """Save (async) -> restore through the Checkpointer gives bitwise the same state and data position."""
    from pretrain.workdir import checkpoints
    workdir = tmp_path / "run"
    run_train(workdir, tiny_overrides(*corpus_and_tokenizer, num_train_steps=3, checkpoint_every=3))
    step, saved = final_params(workdir)
    ckpt = checkpoints.Checkpointer(str(workdir / "copy"), save_every=1, keep=1)
    ckpt.save(step, saved, {"step": step, "epoch": 0})
    ckpt.wait()
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), saved)
    restored, position, restored_step = ckpt.restore(abstract)
    ckpt.close()
    assert restored_step == step and position == {"step": step, "epoch": 0}
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), saved, restored)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["text", "prepared"])
def test_sigkill_and_resume_ends_bitwise_equal(tmp_path, corpus_and_tokenizer, source):
    """Through data.source=prepared with Grain worker processes, too: the stream positions are checkpointed."""
    steps, every = 80, 10  # killed once checkpoint 20 exists: 60 steps of margin before the end
    corpus, spm_model = corpus_and_tokenizer
    extra = {}
    if source == "prepared":
        corpus = prepare_tiny_corpus(corpus, spm_model, tmp_path / "prepared")
        extra = {"data.source": "prepared", "data.workers": 1}
    flags = tiny_overrides(corpus, spm_model, num_train_steps=steps, checkpoint_every=every,
                           log_every=10, prefetch=2, **extra)
    reference = tmp_path / "uninterrupted"
    run_train(reference, flags)

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "pretrain.train", "--config=configs/bert.py:size=tiny",
           f"--workdir={killed}", *flags]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = killed / "checkpoints" / str(2 * every)
    deadline = time.time() + 300
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = sorted(int(d) for d in os.listdir(killed / "checkpoints") if d.isdigit())
    assert saved and saved[-1] < steps, f"the run was not killed mid-way (checkpoints {saved})"

    resumed = run_train(killed, flags)
    assert "Resumed from" in resumed.stdout
    _, a = final_params(reference, steps)
    _, b = final_params(killed, steps)
    leaves_a = [np.asarray(x) for x in jax.tree.leaves(a)]
    leaves_b = [np.asarray(x) for x in jax.tree.leaves(b)]
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(x, y)
    # metrics.jsonl has each step once even though the killed run logged past its checkpoint
    train, _ = read_metrics(killed)
    assert [r["step"] for r in train] == list(range(10, steps + 1, 10))


@pytest.mark.slow
def test_eight_fake_devices_match_one(tmp_path, corpus_and_tokenizer):
    """Data parallel over 8 devices, and data x fsdp x tensor = 2 x 2 x 2, give 1 device's losses."""
    flags = tiny_overrides(*corpus_and_tokenizer, num_train_steps=4, checkpoint_every=4)
    eight = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    run_train(tmp_path / "one", flags, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    proc = run_train(tmp_path / "dp", flags, env=eight)
    assert "'data': 8" in proc.stdout
    proc = run_train(tmp_path / "3d", flags + ["--config.mesh_shape=(2,2,2)"], env=eight)
    assert "'data': 2, 'fsdp': 2, 'tensor': 2" in proc.stdout
    loss_one = [r["loss"] for r in read_metrics(tmp_path / "one")[0]]
    assert len(loss_one) == 4
    for run in ("dp", "3d"):
        losses = [r["loss"] for r in read_metrics(tmp_path / run)[0]]
        np.testing.assert_allclose(losses, loss_one, rtol=0, atol=1e-5, err_msg=run)


def test_gradient_accumulation_matches_full_batch(tmp_path, corpus_and_tokenizer, one_step):
    """2 micro-batches of 4 give the same first-step loss as one batch of 8 (before any update)."""
    run_train(tmp_path / "accum", one_step_flags(corpus_and_tokenizer) + ["--config.grad_accum_steps=2"])
    full, accum = read_metrics(one_step[0])[0][0], read_metrics(tmp_path / "accum")[0][0]
    # MLM accuracy/loss are per-micro-batch means, so compare NSP (one label per sequence) exactly
    assert accum["nsp_loss"] == pytest.approx(full["nsp_loss"], abs=2e-2)
    assert accum["loss"] == pytest.approx(full["loss"], abs=5e-2)


def one_line_error(proc):
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[-1].startswith("error: ")
    return lines[-1]


def test_errors_are_one_line(tmp_path, corpus_and_tokenizer):
    corpus, spm = corpus_and_tokenizer
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    msg = one_line_error(run_train(tmp_path / "a", tiny_overrides(str(empty), spm), check=False))
    assert "empty" in msg and str(empty) in msg

    missing = tmp_path / "missing.txt"
    msg = one_line_error(run_train(tmp_path / "b", tiny_overrides(str(missing), spm), check=False))
    assert str(missing) in msg and "not found" in msg

    msg = one_line_error(run_train(tmp_path / "c", tiny_overrides(corpus, spm) + ["--config.model.hiden_size=3"],
                                   check=False))
    assert "hiden_size" in msg and "unknown config key" in msg

    msg = one_line_error(run_train(tmp_path / "d", tiny_overrides(corpus, spm, **{"model.vocab_size": 10}),
                                   check=False))
    assert "vocab_size" in msg


def test_checkpoint_of_another_shape_is_a_clear_error(tmp_path, corpus_and_tokenizer, one_step):
    workdir = tmp_path / "run"
    shutil.copytree(one_step[0], workdir)
    flags = one_step_flags(corpus_and_tokenizer)
    proc = run_train(workdir, flags + ["--config.model.hidden_size=64", "--config.num_train_steps=2"], check=False)
    msg = one_line_error(proc)
    assert "another model" in msg and "model.hidden_size: 32 -> 64" in msg and "config.json" in msg
    assert sorted(os.listdir(workdir / "checkpoints")) == ["1"]  # nothing new became the latest


def test_tfds_source_through_the_real_command(tmp_path, corpus_and_tokenizer):
    """A TFDS text dataset prepared offline (array_record) feeds the trainer by name."""
    import tensorflow_datasets as tfds
    corpus, spm = corpus_and_tokenizer
    with open(corpus) as f:
        documents = [d for d in f.read().split("\n\n") if d.strip()]

    with tfds.core.registered.skip_registration():
        class DemoDocuments(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")
            code_path = None  # a test builder has no package (and no checksums) to look up

            def _info(self):
                return tfds.core.DatasetInfo(
                    builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

            def _split_generators(self, dl_manager):
                return {"train": self._generate_examples()}

            def _generate_examples(self):
                yield from ((i, {"text": d}) for i, d in enumerate(documents))

    data_dir = tmp_path / "tfds"
    DemoDocuments(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    workdir = tmp_path / "run"
    run_train(workdir, tiny_overrides(corpus, spm, num_train_steps=2, checkpoint_every=2, **{
        "data.source": "tfds", "data.tfds_name": "demo_documents", "data.tfds_data_dir": str(data_dir),
        "data.path": "/nonexistent/ignored-for-tfds.txt"}))
    train, _ = read_metrics(workdir)
    assert [r["step"] for r in train] == [1, 2] and np.isfinite(train[-1]["loss"])
