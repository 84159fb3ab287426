"""After a SIGKILL, what Grain's data workers leave (the named semaphores of their queues, the shared memory of the
windows in flight) is unlinked by multiprocessing's resource tracker without its "leaked ... objects" warning, which
reached the console of the run and of its rerun (pretrain/runtime/children.py: quiet_resource_tracker)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pretrain.runtime import children
from scripts.bench import kill9_harness as harness
from tests.helpers.paths import REPO
from tests.helpers.tiny_bert import prepare_tiny_corpus, tiny_overrides


def _shared_memory() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.slow
def test_a_sigkilled_run_with_data_workers_and_its_killed_rerun_warn_of_no_leak(tmp_path, corpus_and_tokenizer):
    corpus = prepare_tiny_corpus(*corpus_and_tokenizer, tmp_path / "prepared")
    flags = tiny_overrides(corpus, corpus_and_tokenizer[1], num_train_steps=100_000, log_every=1,
                           **{"data.source": "prepared", "data.workers": 2})
    command = harness.Command("pretraining", "pretrain.train", ("--config=configs/bert.py:size=tiny", *flags))
    before = _shared_memory()
    for records in (20, 40):  # the run, then its rerun (resumed from its latest checkpoint), each killed mid-way
        moment = harness.Moment("anywhere", 0.0, anchor=f"record:{records - 1}", after=0.0)
        killed, stderr = harness.kill_at(command, str(tmp_path / "run"), moment)  # stderr read to its end
        assert killed and "Traceback" not in stderr, stderr[-2000:]
        assert harness.leak_lines(stderr) == [], stderr[-2000:]
    assert not {name for name in _shared_memory() - before if name.startswith("psm_")}  # unlinked all the same


@pytest.mark.slow
def test_the_quiet_tracker_runs_with_its_warnings_off_and_an_earlier_one_is_kept():
    code = ("import sys; from multiprocessing import resource_tracker as rt; from pretrain.runtime import children; "
            "children.quiet_resource_tracker(); pid = rt._resource_tracker._pid; children.quiet_resource_tracker(); "
            "print(pid == rt._resource_tracker._pid, sys.warnoptions == []); "
            "print(open(f'/proc/{pid}/cmdline').read().split(chr(0)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    once, command_line = proc.stdout.splitlines()
    assert once == "True True", proc.stderr  # started once; this process's own warning options untouched
    assert f"-W{children.QUIET_TRACKER}" in command_line
