"""Writes a storage refused: recognising them in an exception chain, and keeping their noise out of the logs.

`write_failure(e)` says whether `e`, or an exception in its chain, is a refusal a person can fix and rerun after
(a full disk, a quota, a file-size limit), in the OS's words and with the fix. pretrain.workdir.checkpoints turns
one into a one-line CheckpointWriteError; a storage whose errors are no OSErrors (a bucket's) appends its own
recogniser to WRITE_FAILURE_KINDS.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import inspect
import logging
import os
import re
from collections.abc import Callable

from pretrain.runtime.errors import exception_chain


@dataclasses.dataclass(frozen=True)
class WriteFailure:
    what: str  # the storage's words: "[Errno 28] No space left on device"
    fix: str   # what a person does before rerunning: "free space on that disk"


# errno -> the fix, of a storage that is full: the disk, the user's quota, the per-file size limit (ulimit -f).
STORAGE_FULL = {errno.ENOSPC: "free space on that disk", errno.EDQUOT: "raise the quota (or free space within it)",
                errno.EFBIG: "raise the file-size limit (ulimit -f)"}
# TensorStore, which writes the arrays, raises ValueErrors that carry the errno only in their text.
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


def _full_storage(error: BaseException) -> WriteFailure | None:
    code = error.errno if isinstance(error, OSError) else None
    if code is None:
        match = _OS_ERROR_CODE.search(str(error))
        code = int(match.group(1)) if match else None
    return WriteFailure(f"[Errno {code}] {os.strerror(code)}", STORAGE_FULL[code]) if code in STORAGE_FULL else None


# What `write_failure` recognises: each takes one exception of a chain and answers a WriteFailure or None. A
# storage whose errors are no OSErrors (a bucket's quota or permission errors) appends its own here.
WRITE_FAILURE_KINDS: list[Callable[[BaseException], WriteFailure | None]] = [_full_storage]


def write_failure(error: BaseException) -> WriteFailure | None:
    """The first answer of WRITE_FAILURE_KINDS for `error` or an exception in its chain (errors.exception_chain);
    None: not a failure a person can fix by rerunning."""
    for e in exception_chain(error):
        for kind in WRITE_FAILURE_KINDS:
            failure = kind(e)
            if failure is not None:
                return failure
    return None


class _LoggedWriteFailures(logging.Filter):
    """Drops Orbax's and asyncio's log records of a `write_failure`: one full disk makes each of Orbax's threads
    log it and asyncio each failed write coroutine, hundreds of traceback lines, while the failure itself reaches
    the loop as one CheckpointWriteError. Everything else passes (LMPRETRAIN_TRACEBACK=1: all of it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "asyncio" and f"{os.sep}orbax{os.sep}" not in record.pathname:
            return True
        if os.environ.get("LMPRETRAIN_TRACEBACK"):
            return True
        error = record.exc_info[1] if record.exc_info and record.exc_info[1] else Exception(record.getMessage())
        return write_failure(error) is None


def drop_from_logs() -> None:
    """Installs _LoggedWriteFailures on the loggers Orbax (absl) and asyncio write to, once per process."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _LoggedWriteFailures) for f in logger.filters):
            logger.addFilter(_LoggedWriteFailures())


def close_abandoned_writes() -> int:
    """Closes the write tasks a refused save left pending; -> how many. Orbax runs a save in an event loop of its own
    and closes that loop once the first write fails (run_until_complete and close, not asyncio.run, which would
    cancel them), leaving the save's other writes (serialization's `write_fragment`) as pending tasks whose
    coroutines never started. The garbage collector would find them at shutdown and print "coroutine ... was never
    awaited" after the run's one line. One scan of the heap, on the failure's path only."""
    closed = 0
    for task in [o for o in gc.get_objects() if issubclass(type(o), asyncio.Task)]:  # type(): no proxy's __class__
        coroutine = task.get_coro()
        if task.done() or not task.get_loop().is_closed() or not inspect.iscoroutine(coroutine):
            continue
        if inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED:
            task._log_destroy_pending = False  # asyncio's "destroyed but pending" log: its loop is gone, nothing to do
            coroutine.close()
            closed += 1
    return closed
