"""The real commands as a user runs them (`python -m module args...` from the repository's root), on the CPU,
at the suite's XLA optimisation level (tests/conftest.py sets it and says why)."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.paths import REPO

# The XLA flags the user's shell had before the suite added its level (tests/conftest.py keeps them here:
# pytest-xdist's workers inherit the controller's environment, whose XLA_FLAGS already hold the level).
USER_XLA_FLAGS_ENV = "LMPRETRAIN_USER_XLA_FLAGS"


def subprocess_env(extra: dict | None = None, *, xla_optimized: bool = False) -> dict:
    """os.environ for a command the tests start, on the CPU, plus `extra`; extra's XLA_FLAGS (a fake device
    count) add to the suite's instead of replacing them. xla_optimized: at XLA's default level (a fixture
    that runs a real model for minutes; a test says it with the `xla_optimized` mark)."""
    extra = extra or {}
    suite_flags = os.environ.get(USER_XLA_FLAGS_ENV, "") if xla_optimized else os.environ.get("XLA_FLAGS", "")
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONWARNINGS": LEAKS_SHOWN, **extra,
            "XLA_FLAGS": " ".join(filter(None, [suite_flags, extra.get("XLA_FLAGS", "")]))}


# A command the tests start prints every unclosed file, socket or process it leaves to the garbage collector (Python
# hides them by default), and run_module fails on one: the suite's own leaks are errors (pytest.ini).
LEAKS_SHOWN = "always::ResourceWarning"


def assert_no_leak(stderr: str) -> None:
    leaks = [line for line in stderr.splitlines() if "ResourceWarning" in line]
    assert not leaks, "the command left resources to the garbage collector:\n" + "\n".join(leaks[:5])


def run_module(module: str, args: list[str], *, env: dict | None = None, check: bool = True,
               xla_optimized: bool = False, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m module args...` from the repo root, as a user runs it (subprocess_env's environment)."""
    cmd = [sys.executable, "-m", module, *args]
    proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(env, xla_optimized=xla_optimized),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    assert_no_leak(proc.stderr)  # on the failing paths too
    return proc


def run_train(workdir, overrides: list[str], *, env: dict | None = None, check: bool = True,
              config: str = "configs/bert.py:size=tiny", xla_optimized: bool = False) -> subprocess.CompletedProcess:
    """`python -m pretrain.train --config=config --workdir=workdir overrides...`."""
    return run_module("pretrain.train", [f"--config={config}", f"--workdir={workdir}", *overrides],
                      env=env, check=check, xla_optimized=xla_optimized)
