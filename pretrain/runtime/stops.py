"""Every stop answered: a SIGTERM or SIGINT ends a command with one line and exit status 75 (130 for Ctrl-C), from its
first import to its last flush, never Python's silent 143.

A command's life in phases, each with its own answer:

  start      the entry point's first line, `answer_from_start()`, to the loop's preemption watcher (imports,
             flags, jax.distributed): nothing is written yet, so `stop_at_once` prints one line and exits.
  set-up     pretrain/workdir/preemption.py's Watcher(setting_up=...): SIGTERM raises StoppedBeforeFirstStep,
             which unwinds the set-up and exits 75; SIGINT stops at once.
  steps      Watcher.steps(): a checkpoint at the next step boundary, then exit 75 (a second signal: at once).
  finishing  after the last step, until the loop returns (the final checkpoint's save, the last evaluation, the
             writers' flush): the first signal lets that work finish, then the loop exits 75
             (errors.StoppedAfterLastStep); a second one stops at once.
  end        back to `stop_at_once` until the process is gone.

Stdlib only: an entry point installs it before its first heavy import. What it cannot cover is the interpreter's
own start (tens of milliseconds before the first line of Python runs). With several processes (jax.distributed)
JAX's preemption service takes SIGTERM over once it starts.
"""
from __future__ import annotations

import os
import signal
import sys

EXIT_PREEMPTED = 75  # EX_TEMPFAIL of sysexits.h: nothing lost, the same command starts or resumes the run
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's status for a command stopped by Ctrl-C
INTERRUPTED_LINE = "interrupted (Ctrl-C): stopped at once; the workdir keeps its latest complete checkpoint"
TERMINATED_LINE = ("stopped by {signal} at once: the workdir keeps its latest complete checkpoint; rerun the same "
                   "command to resume")


def answer_from_start(*, ctrl_c: bool = True) -> None:
    """An entry point's first line: from here a signal is one line and an exit status (`stop_at_once`). A signal
    the caller ignores (SIGINT of a background job) stays ignored. Ctrl-C stays Python's KeyboardInterrupt with
    `ctrl_c=False` (a command that answers it itself: pretrain.launch) and with LMPRETRAIN_TRACEBACK=1 (its
    traceback shown)."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGTERM last: a caught SIGTERM (/proc's SigCgt) means both are
        if sig == signal.SIGINT and (not ctrl_c or os.environ.get("LMPRETRAIN_TRACEBACK")):
            continue
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, stop_at_once)


def stop_at_once(signum: int, frame) -> None:
    """The handler: one line and exit 75 (SIGTERM) or 130 (SIGINT)."""
    if signum == signal.SIGINT:
        exit_now("\n" + INTERRUPTED_LINE, EXIT_INTERRUPTED)
    exit_now("\n" + TERMINATED_LINE.format(signal=signal.Signals(signum).name), EXIT_PREEMPTED)


def exit_now(line: str, status: int) -> None:
    """`line` on stderr and exit `status` at once, without the interpreter's teardown: XLA's compiler threads or
    Orbax's writers may be mid-work, and tearing Python down under them crashes (SIGSEGV). A save cut short never
    becomes a checkpoint (Orbax commits a step by a rename once every file is written). Safe in a signal handler."""
    for stream in (sys.stdout, sys.stderr):  # what the command printed before, kept
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):  # closed, or a write the handler interrupted (re-entrant)
            pass
    write_line(line)
    os._exit(status)


def write_line(line: str) -> None:
    """A line to stderr from a signal handler: os.write, not print, since the handler may run while the main thread
    is inside a write to stderr (the progress bar) and Python's buffered streams refuse a re-entrant write."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass

