"""A progress line a person can read during a long run, beside pytest's dots: `make test` passes
`--progress-every=60`, and the run prints

    [  812/1757 tests · 0 failed · 11 min ]

whenever another 5% of the tests have finished or 60 s have passed since the last such line, whichever comes first
(a line is written only when a test finishes: a minutes-long test holds the next one back; none after the last
test, where pytest's summary follows). Under pytest-xdist the controller prints it, from the reports its workers
send (pytest_runtest_logreport runs there too); the workers print nothing. A test counts once it has finished (its
teardown report, or the report xdist makes for a crashed worker's test), as failed if any of its phases failed.
Off unless asked for; pytest's own summary is unchanged. Loaded by tests/conftest.py (pytest_plugins)."""
from __future__ import annotations

import math
import time
from typing import Callable

import pytest

STEP_FRACTION = 0.05  # a line at every 5% of the tests
# The phases after which a test has finished: its teardown, or xdist's report for a test whose worker crashed.
FINAL_PHASES = ("teardown", "???")


def elapsed_text(seconds: float) -> str:
    """'40 s' under a minute, then whole minutes ('11 min')."""
    return f"{int(seconds)} s" if seconds < 60 else f"{int(seconds // 60)} min"


def progress_line(done: int, total: int, failed: int, seconds: float) -> str:
    """`[  812/1757 tests · 0 failed · 11 min ]`: the count padded to the total's width, so the lines align."""
    return f"[{done:>{len(str(total)) + 1}}/{total} tests · {failed} failed · {elapsed_text(seconds)} ]"


class Progress:
    """Counts finished and failed tests from their reports and says when a line is due: after another
    STEP_FRACTION of `total` tests, or `every_s` seconds after the last line (or the start)."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self.clock = clock
        self.start = self.last_time = clock()
        self.done = self.last_done = 0
        self.failed_ids: set[str] = set()

    def record(self, report, total: int) -> str | None:
        """Takes one report of a run of `total` tests; returns the line to print, or None."""
        if report.failed:
            self.failed_ids.add(report.nodeid)
        if report.when not in FINAL_PHASES:
            return None
        self.done += 1
        if total and self.done >= total:  # the last test: pytest's summary follows
            return None
        now = self.clock()
        step = max(1, math.ceil(total * STEP_FRACTION))
        if self.done - self.last_done < step and now - self.last_time < self.every_s:
            return None
        self.last_done, self.last_time = self.done, now
        return progress_line(self.done, total, len(self.failed_ids), now - self.start)


class ProgressReporter:
    """The plugin object, registered in the process that writes the terminal (never in an xdist worker)."""

    def __init__(self, config: pytest.Config, every_s: float):
        self.config = config
        self.progress = Progress(every_s)
        self.session: pytest.Session | None = None

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    @pytest.hookimpl(trylast=True)  # after the terminal reporter has written this report's dot
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        total = self.session.testscollected if self.session is not None else 0
        line = self.progress.record(report, total)
        if line is None:
            return
        if not self.config.pluginmanager.has_plugin("terminalreporter"):  # -p no:terminal
            return
        writer = self.config.get_terminal_writer()
        if writer.width_of_current_line:  # after a row of dots: a line of its own
            writer.line()
        writer.line(line)
        writer.flush()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("terminal reporting").addoption(
        "--progress-every", type=float, default=0.0, metavar="SECONDS",
        help="print `[ done/total tests · failed · minutes ]` every SECONDS and at every 5%% of the tests "
             "(0, the default: never)")


def pytest_configure(config: pytest.Config) -> None:
    every_s = config.getoption("progress_every")
    worker = hasattr(config, "workerinput")
    if every_s > 0 and not worker:
        config.pluginmanager.register(ProgressReporter(config, every_s), "lmpretrain-progress")
