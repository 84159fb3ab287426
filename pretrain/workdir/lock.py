"""One writer per workdir: WORKDIR/.lock names the run that holds it (host, pid, start time).

A second `pretrain.train` or `pretrain.finetune` on the same workdir would interleave checkpoints and
metrics; it is refused with one line naming the holder instead. A lock whose process is gone (a run
killed outright on this host) is stale and taken over, as the resume it precedes expects. Only the
primary process of a run takes it (its other processes write through the primary).

In a bucket (gs://) the lock is created only if absent (GCS's ifGenerationMatch=0 precondition) and its
holder rewrites it every HEARTBEAT_SEC: the run that holds it usually lives on another host (a preempted
spot VM, replaced by a new one), whose process nobody can ask about, so a bucket lock not rewritten for
STALE_SEC is stale, whichever host wrote it.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import Callable, Iterator

import fsspec.core

from pretrain.runtime import distributed
from pretrain.runtime.errors import UserError
from pretrain.workdir import storage

LOCK_FILE = ".lock"
UNWRITTEN_GRACE_SEC = 10.0  # a lock file still empty this long after its creation was left by a crash
HEARTBEAT_SEC = 60.0        # a bucket lock's holder rewrites it this often
STALE_SEC = 300.0           # a bucket lock not rewritten for this long is a gone run's


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[None]:
    """WORKDIR/.lock is this process's while the block runs, and removed after it, however it ends."""
    if not distributed.is_primary():
        yield
        return
    if storage.is_url(workdir):
        with _bucket_lock(workdir):
            yield
        return
    path = os.path.join(workdir, LOCK_FILE)
    _take(path, workdir)
    try:
        yield
    finally:
        if (_read(path) or {}).get("pid") == os.getpid():
            os.remove(path)


def _me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _take(path: str, workdir: str) -> None:
    me = _me()
    _claim(workdir, path, lambda: _create_file(path, me), lambda: _read(path), lambda: os.remove(path),
           lambda holder: _stale(path, holder))


def _claim(workdir: str, path: str, create: Callable[[], bool], read: Callable[[], dict | None],
           remove: Callable[[], None], stale: Callable[[dict | None], bool]) -> None:
    """The lock at `path` for this run, on a disk or in a bucket: `create` makes it only where it is absent
    (False: it exists); a holder that is not `stale` is refused in one line; a stale lock is removed once,
    then created again."""
    for _ in range(2):
        if create():
            return
        holder = read()
        if not stale(holder):
            raise UserError(_held_message(workdir, path, holder))
        with contextlib.suppress(FileNotFoundError):
            remove()
    raise UserError(f"--workdir={workdir}: another run took {path} at the same moment; run one command per workdir")


def _create_file(path: str, me: dict) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(me, f)
    return True


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
    return holder.get("host") == socket.gethostname() and _process_gone(holder)


def _process_gone(holder: dict) -> bool:
    """`holder` ran on this host: whether no process has its pid any more."""
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
    gone = (f"a run that died leaves it stale after {STALE_SEC / 60:.0f} minutes" if storage.is_url(path)
            else f"if it died on another host, delete {path}")
    return (f"--workdir={workdir} is in use by pid {holder.get('pid')} on {holder.get('host')} (since "
            f"{holder.get('since')}): wait for that run or stop it; {gone}")


@contextlib.contextmanager
def _bucket_lock(workdir: str) -> Iterator[None]:
    path = f"{workdir}/{LOCK_FILE}"
    filesystem, name = fsspec.core.url_to_fs(path)
    me = json.dumps(_me()).encode()
    _claim(workdir, path, lambda: _create_object(filesystem, name, me), lambda: _read_object(filesystem, name),
           lambda: filesystem.rm_file(name), lambda holder: _bucket_lock_stale(filesystem, name, holder))
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(filesystem, name, me, stop), daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join(timeout=10)
        if _read_object(filesystem, name) == json.loads(me):
            with contextlib.suppress(FileNotFoundError):
                filesystem.rm_file(name)


def _create_object(filesystem, name: str, data: bytes) -> bool:
    try:
        filesystem.pipe_file(name, data, mode="create")  # GCS's ifGenerationMatch=0: only where absent
    except FileExistsError:
        return False
    return True


def _heartbeat(filesystem, name: str, me: bytes, stop: threading.Event) -> None:
    """Rewrites the lock while it is still ours; a missed beat only brings staleness closer, the run goes on."""
    while not stop.wait(HEARTBEAT_SEC):
        with contextlib.suppress(Exception):
            if _read_object(filesystem, name) == json.loads(me):
                filesystem.pipe_file(name, me)


def _read_object(filesystem, name: str) -> dict | None:
    try:
        return json.loads(filesystem.cat_file(name))
    except (OSError, ValueError):
        return None


def _bucket_lock_stale(filesystem, name: str, holder: dict | None) -> bool:
    """Not rewritten for STALE_SEC (by the bucket's clock of its last write), or this host's dead process's."""
    if holder is not None and holder.get("host") == socket.gethostname() and _process_gone(holder):
        return True
    try:
        return time.time() - filesystem.modified(name).timestamp() > STALE_SEC
    except FileNotFoundError:
        return True
