"""A gs:// workdir against a GCS-protocol server on loopback (scripts/bench/gcs_server.py, the `gcs_server`
fixture): the workdir's own files (config.json, results.json, predictions, metrics.jsonl, the checkpoint
folders' markers) go to the bucket through pretrain.workdir.storage, never to a local folder 'gs:'.
The whole commands on gs:// are in tests/pretrain/commands/test_gcs_workdir.py.
"""
from __future__ import annotations

import json
import os

import fsspec
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils.epath import backend as epath_backend
from fsspec.registry import _registry, known_implementations

from configs import glue as glue_config
from pretrain.loops import evaluation, finetuning
from pretrain.runtime.errors import UserError
from pretrain.tasks.glue import data as glue
from pretrain.tasks.glue.task import write_dev_predictions
from pretrain.training import peft as parameter_efficient
from pretrain.training import pretrained
from pretrain.workdir import checkpoints, metric_writers, storage
from pretrain.workdir import run_files as workdir

pytestmark = pytest.mark.slow  # the gcs_server fixture starts the server, a process of its own


@pytest.fixture
def run(gs_run, monkeypatch, tmp_path):
    """This test's gs:// workdir; the working directory is an empty tmp_path (checked at the end)."""
    monkeypatch.chdir(tmp_path)
    yield gs_run
    assert os.listdir(tmp_path) == [], "a gs:// path became a local file or folder"


def objects(prefix: str) -> list[str]:
    """The object names under gs:// `prefix`, relative to it."""
    filesystem, root = fsspec.core.url_to_fs(prefix)
    return sorted(name[len(root.rstrip("/")) + 1:] for name in filesystem.find(root))


def test_prepare_on_a_bucket_creates_no_local_folder(run, tmp_path):
    assert workdir.prepare(run + "/") == run
    assert workdir.prepare(run) == run  # again: an existing workdir
    storage.write_atomic(run + "/file", "x")
    with pytest.raises(UserError, match="is a file, not a directory"):
        workdir.prepare(run + "/file")
    local = str(tmp_path.parent / "local")
    assert workdir.prepare(local) == local  # a local path is as before


def test_config_and_results_round_trip_through_the_bucket(run):
    run = workdir.prepare(run)
    config = ml_collections.ConfigDict({"seed": 1, "model": {"name": "bert"}, "num_train_steps": 10})
    workdir.save_config(run, config)
    assert workdir.stored_config(run) == config.to_dict()
    changed = ml_collections.ConfigDict({"seed": 1, "model": {"name": "bert"}, "num_train_steps": 20})
    assert workdir.check_resume(run, changed) == ["num_train_steps"]
    workdir.write_json_atomic(f"{run}/results.json", {"best_score": 0.5})
    assert json.loads(storage.read_text(f"{run}/results.json")) == {"best_score": 0.5}
    assert objects(run) == ["config.json", "results.json"]  # no temporary objects


def test_metrics_jsonl_on_a_bucket_uploads_and_drops_records_after_resume(run, monkeypatch, capsys):
    monkeypatch.setattr(metric_writers, "FLUSH_SECS", 1e9)
    path = f"{run}/metrics.jsonl"

    def steps():
        return [json.loads(line)["step"] for line in storage.read_text(path).splitlines()]

    writer = metric_writers.MetricWriter(run)
    for step in (1, 2, 3):
        writer.write(step, {"loss": float(step)})
    assert not storage.exists(path)  # not yet uploaded: a kill now would lose these lines, no file
    writer.jsonl.flush()
    assert steps() == [1, 2, 3]
    writer.write(4, {"loss": float("nan")})
    writer.close()
    assert storage.read_text(path).splitlines()[-1] == '{"step": 4, "loss": null}'

    writer = metric_writers.MetricWriter(run, resume_step=2)  # a run resumed from its checkpoint at step 2
    assert steps() == [1, 2]
    writer.write(3, {"loss": 3.5}, prefix="eval")
    writer.close()
    assert steps() == [1, 2, 3] and json.loads(storage.read_text(path).splitlines()[-1])["eval_loss"] == 3.5

    storage.write_atomic(path, storage.read_text(path) + '{"step": 4, "lo')  # cut mid-line
    monkeypatch.setattr(metric_writers, "FLUSH_SECS", 0.0)  # every line uploaded at once
    writer = metric_writers.MetricWriter(run, resume_step=3)
    assert "metrics.jsonl:4 is not a JSON record" in capsys.readouterr().err
    writer.write(4, {"loss": 4.0})
    assert steps() == [1, 2, 3, 4]
    writer.close()


