"""Runs a sweep's cells as processes, N at a time, each one's output into its log.

A stop of the sweep (SIGTERM, SIGINT) is passed to the running cells as SIGTERM, which the entry points
answer by saving a checkpoint and exiting 75; the sweep then exits 75 too and the same command resumes it.
On Linux a cell also gets SIGTERM when the sweep itself dies without that chance (SIGKILL), so no orphan
keeps writing into a workdir that the resumed sweep runs again.
"""
from __future__ import annotations

import signal
import subprocess
import time
from typing import Callable

from pretrain.jobs.sweep_cells import Cell
from pretrain.jobs.sweep_dir import SweepDir
from pretrain.runtime import children
from pretrain.runtime.errors import EXIT_PREEMPTED


class SweepStopped(Exception):
    """The sweep was asked to stop; its running cells have saved and exited."""


def start(cell: Cell, log_path: str) -> subprocess.Popen:
    """A session of its own: a terminal's Ctrl-C reaches the sweep alone, which passes one SIGTERM on (a cell that got
    both would take the second as "stop at once")."""
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(list(cell.command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, **children.popen_options())


def run_cells(sweep: SweepDir, cells: list[Cell], parallel: int = 1,
              say: Callable[[str], None] = print) -> dict[str, int]:
    """Every cell not done before, at most `parallel` at once. -> {cell name: exit status} of those run.
    Raises SweepStopped after a SIGTERM / SIGINT once the running cells have exited."""
    todo = [cell for cell in cells if sweep.outcome(cell) is None]
    for cell in cells:
        if cell not in todo:
            say(f"  {cell.name}: done before, skipped")
    running: dict[subprocess.Popen, tuple[Cell, float]] = {}
    statuses: dict[str, int] = {}
    stop = []

    def on_signal(signum, _frame):
        stop.append(signum)
        for process in running:
            process.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while (todo and not stop) or running:
            while todo and not stop and len(running) < parallel:
                cell = todo.pop(0)
                say(f"  {cell.name}: running (log {sweep.log(cell)})")
                running[start(cell, sweep.local_log(cell))] = (cell, time.perf_counter())
            finished = [p for p in running if p.poll() is not None]
            if not finished:
                time.sleep(0.2)
            for process in finished:
                cell, began = running.pop(process)
                wall, code = time.perf_counter() - began, process.returncode
                statuses[cell.name] = code
                sweep.keep_log(cell)
                if code == 0:
                    sweep.record(cell, code, wall)
                    say(f"  {cell.name}: done in {wall:.0f} s")
                elif code == EXIT_PREEMPTED or stop:
                    say(f"  {cell.name}: stopped after {wall:.0f} s (exit {code}); the same command resumes it")
                else:
                    say(f"  {cell.name}: FAILED (exit {code}) after {wall:.0f} s; end of {sweep.log(cell)}:\n"
                        + _tail(sweep.local_log(cell)))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if stop:
        raise SweepStopped(f"stopped by signal {stop[0]}: the same command resumes the sweep")
    return statuses


def _tail(path: str, lines: int = 15) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])
