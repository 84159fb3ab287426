"""Preemption: stop at the next step boundary with a complete checkpoint, then exit 75.

A scheduler that takes the machine back sends SIGTERM (and a person presses Ctrl-C); killing the
process there would lose the work since the last periodic checkpoint. A loop instead asks the
watcher after every step:

    with preemption.Watcher() as watcher:
        for step ...:
            state = train(state)
            if watcher.should_stop(step):
                ckpt.save(step, state, position, force=True)
                ckpt.wait()
                raise preemption.Preempted(step, ckpt.directory)

and the entry point's `errors.one_line_errors()` prints Preempted's one line and exits with
EXIT_PREEMPTED (75, EX_TEMPFAIL): run the same command again to resume.

One process: SIGTERM and SIGINT set a flag (a signal that was ignored stays ignored). The first one
re-installs the handlers that were there before, so a second Ctrl-C (KeyboardInterrupt) or SIGTERM
stops the process at once, mid-save if need be (Orbax never makes a half-written step the latest).
More than one process (jax.distributed): a local signal cannot stop every process at the same step,
so no handler is installed; JAX's preemption service owns SIGTERM and
`multihost_utils.reached_preemption_sync_point(step)` turns its notice into the same stop step on
every process.

A time budget (`deadline`, seconds since the epoch: pretrain.train --time_budget_minutes,
scripts/reproduce/cram.py) stops the loop the same way at the first step boundary past it; with several
processes, process 0's clock decides for all.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

import jax

from pretrain.core.errors import EXIT_PREEMPTED, Preempted

__all__ = ["EXIT_PREEMPTED", "Preempted", "Watcher"]


class Watcher:
    """Context manager: `should_stop(step)` is True once a stop was requested; handlers restored on exit."""

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT), *,
                 multiprocess: bool | None = None, deadline: float | None = None):
        self.signals = tuple(signals)
        self.deadline = deadline
        self.multiprocess = jax.process_count() > 1 if multiprocess is None else multiprocess
        self.received: int | None = None  # the first signal caught (0: request())
        self._previous: dict[int, object] = {}
        self._last: tuple[int, bool] | None = None  # (step, JAX's answer): asking twice about a step is safe
        self._no_service = False

    def __enter__(self) -> Watcher:
        if self.multiprocess or threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread
        for sig in self.signals:
            previous = signal.getsignal(sig)
            if previous is signal.SIG_IGN:  # e.g. SIGINT of a background job: the caller chose to ignore it
                continue
            self._previous[sig] = previous
            signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
        self._restore()  # a second signal acts as if there were no watcher: it stops the run now
        again = "press Ctrl-C again" if signum == signal.SIGINT else "send it again"
        # os.write, not print: the handler may run while the main thread is inside a write to stderr
        # (the progress bar), and Python's buffered streams refuse a re-entrant write.
        message = (f"\n{signal.Signals(signum).name}: saving a checkpoint at the next step boundary, then "
                   f"exiting ({again} to stop at once)\n")
        try:
            os.write(2, message.encode())
        except OSError:
            pass

    def request(self) -> None:
        """Ask for a stop as a signal would (tests, callers with their own notice)."""
        if self.received is None:
            self.received = 0

    @property
    def requested(self) -> bool:
        return self.received is not None

    def should_stop(self, step: int) -> bool:
        """True when the loop should save at `step` and stop. Call it after every step, with the
        number of steps done: with several processes it is the step agreed on by all of them."""
        if not self.multiprocess:
            return self.requested or self.past_deadline()
        if self._last is None or self._last[0] != step:  # JAX is asked once per step
            self._last = (step, self._reached_sync_point(step) or self._all_past_deadline())
        return self._last[1]

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline

    def _all_past_deadline(self) -> bool:
        if self.deadline is None:
            return False
        from jax.experimental import multihost_utils
        return bool(multihost_utils.broadcast_one_to_all(self.past_deadline()))

    @property
    def reason(self) -> str:
        """What a stop is called: a signal's preemption, or the time budget."""
        return "preempted" if self.requested or not self.past_deadline() else "time budget reached"

    def _reached_sync_point(self, step: int) -> bool:
        from jax.experimental import multihost_utils
        if self._no_service:
            return False
        try:
            return multihost_utils.reached_preemption_sync_point(step)
        except RuntimeError as e:  # jax_enable_preemption_service=False: no notice can arrive
            self._no_service = True
            print(f"warning: preemption notices are not caught ({str(e).splitlines()[0]})", file=sys.stderr)
            return False
