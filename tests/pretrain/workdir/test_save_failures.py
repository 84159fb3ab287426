"""A checkpoint save the storage refuses (a full disk, a quota, a file-size limit): one line naming the step, the
cause and the checkpoint that stays the latest, a non-zero exit, nothing lost, and a rerun that resumes.

The end-to-end cases run the real commands: a file-size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a write
past it fails with EFBIG) always, and where user namespaces are allowed also a disk that is really full (ENOSPC:
a small tmpfs mounted in a mount namespace of the command's own).
"""
from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
import subprocess
import sys

import pytest

from pretrain.workdir import checkpoints, write_failures
from tests.helpers.commands import assert_no_leak, run_module, run_train, subprocess_env
from tests.helpers.paths import REPO, SHARED_DATA
from tests.helpers.tiny_bert import tiny_overrides

pytestmark = pytest.mark.slow  # the commands run as subprocesses


# ---------------------------------------------------------------------------------------------
# What counts as a storage that refused a write.
# ---------------------------------------------------------------------------------------------
def test_a_full_storage_is_found_anywhere_in_the_exception_chain():
    assert write_failures.write_failure(OSError(errno.ENOSPC, "No space left on device")).what == \
        "[Errno 28] No space left on device"
    tensorstore = ValueError('OUT_OF_RANGE: Error writing "x" ...: File too large [os_error_code=\'27\']')
    try:
        try:
            raise tensorstore
        except ValueError as e:
            raise RuntimeError("Save Finalize thread failed") from e
    except RuntimeError as chained:
        failure = write_failures.write_failure(chained)
    assert failure == write_failures.WriteFailure("[Errno 27] File too large", "raise the file-size limit (ulimit -f)")
    quota = ExceptionGroup("writes", [ValueError("other"), OSError(errno.EDQUOT, "Disk quota exceeded")])
    assert "quota" in write_failures.write_failure(quota).fix
    assert write_failures.write_failure(OSError(errno.EACCES, "Permission denied")) is None
    assert write_failures.write_failure(ValueError("a bug")) is None


def test_another_kind_of_write_failure_can_be_added(monkeypatch):
    """A storage whose errors are no OSErrors (a bucket's) adds its own recogniser."""
    class BucketQuota(Exception):
        pass
    monkeypatch.setattr(write_failures, "WRITE_FAILURE_KINDS", [*write_failures.WRITE_FAILURE_KINDS, lambda e: (
        write_failures.WriteFailure("bucket quota exceeded", "raise the bucket's quota") if isinstance(e, BucketQuota)
        else None)])
    with pytest.raises(checkpoints.CheckpointWriteError) as info:
        with checkpoints.write_failures_as_errors(4, "/nowhere/checkpoints"):
            raise RuntimeError("commit failed") from BucketQuota()
    assert str(info.value) == ("checkpoint 4 could not be written to /nowhere/checkpoints: bucket quota exceeded; "
                               "no earlier checkpoint there: raise the bucket's quota and rerun the same command")
    with pytest.raises(KeyError):  # anything else passes through untouched
        with checkpoints.write_failures_as_errors(4, "/nowhere/checkpoints"):
            raise KeyError("a bug")


# ---------------------------------------------------------------------------------------------
# Through the commands.
# ---------------------------------------------------------------------------------------------
def _tmpfs_in_a_namespace_works() -> bool:
    """Whether this machine lets an unprivileged process mount a tmpfs of its own (CI may not)."""
    if shutil.which("unshare") is None:
        return False
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d && rmdir $d"
    try:
        return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", probe],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# The file-size limit runs everywhere; a full tmpfs where user namespaces are allowed.
STORAGES = ["file-size limit"] + (["full disk"] if _tmpfs_in_a_namespace_works() else [])
FIX = {"file-size limit": (r"\[Errno 27\] File too large", r"raise the file-size limit \(ulimit -f\)"),
       "full disk": (r"\[Errno 28\] No space left on device", "free space on that disk")}


# The tiny BERT's word embeddings alone (1000 x 32 float32, 128 KB, and as many again for each of Adam's moments)
# are larger, and Orbax keeps an array in one file however it groups them; every other file the runs write
# (metrics.jsonl, TensorBoard's events, config.json, predictions) stays far below.
FILE_SIZE_LIMIT = 64 * 1024


def _limited(limit: int):
    """preexec_fn: the child's files may not grow past `limit` bytes."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _run_on_full_disk(command: list[str], workdir, free_kib: int) -> subprocess.CompletedProcess:
    """`command --workdir=W` where W is a copy of `workdir` on a tmpfs with `free_kib` KiB free, mounted in a
    mount namespace of its own (gone with the command); W comes back into `workdir` afterwards."""
    size = int(subprocess.check_output(["du", "-sk", str(workdir)]).split()[0]) + free_kib
    mount_point = os.path.join(os.path.dirname(workdir), "mnt")
    os.makedirs(mount_point)
    script = """workdir=$0 size=$1 mnt=$2; shift 2
