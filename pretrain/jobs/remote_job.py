"""Running commands on the workers of a TPU VM through gcloud: retries, the job on every worker, its logs.

A step that must reach every worker (copy the code, install it) is one gcloud call with --worker=all,
retried when gcloud reports a connection failure: exit status 255, ssh's own status for "could not
connect" (gcloud's tpu-vm ssh/scp give it for a worker they could not reach after their own ten
tries). Any other nonzero status is the remote command's own failure and is never retried.

The job runs as one `tpu-vm ssh --worker=i` per worker, all at once: JAX finds the slice on a Cloud TPU
VM by itself, so the same command on every host makes one jax.distributed system. One ssh per worker,
rather than one `--worker=all`, because each worker's output must land in a file of its own while
worker 0's streams to the terminal, and because `tpu-vm ssh --output-directory` (one file per worker)
writes to 'None/<worker>.log' in gcloud 528 (SSHIntoPreppedNodes resets its path to None). It also lets
a worker that could not be reached be retried while the others wait for it in
jax.distributed.initialize (pretrain.runtime.distributed's --initialization_timeout, 300 s by default).

The remote command prints a start line before it execs the job; a worker whose ssh fails (255) before
that line is retried, with backoff; after it, its status is the job's.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
from typing import Callable, NamedTuple

from pretrain.jobs import run_logs, shipping, tpu_vm
from pretrain.runtime import children
from pretrain.runtime.errors import UserError

CONNECTION_FAILED = 255
STARTED = "[launch] started on"
PID_FILE = "lmpretrain-job.pid"  # in the worker's home: the job's process, for stopping it on Ctrl-C
BACKOFF_SECONDS = 10.0


def say(message: str) -> None:
    print(f"[launch] {message}", file=sys.stderr, flush=True)


def backoff(attempt: int) -> float:
    """Seconds before retry `attempt` + 1: 10, 20, 40, ..."""
    return BACKOFF_SECONDS * 2 ** attempt


def job_command(command: list[str], env: dict[str, str], remote_dir: str) -> str:
    """The shell command that starts the job on a worker: in the shipped code's directory, with env
    (PYTHONUNBUFFERED=1 first: through ssh stdout is a pipe, and Python would hold its lines back),
    after the start line and the process id the launcher's Ctrl-C needs; exec, so that the job's exit
    status is the ssh's."""
    assignments = " ".join(shlex.quote(f"{key}={value}") for key, value in {"PYTHONUNBUFFERED": "1", **env}.items())
    return (f"cd {shlex.quote(remote_dir)} && echo $$ > ../{PID_FILE} && echo \"{STARTED} $(hostname)\" && "
            f"exec env {assignments} {shlex.join(command)}")


# SIGTERM: pretrain.train / finetune save a checkpoint and exit with status 75; the same command resumes.
STOP_COMMAND = f"if [ -f {PID_FILE} ]; then kill -TERM \"$(cat {PID_FILE})\" 2>/dev/null; fi; true"


def run_step(argv: list[str], what: str, retries: int, sleep: Callable[[float], None]) -> int:
    """Runs one gcloud command in the foreground, retried on connection failures; -> its exit status."""
    for attempt in range(retries + 1):
        status = subprocess.run(argv, **children.popen_options()).returncode
        if status != CONNECTION_FAILED or attempt == retries:
            return status
        say(f"{what}: gcloud could not reach every worker (exit status 255); retry {attempt + 1} of {retries} "
            f"in {backoff(attempt):g} s")
        sleep(backoff(attempt))
    raise AssertionError("unreachable")


