"""One writer per workdir (pretrain/core/workdir_lock.py): a second holder is refused with one line naming the
first; a lock whose process is gone is taken over; the lock goes when its run ends, however it ends."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from pretrain.core import workdir_lock
from pretrain.core.errors import UserError
from tests.helpers.commands import subprocess_env


HOLDER = ("import sys\nfrom pretrain.core import workdir_lock\nwith workdir_lock.hold(sys.argv[1]):\n"
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
