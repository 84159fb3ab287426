"""kill -9 at random moments, as databases test crash consistency: a command is run once uninterrupted (the
reference, whose timeline says when it compiles, saves and evaluates), then, for each moment drawn, started afresh in
a workdir of its own, SIGKILLed at that moment, and rerun with the same command to its end. Each rerun must resume
from the latest complete checkpoint the kill left (no step lost beyond it), end bitwise equal to the reference (every
leaf of each train state kept, the metrics, the results), leave no temporary file, and print no warning of leaked
semaphores or shared memory.

Half the moments (by default) are drawn inside the reference's compilation, checkpoint saves, held-out evaluations
and final save, in turn; the rest anywhere between its start and its exit. No hook in the commands: the harness
observes a run from outside (its output and workdir, polled), and a moment is a time after the mark that preceded it
in the reference, so that load on the machine does not move it to another phase. scripts/bench/kill9.py runs the
campaigns of docs/training.md's table; tests/pretrain/workdir/test_kill9.py a few moments of each.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import fsspec

from pretrain.workdir import checkpoints, storage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLL_SECONDS = 0.01
TIMEOUT_SECONDS = 600
# What a run leaves only while it writes: Orbax's unfinished saves, write_atomic's files, the workdir lock, and a
# damaged checkpoint moved aside (a kill must never damage one).
TEMPORARY = re.compile(r"\.orbax-checkpoint-tmp|\.tmp$|(^|/)\.lock$|\.unusable\d*$")
LEAK_WARNING = re.compile(r"leaked (semaphore|shared_memory)")
RESUMED = re.compile(r"^Resumed from (\S+)/(\d+)")
NOTHING_TO_DO = re.compile(r"^Nothing to do: ")  # the run was complete: pretraining's checkpoint, fine-tuning's results
PHASES = ("compile", "save", "eval", "final save")  # where the targeted moments go, in turn
TIME_KEYS = ("time", "per_sec")  # fields of metrics and results that measure the clock, not the run


@dataclasses.dataclass(frozen=True)
class Command:
    """A command as a user runs it: `python -m module --workdir=W args...`; `resume` is the folder of the workdir
    whose latest complete checkpoint a rerun must resume from."""
    name: str
    module: str
    args: tuple[str, ...]
    resume: str = "checkpoints"

    def start(self, workdir: str) -> subprocess.Popen:
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}  # a bucket's server: in os.environ
        return subprocess.Popen([sys.executable, "-m", self.module, f"--workdir={workdir}", *self.args], cwd=REPO,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Output:
    """A process's stdout and stderr lines, read on threads as they come."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._threads = [threading.Thread(target=self._read, args=(stream, name), daemon=True)
                         for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr))]
        for thread in self._threads:
            thread.start()

    def _read(self, stream, name: str) -> None:
        for line in stream:  # a progress bar redraws with carriage returns
            self.lines[name].extend(line.rstrip("\n").split("\r"))

    def finish(self, timeout: float = 60) -> None:
        """Waits for both pipes' ends: after a SIGKILL they close once every process holding them (data workers,
        multiprocessing's resource tracker) has ended, so what those print on their way out is read too."""
        for thread in self._threads:
            thread.join(timeout)
        self.proc.stdout.close()
        self.proc.stderr.close()

    def text(self, name: str) -> str:
        return "\n".join(self.lines[name])


class Observer:
    """The marks a run reaches, first seen by polling its output and workdir: `Model` (its set-up done), each metrics
    record (`record:i`; `eval:i` too when it holds a held-out evaluation), each checkpoint folder seen unfinished
    (`saving:<folder>/<step>`) and complete (`saved:...`). -> {mark: seconds since the start}."""

    def __init__(self, workdir: str, output: Output, started: float):
        self.workdir, self.output, self.started = workdir, output, started
        self.marks: dict[str, float] = {"start": 0.0}

    def poll(self) -> None:
        now = time.monotonic() - self.started
        found = ["model"] if any(line.startswith("Model") for line in self.output.lines["stdout"]) else []
        for i, record in enumerate(_records(self.workdir)):
            found += [f"record:{i}"] + ([f"eval:{i}"] if any(key.startswith("eval_") for key in record) else [])
        for key, complete in _checkpoint_folders(self.workdir).items():
            found += [f"saving:{key}"] + ([f"saved:{key}"] if complete else [])
        for mark in found:
            self.marks.setdefault(mark, now)


