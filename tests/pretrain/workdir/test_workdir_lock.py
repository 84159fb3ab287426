"""One writer per workdir (pretrain/workdir/lock.py): a second holder is refused with one line naming the
first; a lock whose process is gone is taken over; the lock goes when its run ends, however it ends."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from pretrain.runtime.errors import UserError
from pretrain.workdir import lock as workdir_lock
from tests.helpers.commands import subprocess_env

HOLDER = ("import sys\nfrom pretrain.workdir import lock\nwith lock.hold(sys.argv[1]):\n"
          "    print('held', flush=True)\n    sys.stdin.read()\n")


def _unused_pid() -> int:
    """A pid no process has (the highest free one below the kernel's limit)."""
    with open("/proc/sys/kernel/pid_max") as f:
        pid = int(f.read()) - 1
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


@pytest.mark.slow  # the first run is another process
def test_a_second_writer_is_refused_naming_the_holder_and_the_lock_goes_after(tmp_path):
    lock = tmp_path / workdir_lock.LOCK_FILE
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        assert first.stdout.readline() == "held\n"
        holder = json.loads(lock.read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
        with pytest.raises(UserError, match=f"is in use by pid {first.pid} on {socket.gethostname()}") as e:
            with workdir_lock.hold(str(tmp_path)):
                pass
        assert "\n" not in str(e.value)
        assert json.loads(lock.read_text()) == holder  # the refused one changed nothing
    finally:
        first.communicate("", timeout=60)
    assert first.returncode == 0 and not lock.exists()  # the first run's end let go


def test_the_lock_goes_when_its_run_fails(tmp_path):
    with pytest.raises(RuntimeError):
        with workdir_lock.hold(str(tmp_path)):
            assert (tmp_path / workdir_lock.LOCK_FILE).exists()
            raise RuntimeError("the run failed")
    assert not (tmp_path / workdir_lock.LOCK_FILE).exists()


def test_a_dead_process_lock_is_taken_over_and_another_hosts_is_not(tmp_path):
    lock = tmp_path / workdir_lock.LOCK_FILE
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": _unused_pid(), "since": "earlier"}))
    with workdir_lock.hold(str(tmp_path)):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    lock.write_text(json.dumps({"host": "another-host", "pid": _unused_pid(), "since": "earlier"}))
    with pytest.raises(UserError, match=f"on another-host .*delete {lock}"):
        with workdir_lock.hold(str(tmp_path)):
            pass


def test_an_unwritten_lock_is_held_until_its_grace_time_passes(tmp_path):
    lock = tmp_path / workdir_lock.LOCK_FILE
    lock.write_text("")
    with pytest.raises(UserError, match="is being claimed by another run"):
        with workdir_lock.hold(str(tmp_path)):
            pass
    old = os.path.getmtime(lock) - workdir_lock.UNWRITTEN_GRACE_SEC - 1
    os.utime(lock, (old, old))
    with workdir_lock.hold(str(tmp_path)):
        assert json.loads(lock.read_text())["pid"] == os.getpid()


@pytest.mark.slow  # the gcs_server fixture starts the GCS-protocol server, a process of its own
def test_a_bucket_lock_refuses_a_second_writer_and_is_stale_once_its_heartbeat_stops(gs_run, monkeypatch):
    from pretrain.workdir import storage
    lock = f"{gs_run}/{workdir_lock.LOCK_FILE}"
    with workdir_lock.hold(gs_run):
        holder = json.loads(storage.read_text(lock))
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        # A fresh lock of another host's run: nobody can ask whether it lives, so it holds until it goes stale.
        storage.write_atomic(lock, json.dumps({**holder, "pid": 1, "host": "another-host"}))
        with pytest.raises(UserError, match="is in use by pid 1 on another-host .*stale after 5 minutes") as e:
            with workdir_lock.hold(gs_run):
                pass
        assert "\n" not in str(e.value)
        storage.write_atomic(lock, json.dumps(holder))
    assert not storage.exists(lock)  # let go at the end

    storage.write_atomic(lock, json.dumps({"host": "another-host", "pid": 7, "since": "earlier"}))
    monkeypatch.setattr(workdir_lock, "STALE_SEC", -1.0)  # its last rewrite is older than that: a gone run's
    with workdir_lock.hold(gs_run):
        assert json.loads(storage.read_text(lock))["pid"] == os.getpid()
    storage.write_atomic(lock, json.dumps({"host": socket.gethostname(), "pid": _unused_pid(), "since": "x"}))
    monkeypatch.setattr(workdir_lock, "STALE_SEC", 300.0)
    with workdir_lock.hold(gs_run):  # this host's dead process: stale at once
        assert json.loads(storage.read_text(lock))["pid"] == os.getpid()


@pytest.mark.slow  # the gcs_server fixture starts the GCS-protocol server
def test_a_bucket_lock_is_rewritten_while_its_run_lives(gs_run, monkeypatch):
    import time

    import fsspec
    monkeypatch.setattr(workdir_lock, "HEARTBEAT_SEC", 0.2)
    filesystem, name = fsspec.core.url_to_fs(f"{gs_run}/{workdir_lock.LOCK_FILE}")
    with workdir_lock.hold(gs_run):
        first = filesystem.modified(name)
        time.sleep(1.5)
        assert filesystem.modified(name) > first