mount -t tmpfs -o size="$size"k tmpfs "$mnt" && cp -a "$workdir" "$mnt/run" || exit 99
"$@" --workdir="$mnt/run"; status=$?
rm -rf "$workdir" && cp -a "$mnt/run" "$workdir" || exit 98
exit $status"""
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, str(workdir),
                           str(size), mount_point, *command], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=600)


def _env() -> dict:
    # No compilation cache: whether its entries fit under the limit would depend on what earlier tests left there.
    return subprocess_env({"LMPRETRAIN_COMPILATION_CACHE": "off"})


def _assert_one_line(proc: subprocess.CompletedProcess, pattern: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "orbax" not in proc.stderr.lower(), proc.stderr[-3000:]
    assert_no_leak(proc.stderr)
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(pattern, last), last


def _under_the_file_size_limit(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600,
                          preexec_fn=_limited(FILE_SIZE_LIMIT))


def _refused_at_6(workdir, storage: str) -> str:
    """The one line of a run whose checkpoint 6 the storage refused, after checkpoint 3."""
    what, fix = FIX[storage]
    return (rf"error: checkpoint 6 could not be written to {re.escape(str(workdir / 'checkpoints'))}: {what}; "
            rf"checkpoint 3 stays the latest: {fix} and rerun the same command to resume")


def _train_steps(workdir) -> list[int]:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if "grad_norm" in r]  # the training records, not the held-out ones


def _leftovers(workdir) -> list[str]:
    return [os.path.join(root, d) for root, dirs, _ in os.walk(workdir) for d in dirs if "orbax-checkpoint-tmp" in d]


@pytest.mark.parametrize("storage", STORAGES)
def test_a_refused_save_is_one_line_and_the_rerun_resumes_from_the_checkpoint_before(
        tmp_path, corpus_and_tokenizer, storage):
    """The run has checkpoint 3; its save at step 6 fails. With 9 steps the error comes out of Orbax's thread at the
    step-9 save, with 6 at the close: both paths end in the same line."""
    workdir = tmp_path / "run"
    flags = tiny_overrides(*corpus_and_tokenizer, checkpoint_every=3, num_train_steps=9)
    run_train(workdir, [*flags, "--config.num_train_steps=3"])
    assert os.listdir(workdir / "checkpoints") == ["3"]
    command = [sys.executable, "-m", "pretrain.train", "--config=configs/bert.py:size=tiny", *flags]
    if storage == "file-size limit":
        failed = _under_the_file_size_limit([*command, f"--workdir={workdir}"])
        shown = workdir
    else:  # room for the metrics and the logs of 6 more steps, not for a checkpoint
        failed = _run_on_full_disk([*command[:-1], "--config.num_train_steps=6"], workdir, free_kib=300)
        shown = tmp_path / "mnt" / "run"
    _assert_one_line(failed, _refused_at_6(shown, storage))
    assert os.listdir(workdir / "checkpoints") == ["3"] and not _leftovers(workdir)  # nothing half-written stays
    assert _train_steps(workdir)[-1] >= 6  # the metrics up to the failure are kept

    rerun = run_train(workdir, flags)
    assert f"Resumed from {workdir / 'checkpoints'}/3" in rerun.stdout
    assert sorted(int(s) for s in os.listdir(workdir / "checkpoints")) == [3, 6, 9] and not _leftovers(workdir)
    assert _train_steps(workdir) == list(range(1, 10))  # the failed run's records after step 3 were redone


def test_a_refused_fine_tuning_save_is_one_line_and_the_rerun_finishes(tmp_path, tiny_bert_workdir):
    """pretrain.finetune's resume/ checkpoint at step 4 fails; the error comes out at the step-8 save."""
    args = ["--config=configs/glue.py:task=wnli", f"--config.init={tiny_bert_workdir}",
            f"--config.data.glue_dir={os.path.join(SHARED_DATA, 'glue')}", "--config.batch_size=4",
            "--config.data.max_train_examples=32", "--config.num_epochs=2", "--config.data.max_seq_length=32",
            "--config.write_test_predictions=False", "--config.checkpoint_every=4"]
    workdir = tmp_path / "ft"
    failed = _under_the_file_size_limit([sys.executable, "-m", "pretrain.finetune", f"--workdir={workdir}", *args])
    _assert_one_line(failed, rf"error: checkpoint 4 could not be written to {re.escape(str(workdir / 'resume'))}: "
                             r"\[Errno 27\] File too large; no earlier checkpoint there: raise the file-size limit "
                             r"\(ulimit -f\) and rerun the same command")
    assert not _leftovers(workdir) and not (workdir / "results.json").exists()

    run_module("pretrain.finetune", [f"--workdir={workdir}", *args])
    assert json.loads((workdir / "results.json").read_text())["best_epoch"] in (1, 2)
    assert not _leftovers(workdir)


REPEATS = 20


@pytest.mark.long
def test_a_refused_save_is_one_line_twenty_times_in_a_row(tmp_path, corpus_and_tokenizer):
    """The same refused save, REPEATS runs from the same checkpoint: its one line must not depend on the order in
    which Orbax's threads, the writers' threads and the garbage collector end (a warning after the line did, once).
    test_a_refused_save_is_one_line_and_the_rerun_resumes_from_the_checkpoint_before covers it once in `make test`."""
    flags = tiny_overrides(*corpus_and_tokenizer, checkpoint_every=3, num_train_steps=9)
    first = tmp_path / "first"
    run_train(first, [*flags, "--config.num_train_steps=3"])
    command = [sys.executable, "-m", "pretrain.train", "--config=configs/bert.py:size=tiny", *flags]
    workdir = tmp_path / "run"
    for _ in range(REPEATS):
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.copytree(first, workdir)
        _assert_one_line(_under_the_file_size_limit([*command, f"--workdir={workdir}"]),
                         _refused_at_6(workdir, "file-size limit"))
        assert os.listdir(workdir / "checkpoints") == ["3"] and not _leftovers(workdir)
