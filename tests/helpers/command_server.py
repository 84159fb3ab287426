"""Runs many `python -m MODULE ARGS...` commands for a test, each in a process forked from this one after it
has imported the heavy libraries (JAX, Flax, Optax, Orbax, ...) once: each command is its own process, runs
its entry module as `__main__` with its own argv, stdin, stdout and stderr, and exits with its own status, as
`python -m` would; only the interpreter and import start-up (most of the time of a command that stops with a
one-line error) is paid once. tests/pretrain/commands/test_bad_inputs.py runs its ~60 cases this way.

Nothing backend-related runs before a fork (importing JAX starts no thread and no backend), so each child
initialises its own. Whatever the preloading prints (a warning on import) comes first in every command's
output, where the real command would print it.

Protocol: `python -m tests.helpers.command_server JOBS` reads one JSON request per line from stdin,
{"module": ..., "args": [...], "stdout": path, "stderr": path}, until EOF; runs at most JOBS at a time;
prints one line per finished command, {"index": i, "returncode": status}.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import tempfile

# What the entry points import before they can judge their input (most of a one-line error's start-up). Not
# tensorboardX: pretrain.workdir.metric_writers imports it without torch, which a preloaded tensorboardX (or
# torch) would change in every command. Never a module that defines absl
# flags (Orbax, Grain, pretrain.runtime.distributed): a command's --help lists the flags defined in its process,
# so it would list those too; _preload refuses them.
PRELOAD = ("numpy", "absl.app", "absl.flags", "absl.logging", "ml_collections", "ml_collections.config_flags",
           "jax", "jax.numpy", "flax.linen", "optax", "sentencepiece",
           "pretrain.runtime.cli", "pretrain.runtime.errors", "pretrain.training.validation")
ABSL_OWN = {"absl.app", "absl.flags", "absl.logging"}


def _preload() -> tuple[bytes, bytes]:
    """Imports PRELOAD -> (what it wrote to stdout, to stderr)."""
    captured = []
    saved = [os.dup(1), os.dup(2)]
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    for fd, f in zip((1, 2), files):
        os.dup2(f.fileno(), fd)
    try:
        for name in PRELOAD:
            importlib.import_module(name)
        from absl import flags
        defined = set(flags.FLAGS.flags_by_module_dict()) - ABSL_OWN
        if defined:
            raise SystemExit(f"command_server: PRELOAD defines absl flags ({sorted(defined)}): drop those modules")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old, f in zip((1, 2), saved, files):
            os.dup2(old, fd)
            os.close(old)
            f.seek(0)
            captured.append(f.read())
            f.close()
    return captured[0], captured[1]


def _become(request: dict, preloaded: tuple[bytes, bytes]) -> None:
    """In the child: the request's files as fd 0/1/2, then its module as __main__. Never returns normally:
    the module's SystemExit (or exception) ends this process like the real command's."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path, early in zip((1, 2), (request["stdout"], request["stderr"]), preloaded):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.write(fd, early)
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)


def main() -> None:
    jobs = int(sys.argv[1])
    requests = [json.loads(line) for line in sys.stdin if line.strip()]
    preloaded = _preload()
    running: dict[int, int] = {}  # pid -> index
    pending = list(enumerate(requests))
    while pending or running:
        while pending and len(running) < jobs:
            index, request = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become(request, preloaded)
            running[pid] = index
        pid, status = os.wait()
        print(json.dumps({"index": running.pop(pid), "returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
