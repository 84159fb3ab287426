"""No process left behind: what a command started ends with it, even when the command is SIGKILLed (an out-of-memory
kill, a preemptible VM's hard stop), so that a supervisor restarting it in a loop does not pile up workers."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pretrain.runtime import children
from tests.helpers.commands import subprocess_env
from tests.helpers.paths import REPO, SHARED_DATA
from tests.helpers.tiny_bert import prepare_tiny_corpus, tiny_overrides

GRACE_SECONDS = 5.0


def _alive(pids) -> list[psutil.Process]:
    alive = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            pass
    return alive


def _in_group(pgid: int) -> list[int]:
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid:
                found.append(process.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return found


def _records(path) -> int:
    return len(pathlib.Path(path).read_text().splitlines()) if os.path.exists(path) else 0


def _sigkill_once_it_has(command: list[str], descendants: int, ready) -> list[list[str]]:
    """Starts `command` in a process group of its own, SIGKILLs it once it has `descendants` descendants and
    `ready()` is true; -> the command lines of the processes still alive GRACE_SECONDS later, of the descendants
    seen before the kill and of the group's (then killed, not to burden the rest of the suite)."""
    proc = subprocess.Popen(command, cwd=REPO, env=subprocess_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, seen = time.time() + 300, []
    while proc.poll() is None and time.time() < deadline:
        seen = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        if len(seen) >= descendants and ready():
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the command ended ({proc.returncode}) before it could be killed"
    assert len(seen) >= descendants, f"{len(seen)} descendants, not {descendants}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(GRACE_SECONDS)
    left = _alive(set(seen) | set(_in_group(proc.pid)))
    lines = [p.cmdline() for p in left]
    for process in left:
        process.kill()
    return lines


@pytest.mark.slow
def test_a_sigkilled_pretraining_leaves_no_grain_worker_or_resource_tracker(tmp_path, corpus_and_tokenizer):
    corpus = prepare_tiny_corpus(*corpus_and_tokenizer, tmp_path / "prepared")
    workdir = tmp_path / "run"
    flags = tiny_overrides(corpus, corpus_and_tokenizer[1], num_train_steps=100_000, log_every=1,
                           **{"data.source": "prepared", "data.workers": 2})
    command = [sys.executable, "-m", "pretrain.train", "--config=configs/bert.py:size=tiny", f"--workdir={workdir}",
               *flags]
    # two Grain workers and multiprocessing's resource tracker, 30 steps on: the workers' buffers are full, and
    # a worker whose parent is gone would wait forever to put its next window
    left = _sigkill_once_it_has(command, 3, lambda: _records(workdir / "metrics.jsonl") >= 30)
    assert left == [], f"alive {GRACE_SECONDS} s after the SIGKILL: {left}"


@pytest.mark.slow
def test_a_sigkilled_fine_tuning_leaves_no_process(tmp_path, tiny_bert_workdir):
    workdir = tmp_path / "ft"
    command = [sys.executable, "-m", "pretrain.finetune", f"--workdir={workdir}", "--config=configs/glue.py:task=wnli",
               f"--config.init={tiny_bert_workdir}", f"--config.data.glue_dir={os.path.join(SHARED_DATA, 'glue')}",
               "--config.batch_size=4", "--config.num_epochs=100", "--config.data.max_seq_length=32",
               "--config.log_every=1"]
    left = _sigkill_once_it_has(command, 0, lambda: _records(workdir / "metrics.jsonl") >= 5)
    assert left == [], f"alive {GRACE_SECONDS} s after the SIGKILL: {left}"


@pytest.mark.slow
def test_a_command_started_with_popen_options_gets_sigterm_when_its_parent_is_sigkilled():
    """The sweep's cells and the launcher's gcloud: PR_SET_PDEATHSIG, here with a parent that is SIGKILLed."""
    parent = ("import subprocess, sys, time; from pretrain.runtime import children; "
              "child = subprocess.Popen([sys.executable, '-c', "
              "'import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(75)); time.sleep(60)'], "
              "**children.popen_options()); print(child.pid, flush=True); time.sleep(60)")
    with subprocess.Popen([sys.executable, "-c", parent], cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
        child = psutil.Process(int(proc.stdout.readline()))
        proc.kill()
    assert child.wait(timeout=GRACE_SECONDS) is None  # reaped by init: its status is not ours to read
    assert not child.is_running()


@pytest.mark.slow
def test_a_worker_ends_once_its_parent_is_gone():
    """exit_with_parent in a process whose recorded parent is not its parent: it ends within a few polls."""
    code = "import time; from pretrain.runtime import children; children.exit_with_parent(1); time.sleep(30)"
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=30)
    assert proc.returncode == 1 and time.time() - started < 10 * children.PARENT_POLL_SECONDS + 5
