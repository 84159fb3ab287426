"""`make test`'s progress line (tests/helpers/progress.py): its look, when it is due (every 5% of the tests or after
the interval), how it counts failures, and that a real run prints it, in one process and under pytest-xdist's
controller alone."""
from __future__ import annotations

import re
import textwrap
import types

import pytest

from tests.helpers.paths import REPO
from tests.helpers.progress import Progress, progress_line

LINE = re.compile(r"^\[ *(\d+)/(\d+) tests · (\d+) failed · \d+ (?:s|min) \]$", re.M)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def phases(nodeid: str, failed: str = "") -> list[types.SimpleNamespace]:
    """One test's three reports; `failed` names the phase that failed, if any."""
    return [types.SimpleNamespace(nodeid=nodeid, when=when, failed=when == failed)
            for when in ("setup", "call", "teardown")]


def run(progress: Progress, total: int, count: int, failing: tuple[int, ...] = ()) -> list[str | None]:
    """The value `record` returned at each test's last report, for tests 1..count."""
    lines = []
    for i in range(1, count + 1):
        for report in phases(f"t{i}", "call" if i in failing else ""):
            line = progress.record(report, total)
            if report.when != "teardown":
                assert line is None
        lines.append(line)
    return lines


def test_the_line_pads_the_count_to_the_totals_width_and_gives_seconds_then_minutes():
    assert progress_line(812, 1757, 0, 11 * 60 + 59) == "[  812/1757 tests · 0 failed · 11 min ]"
    assert progress_line(3, 40, 2, 40.9) == "[  3/40 tests · 2 failed · 40 s ]"


def test_a_line_is_due_at_every_five_percent_of_the_tests_but_not_after_the_last():
    lines = run(Progress(every_s=60, clock=Clock()), total=100, count=100)
    due = [i + 1 for i, line in enumerate(lines) if line]
    assert due == list(range(5, 100, 5))
    assert lines[4] == "[   5/100 tests · 0 failed · 0 s ]"


def test_a_line_is_due_when_the_interval_has_passed_between_two_steps():
    clock = Clock()
    progress = Progress(every_s=60, clock=clock)
    assert run(progress, total=1000, count=3) == [None, None, None]
    clock.now += 61
    assert run(progress, total=1000, count=1) == ["[    4/1000 tests · 0 failed · 1 min ]"]
    clock.now += 30
    assert run(progress, total=1000, count=1) == [None]  # 30 s since the last line


def test_a_test_counts_once_as_failed_whichever_phases_failed():
    progress = Progress(every_s=0, clock=Clock())  # every finished test is due
    for report in phases("a", "setup") + phases("b", "call") + phases("b", "teardown") + phases("c"):
        line = progress.record(report, total=10)
    assert line == "[  4/10 tests · 2 failed · 0 s ]"  # b's two phases: one test, counted twice in done only
    crashed = types.SimpleNamespace(nodeid="d", when="???", failed=True)  # xdist's report for a crashed worker
    assert progress.record(crashed, total=10) == "[  5/10 tests · 3 failed · 0 s ]"


SUITE = {
    "test_one.py": "import pytest\n\n@pytest.mark.parametrize('i', range(30))\ndef test_a(i):\n    assert i != 7\n",
    "test_two.py": "import pytest\n\n@pytest.mark.parametrize('i', range(10))\ndef test_b(i):\n    pass\n",
}


def test_a_run_prints_the_line_beside_the_dots_only_when_asked(pytester):
    pytester.makepyfile(**{name[:-3]: textwrap.dedent(source) for name, source in SUITE.items()})
    result = pytester.runpytest("-q", "-p", "no:xdist", "-p", "tests.helpers.progress", "--progress-every=600")
    result.assert_outcomes(passed=39, failed=1)
    counts = [(int(done), int(total), int(failed)) for done, total, failed in LINE.findall(result.stdout.str())]
    assert [done for done, _, _ in counts] == list(range(2, 40, 2))  # every 5% of 40, none after the last
    assert {total for _, total, _ in counts} == {40}
    assert [failed for done, _, failed in counts if done in (6, 8)] == [0, 1]  # test_a[7] is the 8th
    quiet = pytester.runpytest("-q", "-p", "no:xdist", "-p", "tests.helpers.progress")
    assert not LINE.search(quiet.stdout.str())


@pytest.mark.slow  # pytest-xdist's workers are processes
def test_under_xdist_the_controller_prints_the_line_from_its_workers_reports(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", REPO)
    pytester.makepyfile(**{name[:-3]: textwrap.dedent(source) for name, source in SUITE.items()})
    result = pytester.runpytest_subprocess("-q", "-n", "2", "--dist", "loadfile", "-p", "tests.helpers.progress",
                                           "--progress-every=600", timeout=300)
    result.assert_outcomes(passed=39, failed=1)
    done = [int(d) for d, _, _ in LINE.findall(result.stdout.str())]
    assert done == list(range(2, 40, 2))  # once each: the workers print none
