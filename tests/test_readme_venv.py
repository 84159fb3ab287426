"""README's commands work as printed on a fresh clone: its `python -m` commands need the venv that `make demo` and
`make test` build (absl, JAX, ... are installed nowhere else), so the quick start activates it before the first
of them, and says that the commands in docs/ assume the same. A command printed before that line names the venv's
python (`.venv/bin/python -m ...`). Shown to fail on synthetic READMEs."""
from __future__ import annotations

import os
import re

from tests.helpers.paths import REPO

ACTIVATE = "source .venv/bin/activate"
# `python -m` or `python3 -m` on its own, not `.venv/bin/python -m` (nor a word ending in python).
BARE_PYTHON_M = re.compile(r"(?<![\w/.-])python3? -m ")
COVERS_DOCS = re.compile(r"`python -m` commands on this page and in \[docs/\]\(docs/\) run in it, activated")


def commands_before_activation(text: str) -> list[int]:
    """The lines (1-based) with a bare `python -m` before the line that activates the venv; all of them if no
    line does."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip().startswith(ACTIVATE)), len(lines))
    return [i + 1 for i, line in enumerate(lines[:first]) if BARE_PYTHON_M.search(line)]


def _readme() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_activates_the_venv_before_its_first_python_m_command():
    text = _readme()
    assert ACTIVATE in text and BARE_PYTHON_M.search(text)
    assert commands_before_activation(text) == []


def test_readme_says_the_docs_commands_run_in_the_same_venv():
    assert COVERS_DOCS.search(" ".join(_readme().split()))


def test_a_python_m_command_before_the_activation_or_without_one_is_found():
    activated = "make demo\nsource .venv/bin/activate   # then\npython -m pretrain.train --config=x\n"
    assert commands_before_activation(activated) == []
    late = "python -m pretrain.train --config=x\n" + activated
    assert commands_before_activation(late) == [1]
    assert commands_before_activation("make demo\n`python3 -m pretrain.adapt` and python -m a.b\n") == [2]
    assert commands_before_activation(".venv/bin/python -m pretrain.train\nmypython -m x\n") == []
