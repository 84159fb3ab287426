"""The local record of the runs launched on TPU VMs: LOG_ROOT/NAME/RUN_ID/ holds worker-<i>.log (each
worker's output, written while the job runs) and launch.json (what was shipped and run, and how each
worker ended), so that `python -m pretrain.launch logs` can answer after the terminal is gone.
"""
from __future__ import annotations

import json
import os
import re
import time

from pretrain.runtime.errors import UserError

MANIFEST = "launch.json"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def run_dir(log_root: str, name: str, run_id: str | None = None) -> str:
    """LOG_ROOT/NAME/RUN_ID; RUN_ID defaults to the time now (YYYYmmdd-HHMMSS)."""
    run_id = run_id or time.strftime("%Y%m%d-%H%M%S")
    if not _RUN_ID.fullmatch(run_id):
        raise UserError(f"--run_id={run_id!r}: letters, digits, dots, hyphens and underscores only")
    return os.path.join(log_root, name, run_id)


def run_id_of(log_dir: str) -> str:
    return os.path.basename(os.path.normpath(log_dir))


def worker_log(log_dir: str, worker: int) -> str:
    return os.path.join(log_dir, f"worker-{worker}.log")


def start(log_dir: str, **fields) -> None:
    """Creates the run's folder (never reusing one: its logs would mix) and its launch.json."""
    if os.path.exists(log_dir):
        raise UserError(f"{log_dir} already exists: give another --run_id")
    os.makedirs(log_dir)
    record(log_dir, started=time.strftime("%Y-%m-%d %H:%M:%S"), **fields)


def finish(log_dir: str, **fields) -> None:
    record(log_dir, finished=time.strftime("%Y-%m-%d %H:%M:%S"), **fields)


def record(log_dir: str, **fields) -> None:
    """Adds fields to launch.json (written whole, then renamed: never half a file)."""
    manifest = {**read(log_dir), **fields}
    path = os.path.join(log_dir, MANIFEST)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    os.replace(path + ".tmp", path)


def read(log_dir: str) -> dict:
    try:
        with open(os.path.join(log_dir, MANIFEST), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def latest(log_root: str, name: str) -> str | None:
    """The folder of the last run launched on TPU `name` from here (newest launch.json), or None."""
    directory = os.path.join(log_root, name)
    runs = [os.path.join(directory, d) for d in os.listdir(directory)] if os.path.isdir(directory) else []
    runs = [d for d in runs if os.path.isfile(os.path.join(d, MANIFEST))]
    return max(runs, key=lambda d: os.path.getmtime(os.path.join(d, MANIFEST))) if runs else None


def report(log_dir: str, worker: int = 0, lines: int = 20) -> str:
    """Where a run's logs are, what it ran, how each worker ended, and the last `lines` of one worker's log."""
    manifest = read(log_dir)
    out = [f"{log_dir}/"]
    if manifest:
        out.append(f"  command: {' '.join(manifest.get('command') or [])}")
        out.append(f"  shipped: {manifest.get('source')} at {manifest.get('commit')}")
        out.append(f"  started: {manifest.get('started')}; finished: {manifest.get('finished', '-')}")
    statuses = manifest.get("statuses") or []
    for i in range(manifest.get("workers") or 0):
        ended = f"exit status {statuses[i]}" if i < len(statuses) else "no status: running, or the launcher was cut off"
        out.append(f"  worker-{i}.log  {ended}")
    path = worker_log(log_dir, worker)
    if os.path.isfile(path) and lines > 0:
        with open(path, encoding="utf-8", errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
        out.append(f"--- the last {len(tail)} lines of {path} ---")
        out.extend(tail)
    return "\n".join(out)
