"""Every stop answered: a SIGTERM or Ctrl-C from a command's first import to its last flush ends it with one line and
75 (130), never Python's silent 143, and the same command then starts or finishes the run cleanly."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from pretrain.runtime import errors, stops
from pretrain.workdir import checkpoints
from tests.helpers.commands import run_train, subprocess_env
from tests.helpers.paths import REPO
from tests.helpers.tiny_bert import tiny_overrides

pytestmark = pytest.mark.slow  # the commands run as subprocesses


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (/proc's SigCgt mask; stops.answer_from_start sets it last)."""
    with open(f"/proc/{pid}/status") as status:
        caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def _signal_while_importing(command: list[str], sig: int) -> tuple[int, list[str]]:
    """`sig` to `command` as soon as its entry point answers signals: while its imports (absl, JAX) still run.
    -> (exit status, stderr's non-empty lines)."""
    proc = subprocess.Popen(command, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 60
    while proc.poll() is None and not _catches_sigterm(proc.pid) and time.time() < deadline:
        time.sleep(0.001)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, [line for line in err.splitlines() if line.strip()]


def test_a_signal_while_the_command_imports_is_one_line_and_the_rerun_starts_cleanly(
        tmp_path, corpus_and_tokenizer, terminal_sigint):
    workdir = tmp_path / "run"
    flags = tiny_overrides(*corpus_and_tokenizer, num_train_steps=2)
    command = [sys.executable, "-m", "pretrain.train", "--config=configs/bert.py:size=tiny", f"--workdir={workdir}",
               *flags]
    assert _signal_while_importing(command, signal.SIGTERM) == (
        errors.EXIT_PREEMPTED, [stops.TERMINATED_LINE.format(signal="SIGTERM")])
    assert _signal_while_importing(command, signal.SIGINT) == (stops.EXIT_INTERRUPTED, [stops.INTERRUPTED_LINE])
    assert not workdir.exists()
    run_train(workdir, flags)
    assert checkpoints.latest_complete_step(str(workdir / "checkpoints")) == 2


# pretrain.train with a SIGTERM sent to itself when the loop closes its checkpointer with the final save in flight.
SIGTERM_DURING_THE_FINAL_SAVE = """
import os, runpy, signal, sys
from pretrain.runtime import stops
stops.answer_from_start()
from pretrain.workdir import checkpoints

close = checkpoints.Checkpointer.close
def close_with_a_sigterm(self):
    if self._in_flight is not None:
        print(f"SIGTERM during the save of step {self._in_flight}", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
    close(self)

checkpoints.Checkpointer.close = close_with_a_sigterm
runpy.run_module("pretrain.train", run_name="__main__")
"""


def test_a_sigterm_during_the_final_save_finishes_it_then_exits_75(tmp_path, corpus_and_tokenizer):
    workdir = tmp_path / "run"
    args = ["--config=configs/bert.py:size=tiny", f"--workdir={workdir}",
            *tiny_overrides(*corpus_and_tokenizer, num_train_steps=4, checkpoint_every=2)]
    proc = subprocess.run([sys.executable, "-c", SIGTERM_DURING_THE_FINAL_SAVE, *args], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert "SIGTERM during the save of step 4" in proc.stdout, proc.stdout[-2000:]
    assert proc.returncode == errors.EXIT_PREEMPTED and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-2:] == ["SIGTERM: finishing the final checkpoint and outputs, then exiting (send it again to stop "
                          "at once)", str(errors.StoppedAfterLastStep("SIGTERM"))], lines
    assert checkpoints.latest_complete_step(str(workdir / "checkpoints")) == 4  # the save was let to complete
    rerun = run_train(workdir, args[2:])
    assert "Nothing to do: the checkpoint at step 4 already reaches config.num_train_steps=4" in rerun.stdout
