"""The processes a command starts end with it, even when it is killed without a chance to stop them (SIGKILL: an
out-of-memory kill, a preemptible VM's hard stop, a supervisor's timeout).

Left alone they would not: a child is reparented to init and runs on, and a restart on the same machine starts
more (two Grain workers hold about 250 MB each, and the multiprocessing resource tracker waits for them).

- Python workers of multiprocessing (Grain's data workers, the corpus builder's pool) call `exit_with_parent` as
  their initializer: a thread of theirs ends the worker once its parent is gone. A poll, not PR_SET_PDEATHSIG:
  the kernel sends that signal when the *thread* that forked the child ends, and Grain starts its workers from
  threads of its own. A worker also ignores SIGINT: a terminal's Ctrl-C reaches the whole process group, and the
  parent answers it (a worker's KeyboardInterrupt would only print a traceback). The resource tracker ends by
  itself once the parent and the workers, its last writers, are gone.
- That tracker (multiprocessing's, started by `quiet_resource_tracker` before the workers) unlinks what a killed
  run left: the named semaphores of Grain's queues and the shared memory of the windows in flight. It does so
  quietly. Its stock warning ("There appear to be N leaked semaphore objects") is meant for a program that
  forgot to clean up; after a SIGKILL nobody could, the tracker's clean-up is the design, and the warning
  reached the console of the supervisor's rerun.
- Commands started with subprocess (a sweep's cells, the launcher's gcloud) take `popen_options()`: on Linux the
  child gets SIGTERM when its parent dies (PR_SET_PDEATHSIG, set between fork and exec), which the entry points
  answer as a preemption, and gcloud by stopping its ssh. Elsewhere no such option exists and they are left.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies
PARENT_POLL_SECONDS = 0.25
# The tracker's own warnings (leaks found at its end, an unlink that failed) as a -W option of its interpreter.
QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


def quiet_resource_tracker() -> None:
    """Starts multiprocessing's resource tracker, unless one runs, with its warnings off (the module docstring says
    why); call it in the parent before starting workers. The tracker's interpreter takes sys.warnoptions as -W."""
    from multiprocessing import resource_tracker
    if getattr(resource_tracker._resource_tracker, "_fd", None) is not None:
        return  # already started by an earlier pool of this process: warnings and all
    sys.warnoptions.append(QUIET_TRACKER)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(QUIET_TRACKER)


def exit_with_parent(parent_pid: int, *_worker) -> None:
    """In a worker process: end it once `parent_pid` is no longer its parent. *_worker: Grain passes the worker's
    index and count to its worker_init_fn."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="exit-with-parent", daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)  # no teardown: the parent that would read its results is gone


def popen_options(death_signal: int = signal.SIGTERM) -> dict:
    """subprocess.Popen's keyword arguments for a child that gets `death_signal` when this process dies."""
    if not sys.platform.startswith("linux"):
        return {}
    parent, prctl = os.getpid(), ctypes.CDLL(None, use_errno=True).prctl  # looked up here: no dlopen after fork

    def die_with_parent() -> None:  # in the child, between fork and exec
        prctl(PR_SET_PDEATHSIG, int(death_signal))
        if os.getppid() != parent:  # the parent died before prctl: no signal will come
            os.kill(os.getpid(), death_signal)

    return {"preexec_fn": die_with_parent}