class WorkerJob:
    """The job on one worker: its ssh, retried until it starts; its output to a log file (and to the
    terminal for worker 0)."""

    def __init__(self, worker: int, argv: list[str], log_path: str, echo: bool, stopping: threading.Event):
        self.worker, self.argv, self.log_path, self.echo, self.stopping = worker, argv, log_path, echo, stopping
        self.status: int | None = None
        self.started = False
        self.error: str | None = None  # why the launcher itself could not run it (a thread has no caller to raise to)
        self._process: subprocess.Popen | None = None

    def run(self, retries: int, sleep: Callable[[float], None]) -> None:
        try:
            self._run(retries, sleep)
        except Exception as e:  # reported by summary(), with the worker's number
            self.error = f"{type(e).__name__}: {e}"

    def _run(self, retries: int, sleep: Callable[[float], None]) -> None:
        with open(self.log_path, "a", encoding="utf-8") as log:
            for attempt in range(retries + 1):
                self.status = self._attempt(log)
                if self.started or self.status != CONNECTION_FAILED or attempt == retries or self.stopping.is_set():
                    return
                note = (f"worker {self.worker}: ssh could not connect (exit status 255) before the job started; "
                        f"retry {attempt + 1} of {retries} in {backoff(attempt):g} s")
                log.write(f"[launch] {note}\n")
                log.flush()
                say(note)
                sleep(backoff(attempt))
                if self.stopping.is_set():  # Ctrl-C while this worker waited: the others are being stopped
                    return

    def _attempt(self, log) -> int:
        # A session of its own: the terminal's Ctrl-C reaches the launcher only, which then stops the job
        # through the workers (SIGTERM, a checkpoint) instead of cutting the connections. A launcher killed
        # outright takes its gcloud with it (which stops its ssh).
        self._process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
                                         start_new_session=True, **children.popen_options())
        with self._process:  # its pipe closed when it ends
            for line in self._process.stdout:
                log.write(line)
                log.flush()
                if self.echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                self.started = self.started or line.startswith(STARTED)
            return self._process.wait()

    def terminate(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()


def run_job(target: tpu_vm.Target, workers: int, command: str, log_dir: str, retries: int,
            sleep: Callable[[float], None]) -> list[WorkerJob]:
    """Starts `command` on every worker at once and waits for all; -> the WorkerJobs (status, started).
    Ctrl-C sends the job SIGTERM on every worker and keeps streaming until they exit; a second Ctrl-C
    leaves at once (KeyboardInterrupt)."""
    stopping = threading.Event()
    jobs = [WorkerJob(i, tpu_vm.ssh(target, command, worker=i), run_logs.worker_log(log_dir, i), i == 0, stopping)
            for i in range(workers)]
    threads = [threading.Thread(target=job.run, args=(retries, sleep), daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    try:
        _wait(threads)
    except KeyboardInterrupt:
        say("interrupted: asking the job on every worker to stop (SIGTERM: a checkpoint, then exit status 75); "
            "Ctrl-C again to leave at once")
        stopping.set()
        try:
            subprocess.run(tpu_vm.ssh(target, STOP_COMMAND), stdin=subprocess.DEVNULL, start_new_session=True,
                           **children.popen_options())
            _wait(threads)
        except KeyboardInterrupt:
            for job in jobs:
                job.terminate()
            say("left at once: each worker's job ends when it next writes (its connection is gone)")
            raise
    return jobs


def _wait(threads: list[threading.Thread]) -> None:
    for thread in threads:
        while thread.is_alive():
            thread.join(timeout=0.5)  # a bounded join, so that Ctrl-C is seen at once


def summary(jobs: list[WorkerJob], retries: int) -> tuple[int, list[str]]:
    """-> (the run's exit status: 0, or the first failing worker's; one line per worker that failed)."""
    lines = []
    for job in jobs:
        if job.status is None:
            job.status = 1
            lines.append(f"worker {job.worker}: the launcher could not run its ssh ({job.error or 'stopped'})")
        elif job.status == CONNECTION_FAILED and not job.started:
            lines.append(f"worker {job.worker}: could not be reached (ssh exit status 255, {retries} retries); the "
                         "others waited for it in jax.distributed.initialize")
        elif job.status == CONNECTION_FAILED:
            lines.append(f"worker {job.worker}: lost its connection (ssh exit status 255) while the job ran")
        elif job.status:
            lines.append(f"worker {job.worker}: exit status {job.status}")
    status = next((job.status for job in jobs if job.status), 0)
    return status, lines


# ---------------------------------------------------------------------------------------------------
# A run: pack, copy, install, the job on every worker; printed (--dry_run) or executed.
# ---------------------------------------------------------------------------------------------------
class RunPlan(NamedTuple):
    target: tpu_vm.Target
    source: shipping.Source
    command: list[str]
    env: dict[str, str]
    log_dir: str
    local_tarball: str
    copy: list[str]  # gcloud scp to every worker
    install: list[str]  # gcloud ssh to every worker: unpack, pip install -e '.[tpu]'
    job: str  # the shell command each worker runs


def plan_run(target: tpu_vm.Target, command: list[str], env: dict[str, str], source: shipping.Source,
             log_dir: str) -> RunPlan:
    run_id = run_logs.run_id_of(log_dir)
    tarball = f"lmpretrain-{run_id}.tar.gz"
    local_tarball = os.path.join(tempfile.gettempdir(), f"lmpretrain-{target.name}-{run_id}.tar.gz")
    return RunPlan(target, source, command, env, log_dir, local_tarball,
                   copy=tpu_vm.scp_to_workers(target, local_tarball, tarball),
                   install=tpu_vm.ssh(target, shipping.unpack_and_install(tarball)),
                   job=job_command(command, env, shipping.REMOTE_DIR))


def dry_run_lines(plan: RunPlan, workers: int | None) -> list[str]:
    """The commands `execute` would run, ready to paste; comments (#) for what is not a gcloud command."""
    lines = [f"# pack {plan.source.describe()} into {plan.local_tarball}"]
    if workers is None:
        lines.append(shlex.join(tpu_vm.describe(plan.target, json=True)) + "  # N workers: its networkEndpoints")
    lines += [shlex.join(plan.copy), shlex.join(plan.install),
              f"# at once, one ssh per worker; worker i's output into {plan.log_dir}/worker-<i>.log, worker 0's "
              "also here"]
    lines += [shlex.join(tpu_vm.ssh(plan.target, plan.job, worker=i)) for i in range(workers or 1)]
    if workers is None:
        lines.append("# ... and the same with --worker=1 ... --worker=N-1")
    return lines


def count_workers(target: tpu_vm.Target) -> int:
    """The hosts of a READY TPU VM, asked of gcloud; UserError if it is missing or not READY."""
    result = subprocess.run(tpu_vm.describe(target, json=True), capture_output=True, text=True)
    status = f"python -m pretrain.launch status --name={target.name}"
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        why = lines[-1] if lines else f"exit status {result.returncode}"
        raise UserError(f"gcloud could not describe the TPU VM {target.name} ({why}): is it created, in this zone "
                        f"and project? ({status})")
    try:
        description = json.loads(result.stdout)
    except ValueError:
        raise UserError(f"gcloud described {target.name} in something else than JSON: give --workers=N") from None
    state = description.get("state", "UNKNOWN")
    if state != "READY":
        raise UserError(f"the TPU VM {target.name} is {state}, not READY: wait for it ({status})")
    workers = tpu_vm.worker_count(description)
    if workers < 1:
        raise UserError(f"the TPU VM {target.name} lists no workers (networkEndpoints): give --workers=N")
    return workers


def execute(plan: RunPlan, workers: int, retries: int, sleep: Callable[[float], None],
            exclude: tuple[str, ...] = ()) -> int:
    """Ships the code, installs it, runs the job on every worker; -> the run's exit status. `exclude`:
    local folders never shipped (the launcher's own logs)."""
    run_logs.start(plan.log_dir, name=plan.target.name, zone=plan.target.zone, project=plan.target.project,
                   command=plan.command, env=plan.env, source=plan.source.describe(),
                   commit=shipping.commit_of(plan.source), workers=workers)
    say(f"packing {plan.source.describe()}")
    size = shipping.pack(plan.source, plan.local_tarball, exclude=exclude)
    try:
        say(f"copying {size / 1e6:.1f} MB to the {workers} workers of {plan.target.name}")
        what, status = "copying the code to", run_step(plan.copy, "copying the code", retries, sleep)
    finally:
        os.remove(plan.local_tarball)
    if status == 0:
        say("installing it with its tpu extra on every worker (pip install -e '.[tpu]')")
        what, status = "installing the package on", run_step(plan.install, "installing", retries, sleep)
    if status != 0:
        run_logs.finish(plan.log_dir, exit_status=status)
        print(f"error: {what} the workers of {plan.target.name} failed (gcloud exit status {status}; its output is "
              "above): the job was not started", file=sys.stderr)
        return status
    say(f"starting the job on the {workers} workers; worker 0's output follows, every worker's goes to "
        f"{plan.log_dir}/worker-<i>.log")
    jobs = run_job(plan.target, workers, plan.job, plan.log_dir, retries, sleep)
    status, problems = summary(jobs, retries)
    run_logs.finish(plan.log_dir, statuses=[job.status for job in jobs], exit_status=status)
    for line in problems:
        say(line)
    say(f"{'done' if status == 0 else 'failed'} (exit status {status}); every worker's log in {plan.log_dir}/")
    return status
