"""A benchmark's ledger: one JSON line per finished run, kept apart from the run directories (and committed
with the repository), so a table that takes many sessions survives losing the machine its runs lived on.

A record is the run's results (results.json and the driver's measurements) plus its command line made
portable: the absolute paths that differ between machines (the run's own directory, the model, the data,
this checkout) become placeholders, so a run recorded on one machine still counts on the next one with
the same settings. The interpreter is left out, as scripts/bench/bench_glue.py's same_settings does.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def portable(text: str, paths: dict[str, str]) -> str:
    """text with each of paths' values replaced by its key where it stands as a whole path: at the start,
    after "=" or ":" (--flag=PATH, huggingface:PATH), and followed by "/" or the end. Longest first, since
    one may hold another: {"<cell>": "/x/runs/seed0"}: "--log=/x/runs/seed0/log" -> "--log=<cell>/log",
    while "configs/glue.py" keeps its name whatever the paths are."""
    for name, path in sorted(paths.items(), key=lambda kv: -len(kv[1])):
        path = path.rstrip("/")
        text = re.sub(r"(?:^|(?<=[=:]))" + re.escape(path) + r"(?=/|$)", lambda _: name, text)
    return text


def portable_command(cmd: list[str], paths: dict[str, str]) -> list[str]:
    """A run's command line as the ledger keys it: without the interpreter, its paths portable."""
    return [portable(arg, paths) for arg in cmd[1:]]


def read(path: str) -> list[dict]:
    """Every record of the ledger at path ([] when there is none yet)."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def find(path: str, command: list[str]) -> dict | None:
    """The recorded run with this portable command line, or None; the latest if it was recorded twice."""
    matches = [r for r in read(path) if r["command"] == command]
    return matches[-1] if matches else None


def record(path: str, command: list[str], results: dict) -> None:
    """Appends a finished run (once: a command already recorded is left as it is). One write of one line,
    flushed and synced, so an interrupted append loses at most that line, never an earlier one."""
    if not path or find(path, command) is not None:
        return
    entry = {**results, "command": command, "commit": _commit(),
             "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _commit() -> str | None:
    """The commit of the checkout that records the run (the one that drove it, unless a --report of another
    machine's run directories records them), or None outside git."""
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def read_prior(path: str, settings: dict) -> dict[tuple[str, str], dict]:
    """A --prior file's cells by (task, method): runs known only by their summaries (their directories and
    records are gone), each a dict of seeds, score, wall_sec and peak_rss_mib as [mean, std], and the
    trainable and total parameter counts. Its settings must be these (a grid's epochs, learning rates, ...)."""
    with open(path) as f:
        prior = json.load(f)
    differ = {k: (v, settings.get(k)) for k, v in prior["settings"].items()
              if k != "learning_rates" and settings.get(k) != v}
    rates = settings.get("learning_rates", {})
    differ.update({f"{m} learning rate": (lr, rates[m]) for m, lr in prior["settings"]["learning_rates"].items()
                   if m in rates and rates[m] != lr})
    if differ:
        said = ", ".join(f"{k} {theirs} there, {ours} here" for k, (theirs, ours) in differ.items())
        raise ValueError(f"--prior {path} ran other settings ({said}): run without --prior, or with its settings")
    return {(c["task"], c["method"]): c for c in prior["cells"]}
