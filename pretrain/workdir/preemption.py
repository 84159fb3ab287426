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

Before the first step there is nothing to save, so a loop enters the watcher before its set-up (reading data,
building and compiling the model, restoring) with `setting_up=` its checkpoint directory: there a SIGTERM
raises errors.StoppedBeforeFirstStep from its handler, which stops the run at once (once a compilation in
progress returns: a handler runs between Python bytecodes) with one line and EXIT_PREEMPTED, and SIGINT keeps
the handler from before (an entry point's: one line and status 130 at once). 75, not 143: the run lost nothing and the same
command starts or resumes it, which is what a launcher that retries preempted jobs on 75 should do. The loop
then runs its steps inside `watcher.steps()`, where both signals ask for a stop as above. After the last step, a
first signal lets the final checkpoint's save and the run's last outputs finish, and the watcher's exit raises
StoppedAfterLastStep (one line, 75; the same command finds the run complete). The phases before and after the
watcher are pretrain/runtime/stops.py's.

A time budget (`deadline`, seconds since the epoch: pretrain.train --time_budget_minutes,
scripts/reproduce/cram.py) stops the loop the same way at the first step boundary past it; with several
processes, process 0's clock decides for all.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import jax

from pretrain.runtime import stops
from pretrain.runtime.errors import EXIT_PREEMPTED, Preempted, StoppedAfterLastStep, StoppedBeforeFirstStep

__all__ = ["EXIT_PREEMPTED", "Preempted", "StoppedAfterLastStep", "StoppedBeforeFirstStep", "Watcher"]


def _again(signum: int) -> str:
    return "press Ctrl-C again" if signum == signal.SIGINT else "send it again"


class Watcher:
    """Context manager: `should_stop(step)` is True once a stop was requested; handlers restored on exit."""

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT), *,
                 multiprocess: bool | None = None, deadline: float | None = None, setting_up: str | None = None):
        """setting_up: the loop's checkpoint directory, when the watcher is entered before the set-up (SIGTERM
        stops it at once until `steps()`); None: the steps start now."""
        self.signals = tuple(signals)
        self.deadline = deadline
        self.setting_up = setting_up
        self.multiprocess = jax.process_count() > 1 if multiprocess is None else multiprocess
        self.received: int | None = None  # the first signal caught (0: request())
        self._previous: dict[int, object] = {}
        self._last: tuple[int, bool] | None = None  # (step, JAX's answer): asking twice about a step is safe
        self._no_service = False

    def __enter__(self) -> Watcher:
        if self.setting_up is None:
            self._install(self.signals, self._handle)
        else:
            self._install([s for s in self.signals if s == signal.SIGTERM], self._stop_set_up)
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self._restore()
        if exc_type is None and self.received:  # a signal the steps did not stop at: it came after the last step
            raise StoppedAfterLastStep(signal.Signals(self.received).name)

    @contextlib.contextmanager
    def steps(self) -> Iterator[Watcher]:
        """The loop's steps: a signal asks for a stop at the next step boundary. After them, until the watcher's
        exit (the final save, the last evaluation, the writers' flush), a first signal lets that work finish and
        the exit raise StoppedAfterLastStep; once a stop was asked for, a signal stops at once."""
        self._restore()
        self._install(self.signals, self._handle)
        try:
            yield self
        finally:
            self._restore()
            if self.received is None:
                self._install(self.signals, self._finish_first)

    def _install(self, signals: Sequence[int], handler: Callable) -> None:
        if self.multiprocess or threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in signals:
            previous = signal.getsignal(sig)
            if previous is signal.SIG_IGN:  # e.g. SIGINT of a background job: the caller chose to ignore it
                continue
            self._previous[sig] = previous
            signal.signal(sig, handler)

    def _stop_set_up(self, signum: int, frame) -> None:
        """SIGTERM before the first step: stop where the main thread is (see the module's docstring)."""
        self._restore()  # a second SIGTERM while the set-up unwinds stops the process at once
        from pretrain.workdir import (
            checkpoints,  # here, not at the top: Orbax is a heavy import for a watcher
        )
        try:
            latest = checkpoints.latest_complete_step(self.setting_up)
        except OSError:  # a bucket that cannot be listed now: the line says less
            latest = None
        raise StoppedBeforeFirstStep(signal.Signals(signum).name, self.setting_up, latest)

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
        self._restore()  # a second signal acts as if there were no watcher: it stops the run now
        stops.write_line(f"\n{signal.Signals(signum).name}: saving a checkpoint at the next step boundary, then "
                         f"exiting ({_again(signum)} to stop at once)")

    def _finish_first(self, signum: int, frame) -> None:
        """A signal after the last step: the run's final work finishes, then the watcher's exit stops it."""
        self.received = signum
        self._restore()
        stops.write_line(f"\n{signal.Signals(signum).name}: finishing the final checkpoint and outputs, then "
                         f"exiting ({_again(signum)} to stop at once)")

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

    def extend_deadline(self, seconds: float) -> None:
        """Moves a time budget's deadline `seconds` later (the loop's held-out evaluations: a measurement, not
        training, so they spend none of the budget)."""
        if self.deadline is not None:
            self.deadline += seconds

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
