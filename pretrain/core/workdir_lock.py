"""One writer per workdir: WORKDIR/.lock names the run that holds it (host, pid, start time).

A second `pretrain.train` or `pretrain.finetune` on the same workdir would interleave checkpoints and
metrics; it is refused with one line naming the holder instead. A lock whose process is gone (a run
killed outright on this host) is stale and taken over, as the resume it precedes expects. Only the
primary process of a run takes it (its other processes write through the primary), and only on a local
or mounted filesystem: a gs:// workdir has no atomic create-if-absent that this code uses, and no way to
see whether another host's process lives, so a bucket is not locked.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from typing import Iterator

from pretrain.core import distributed, storage
from pretrain.core.errors import UserError

LOCK_FILE = ".lock"
UNWRITTEN_GRACE_SEC = 10.0  # a lock file still empty this long after its creation was left by a crash


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[None]:
    """WORKDIR/.lock is this process's while the block runs, and removed after it, however it ends."""
    if storage.is_url(workdir) or not distributed.is_primary():
        yield
        return
    path = os.path.join(workdir, LOCK_FILE)
    _take(path, workdir)
    try:
        yield
    finally:
        if (_read(path) or {}).get("pid") == os.getpid():
            os.remove(path)


def _take(path: str, workdir: str) -> None:
    me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(2):  # a stale lock is removed once, then created again
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            holder = _read(path)
            if not _stale(path, holder):
                raise UserError(_held_message(workdir, path, holder)) from None
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return
    raise UserError(f"--workdir={workdir}: another run took {path} at the same moment; run one command per workdir")


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _stale(path: str, holder: dict | None) -> bool:
    """Whether the lock's process is gone: on this host, no process has its pid; an unreadable lock, when it has
    stayed unwritten past the grace time. Another host's lock is never judged stale from here."""
    if holder is None:
        with contextlib.suppress(FileNotFoundError):
            return time.time() - os.path.getmtime(path) > UNWRITTEN_GRACE_SEC
        return True
    if holder.get("host") != socket.gethostname():
        return False
    if holder.get("pid") == os.getpid():  # our own pid, before we took it: a dead run's, reused (containers)
        return True
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _held_message(workdir: str, path: str, holder: dict | None) -> str:
    if holder is None:
        return f"--workdir={workdir} is being claimed by another run ({path}); run one command per workdir"
    return (f"--workdir={workdir} is in use by pid {holder.get('pid')} on {holder.get('host')} (since "
            f"{holder.get('since')}): wait for that run or stop it; if it died on another host, delete {path}")