@dataclasses.dataclass
class Timeline:
    """The reference run's marks (Observer) and its exit, in seconds since its start."""
    marks: dict[str, float]
    exit: float

    def windows(self, phase: str) -> list[tuple[float, float]]:
        """The intervals of `phase` (PHASES), from the marks around it: compilation from `Model` to the first
        record, an evaluation from the record before it, a save from its folder's first sight to its completion."""
        at = self.marks
        if phase == "compile":
            return [(at["model"], at["record:0"])] if "model" in at and "record:0" in at else []
        if phase == "eval":
            return [(at[f"record:{int(name[5:]) - 1}"], t) for name, t in at.items()
                    if name.startswith("eval:") and name != "eval:0"]
        saves = sorted((at["saving:" + name[6:]], t) for name, t in at.items() if name.startswith("saved:"))
        return saves[-1:] if phase == "final save" else saves[:-1]

    def anchor(self, seconds: float) -> tuple[str, float]:
        """The last mark before `seconds` and the time from it: a kill waits for that mark, so that a run slower
        or faster than the reference (another load on the machine) is still killed inside the same phase."""
        name = max((t, name) for name, t in self.marks.items() if t <= seconds)[1]
        return name, seconds - self.marks[name]


@dataclasses.dataclass(frozen=True)
class Moment:
    phase: str  # where it was drawn: one of PHASES, or "anywhere"
    seconds: float  # in the reference run
    anchor: str  # the mark it follows (Timeline.anchor)
    after: float  # seconds after that mark


@dataclasses.dataclass
class Outcome:
    """One moment's kill and rerun, as checked."""
    moment: Moment
    killed: bool  # False: the command had ended before the moment came
    latest_complete: int | None  # the resume folder's latest complete checkpoint once the process was gone
    resumed_from: int | None  # the step the rerun resumed from (None: it started afresh; the latest: it was done)
    differing: list[str]  # what the ended run holds otherwise than the reference: "checkpoints/10", "metrics", ...
    temporary_left: list[str]
    leak_warnings: list[str]
    rerun_error: str = ""

    @property
    def bitwise(self) -> bool:
        return not self.rerun_error and not self.differing

    @property
    def steps_lost(self) -> int:
        """Steps the rerun trained again though a complete checkpoint held them."""
        return max(0, (self.latest_complete or 0) - (self.resumed_from or 0))


def _records(workdir: str) -> list[dict]:
    path = f"{workdir}/metrics.jsonl"
    try:
        text = storage.read_text(path)
    except (FileNotFoundError, OSError):
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _checkpoint_folders(workdir: str) -> dict[str, bool]:
    """'<folder>/<step>' of every checkpoint folder in the workdir -> whether it is complete (an Orbax temporary
    folder counts under its step, unfinished)."""
    found = {}
    for folder in ("checkpoints", "resume"):
        directory = f"{workdir}/{folder}"
        try:
            names = storage.listdir(directory) if storage.isdir(directory) else []
        except FileNotFoundError:  # removed while listed: fine-tuning's resume/ at its end
            names = []
        for name in names:
            step = name.split(".")[0]
            if step.isdigit():
                complete = name == step and checkpoints.step_problem(directory, int(step)) is None
                found[f"{folder}/{step}"] = found.get(f"{folder}/{step}", False) or complete
    return found


def record_timeline(command: Command, workdir: str) -> Timeline:
    """Runs `command` uninterrupted, observing its marks."""
    started = time.monotonic()
    proc = command.start(workdir)
    output = Output(proc)
    observer = Observer(workdir, output, started)
    while proc.poll() is None:
        observer.poll()
        time.sleep(POLL_SECONDS)
    observer.poll()
    output.finish()
    if proc.returncode != 0:
        raise RuntimeError(f"the reference run of {command.name} failed:\n{output.text('stderr')[-3000:]}")
    return Timeline(observer.marks, time.monotonic() - started)


def draw_moments(timeline: Timeline, count: int, seed: int, targeted: float = 0.5) -> list[Moment]:
    """`count` moments, round(count * targeted) of them inside the PHASES the timeline has, in turn, the rest
    uniform over the whole run."""
    rng = random.Random(seed)
    phases = [phase for phase in PHASES if timeline.windows(phase)]
    moments = []
    for i in range(count):
        phase = phases[i % len(phases)] if phases and i < round(count * targeted) else "anywhere"
        start, end = rng.choice(timeline.windows(phase)) if phase != "anywhere" else (0.0, timeline.exit)
        seconds = rng.uniform(start, end)
        moments.append(Moment(phase, seconds, *timeline.anchor(seconds)))
    return moments