def checkpoint_folder(directory: str, step: int, committed: bool = True) -> None:
    """The folders and markers Orbax writes for a step in a bucket (commit_success.txt once it is complete)."""
    folder = f"{directory}/{step}"
    metadata = {"commit_timestamp_nsecs": 1} if committed else {}
    storage.write_atomic(f"{folder}/_CHECKPOINT_METADATA", json.dumps(metadata))
    if committed:
        storage.write_atomic(f"{folder}/commit_success.txt", "")
    for item in checkpoints.ITEMS:
        storage.write_atomic(f"{folder}/{item}/_METADATA", "{}")


def test_checkpoint_folders_on_a_bucket(run):
    directory = f"{run}/checkpoints"
    checkpoint_folder(directory, 1)
    checkpoint_folder(directory, 2, committed=False)
    storage.write_atomic(f"{directory}/3.orbax-checkpoint-tmp-7/state/x", "x")
    assert checkpoints.step_problem(directory, 1) is None
    assert checkpoints.step_problem(directory, 2) == "no commit marker (the save did not finish)"
    assert checkpoints.step_problem(directory, 5) == "no such folder"
    assert ocp.utils.checkpoint_steps(directory) == [1]  # Orbax's own listing: the committed steps
    with pytest.raises(checkpoints.CheckpointError, match=f"no checkpoint at step 7 in {directory} "):
        checkpoints.restore_params(directory, step=7)

    checkpoints.set_aside(directory, [2])  # restore() skipped step 2: the first save moves it aside
    assert sorted(storage.listdir(directory)) == ["1", "2.unusable"]
    checkpoint_folder(directory, 2, committed=False)
    checkpoints.set_aside(directory, [2])
    assert sorted(storage.listdir(directory)) == ["1", "2.unusable", "2.unusable1"]
    assert objects(f"{directory}/2.unusable1") == ["_CHECKPOINT_METADATA", "data/_METADATA",
                                                              "state/_METADATA"]


def test_finetuning_files_on_a_bucket(run):
    run = workdir.prepare(run)
    task = glue.get_task("mrpc")
    ids, predictions, labels = np.array([0, 1]), np.array([1, 0]), np.array([1, 1])
    write_dev_predictions(f"{run}/predictions/validation.tsv", task, ids, predictions, labels)
    path = glue.write_submission(task, "test", [1, 0], [0, 1], f"{run}/predictions")
    assert path == f"{run}/predictions/MRPC.tsv"
    assert storage.read_text(path).splitlines()[1:] == ["0\t1", "1\t0"]
    assert storage.read_text(f"{run}/predictions/validation.tsv").splitlines()[0] == "index\tprediction\tlabel"

    storage.write_atomic(f"{run}/config.json", json.dumps({"task": "mrpc", "model": {"name": "bert"}}))
    assert evaluation._finetuning_config(run).task == "mrpc"  # what pretrain.evaluate reads first
    assert parameter_efficient.peft_workdir(run) is None  # not a PEFT run
    workdir.write_json_atomic(f"{run}/results.json", {"best_score": 0.75})
    assert finetuning.finetune(glue_config.get_config("task=mrpc"), run) == {"best_score": 0.75}  # finished

    with pytest.raises(UserError, match="neither a pretrain.train workdir"):
        pretrained.load_pretrained(run)  # config.json but no checkpoints/
    with pytest.raises(UserError, match="does not exist"):
        pretrained.load_pretrained("gs://bucket/none")


def one_line_error(call) -> str:
    with pytest.raises(UserError) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


def test_unsupported_urls_are_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "ftp:// is not supported" in one_line_error(lambda: workdir.prepare("ftp://x/y"))
    # No gs:// filesystem installed (gcsfs missing), whatever this machine has.
    monkeypatch.delitem(_registry, "gcs", raising=False)
    monkeypatch.setitem(known_implementations, "gcs",
                        {"class": "no_gcsfs_here.GCSFileSystem", "err": "Please install gcsfs"})
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    assert "needs gcsfs" in one_line_error(lambda: workdir.prepare("gs://bucket/run"))
    assert "--config.init=gs://b/x needs gcsfs" in one_line_error(lambda: pretrained.load_pretrained("gs://b/x"))
    assert "needs gcsfs" in one_line_error(lambda: evaluation._finetuning_config("gs://b/x"))
    assert "needs gcsfs" in one_line_error(lambda: storage.exists("gs://b/x"))
    assert os.listdir(tmp_path) == []


def test_appending_to_an_object_uploads_the_new_bytes_only(run, through_proxy):
    path = f"{run}/metrics.jsonl"
    storage.append(path, "x" * 200_000 + "\n")
    before = through_proxy.sent
    storage.append(path, "one more line\n")
    sent = through_proxy.sent - before
    assert sent < 10_000, f"appending 14 bytes to a 200 kB object sent {sent} bytes"
    assert storage.read_text(path) == "x" * 200_000 + "\none more line\n"
    assert objects(run) == ["metrics.jsonl"]  # the tail object is gone
