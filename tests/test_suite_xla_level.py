"""The suite's XLA optimisation level (tests/conftest.py, tests/helpers/commands.py): commands compile at level 0,
those of tests marked `xla_optimized` with the user's own flags, in pytest-xdist's workers too (which inherit
the controller's environment, where XLA_FLAGS already has level 0)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.paths import REPO

USER_FLAG = "--xla_force_host_platform_device_count=1"
PROBE = textwrap.dedent('''
    import json
    import os

    import pytest

    from tests.helpers.commands import subprocess_env


    def _record(name):
        with open(os.path.join(os.environ["PROBE_OUT"], name + ".json"), "w") as f:
            json.dump(subprocess_env({"XLA_FLAGS": "--extra"})["XLA_FLAGS"], f)


    def test_plain():
        _record("plain")


    @pytest.mark.xla_optimized
    def test_optimized():
        _record("optimized")
''')


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_commands_of_xla_optimized_tests_get_the_users_flags(tmp_path, workers):
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMPRETRAIN_")}  # as a user's shell has it
    env.update(XLA_FLAGS=USER_FLAG, PROBE_OUT=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "-n", workers, "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    flags = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in ("plain", "optimized")}
    assert flags["plain"].split() == [USER_FLAG, "--xla_backend_optimization_level=0", "--extra"]
    assert flags["optimized"].split() == [USER_FLAG, "--extra"]