def _canonical(value):
    """Metrics or results without their clock fields, as sorted JSON (NaN compares equal as text)."""
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items() if not any(word in k for word in TIME_KEYS)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def fingerprint(workdir: str) -> dict[str, str]:
    """What an ended run must hold bit for bit: every checkpoint in checkpoints/ (each leaf of its train state),
    the metrics records and results.json less their clock fields, and each predictions file."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    workdir = storage.absolute(workdir)  # Orbax reads absolute paths only
    found = {"metrics": json.dumps(_canonical(_records(workdir)), sort_keys=True)}
    for key, complete in sorted(_checkpoint_folders(workdir).items()):
        digest = hashlib.sha256()
        try:  # a folder with its commit marker may still lack arrays: a bucket's rotation deletes object by object
            for leaf in jax.tree.leaves(ocp.StandardCheckpointer().restore(f"{workdir}/{key}/state")):
                digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
        except (OSError, ValueError) as e:
            complete = complete and f"unreadable: {str(e)[:80]}"
        found[key] = digest.hexdigest() if complete is True else complete or "incomplete"
    if storage.exists(f"{workdir}/results.json"):
        found["results"] = json.dumps(_canonical(json.loads(storage.read_text(f"{workdir}/results.json"))),
                                      sort_keys=True)
    if storage.isdir(f"{workdir}/predictions"):
        for name in sorted(storage.listdir(f"{workdir}/predictions")):
            found[f"predictions/{name}"] = storage.read_text(f"{workdir}/predictions/{name}")
    return found


def temporary_files(workdir: str) -> list[str]:
    """Paths under the workdir that only a run in progress should hold (TEMPORARY)."""
    fs, root = fsspec.core.url_to_fs(workdir)
    found = fs.find(root, withdirs=True) if fs.exists(root) else []
    return sorted(os.path.relpath(path, root) for path in found if TEMPORARY.search(path))


def kill_at(command: Command, workdir: str, moment: Moment) -> tuple[bool, str]:
    """Starts `command` and SIGKILLs it `moment.after` seconds after it reaches `moment.anchor`; -> (whether it was
    still running then, its stderr read to the end: what its workers and the resource tracker printed after)."""
    started = time.monotonic()
    proc = command.start(workdir)
    output = Output(proc)
    observer = Observer(workdir, output, started)
    while proc.poll() is None and moment.anchor not in observer.marks:
        time.sleep(POLL_SECONDS)
        observer.poll()
    deadline = started + observer.marks.get(moment.anchor, 0.0) + moment.after
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait(TIMEOUT_SECONDS)
    output.finish()
    return killed, output.text("stderr")


def rerun(command: Command, workdir: str) -> tuple[int | None, str, str]:
    """The same command to its end; -> (the step it resumed from, -1 if it found the run complete, or None; its
    stderr; an error line)."""
    proc = command.start(workdir)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    resumed = None
    for line in stdout.splitlines():
        match = RESUMED.match(line)
        resumed = int(match.group(2)) if match else -1 if NOTHING_TO_DO.match(line) else resumed
    error = "" if proc.returncode == 0 else f"exit {proc.returncode}: {stderr.strip().splitlines()[-1:]}"
    return resumed, stderr, error


def leak_lines(*texts: str) -> list[str]:
    return [line for text in texts for line in text.splitlines() if LEAK_WARNING.search(line)]


def try_moment(command: Command, workdir: str, moment: Moment, reference: dict[str, str]) -> Outcome:
    """Kill at `moment`, note the latest complete checkpoint, rerun, and check the run as it ends."""
    killed, killed_stderr = kill_at(command, workdir, moment)
    latest = checkpoints.latest_complete_step(f"{workdir}/{command.resume}") if killed else None
    resumed, stderr, error = rerun(command, workdir)
    resumed = latest if resumed == -1 else resumed  # nothing was left to redo
    ended = fingerprint(workdir)
    differing = sorted(key for key in set(ended) | set(reference) if ended.get(key) != reference.get(key))
    return Outcome(moment, killed, latest, resumed, differing, temporary_files(workdir),
                   leak_lines(killed_stderr, stderr), error)


@dataclasses.dataclass(frozen=True)
class Reference:
    """The uninterrupted run: its workdir, timeline and what it ends with."""
    workdir: str
    timeline: Timeline
    fingerprint: dict[str, str]


def run_reference(command: Command, workdir: str) -> Reference:
    return Reference(workdir, record_timeline(command, workdir), fingerprint(workdir))


def campaign(command: Command, root: str, moments: int, reference: Reference, seed: int = 0,
             log=None) -> list[Outcome]:
    """`moments` kills drawn from the reference's timeline, each in a workdir root/<i> of its own."""
    timeline, reference = reference.timeline, reference.fingerprint
    outcomes = []
    for i, moment in enumerate(draw_moments(timeline, moments, seed)):
        started = time.monotonic()
        outcomes.append(try_moment(command, f"{root}/{i}", moment, reference))
        if log:
            log(f"{command.name} {i + 1}/{moments}: {describe(outcomes[-1])} ({time.monotonic() - started:.0f} s)")
    return outcomes



def describe(outcome: Outcome) -> str:
    moment = outcome.moment
    where = f"killed at {moment.seconds:.2f} s ({moment.phase})" if outcome.killed else "ended before the moment"
    problems = [p for p in (outcome.rerun_error, f"not bitwise: {outcome.differing}" if outcome.differing else "",
                            f"{outcome.steps_lost} steps lost" if outcome.steps_lost else "",
                            f"left {outcome.temporary_left}" if outcome.temporary_left else "",
                            f"warned {outcome.leak_warnings[:1]}" if outcome.leak_warnings else "") if p]
    return f"{where}; latest complete {outcome.latest_complete}, resumed from {outcome.resumed_from}; " + (
        "; ".join(problems) or "ok")
