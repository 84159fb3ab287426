"""After a SIGKILL, what Grain's data workers leave (the named semaphores of their queues, the shared memory of the
windows in flight) is unlinked by multiprocessing's resource tracker without its "leaked ... objects" warning, which
reached the console of the run and of its rerun (pretrain/runtime/children.py: quiet_resource_tracker)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scripts.bench import kill9_harness as harness
from tests.helpers.paths import REPO
from tests.helpers.tiny_bert import prepare_tiny_corpus, tiny_overrides


def _shared_memory() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.slow
def test_a_sigkilled_run_with_data_workers_warns_of_no_leak(tmp_path, corpus_and_tokenizer):
    """Its stderr read to the end, as the console of a supervisor that reruns it shows it: what the workers and the
    tracker print after the kill included."""
    corpus = prepare_tiny_corpus(*corpus_and_tokenizer, tmp_path / "prepared")
    flags = tiny_overrides(corpus, corpus_and_tokenizer[1], num_train_steps=100_000, log_every=1,
                           **{"data.source": "prepared", "data.workers": 2})
    command = harness.Command("pretraining", "pretrain.train", ("--config=configs/bert.py:size=tiny", *flags))
    before = _shared_memory()
    # 10 records on: the workers' buffers are full, windows in flight in shared memory
    moment = harness.Moment("anywhere", 0.0, anchor="record:9", after=0.0)
    killed, stderr = harness.kill_at(command, str(tmp_path / "run"), moment)
    assert killed and "Traceback" not in stderr, stderr[-2000:]
    assert harness.leak_lines(stderr) == [], stderr[-2000:]
    assert not {name for name in _shared_memory() - before if name.startswith("psm_")}  # unlinked all the same


# A process that leaves a shared memory segment registered and exits without its clean-up, as a SIGKILL would.
LEAVES_A_SEGMENT = """
import os, sys
from multiprocessing import shared_memory
from pretrain.runtime import children
if sys.argv[1] == "quiet":
    children.quiet_resource_tracker()
segment = shared_memory.SharedMemory(create=True, size=64)
print(segment.name, flush=True)
os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("tracker", ["quiet", "stock"])
def test_the_quiet_tracker_unlinks_what_a_dead_process_left_without_a_warning(tracker):
    proc = subprocess.run([sys.executable, "-c", LEAVES_A_SEGMENT, tracker], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # its stderr read to the end: the tracker's included
    name = proc.stdout.strip().lstrip("/")
    assert name and not os.path.exists(f"/dev/shm/{name}"), proc.stderr  # unlinked either way
    assert bool(harness.leak_lines(proc.stderr)) == (tracker == "stock"), proc.stderr
