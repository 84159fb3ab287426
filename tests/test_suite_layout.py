"""The suite's own layout (README, Layout: tests/): tests mirror the code, and a test file imports what it shares
from tests/helpers/ only.

- tests/pretrain/ holds a folder per room of pretrain/ (each room has one, and every folder is a room) and
  commands/ (the entry points end to end); tests/ mirrors the top packages it tests (models/, objectives/,
  pretrain/, scripts/).
- Every folder of tests/ is a package (an __init__.py): two test files of one basename in two folders
  (tests/models/test_x.py, tests/pretrain/data/test_x.py) import as two modules, never one over the other.
- No module of tests/ imports a test module (test_*.py) or conftest.py: what several files share lives in
  tests/helpers/ (functions, constants) or conftest.py (fixtures, which pytest hands over by name).
Each rule is also shown to fail on a small synthetic tree (ast: no import is executed).
"""
from __future__ import annotations

import ast
import os

from tests.helpers.paths import REPO
from tests.helpers.trees import write_tree

# Folders of tests/pretrain/ that are not rooms of pretrain/.
NOT_ROOMS = {"commands"}
# Top folders of tests/ that mirror no folder of the repository.
NOT_PACKAGES = {"helpers"}


def _folders(path: str) -> set[str]:
    return {d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)) and not d.startswith((".", "__"))}


def _imports_of_tests(path: str, module: str) -> set[str]:
    """The modules of the `tests` package that the file imports, at any depth (relative imports resolved)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = module.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - (node.level - 1)] + ([base] if base else []))
            # `from tests import conftest` imports the module tests.conftest
            found.update(f"{base}.{a.name}" for a in node.names)
            found.add(base)
    return {name for name in found if name == "tests" or name.startswith("tests.")}


def _is_shared_module(name: str) -> bool:
    """A module a test file may import: tests.helpers and its modules (or the bare `tests` package)."""
    return name in ("tests", "tests.helpers") or name.startswith("tests.helpers.")


def check(root: str) -> list[str]:
    """Every problem of the suite at root/tests (against the code at root), one line each."""
    tests = os.path.join(root, "tests")
    problems = []
    rooms = _folders(os.path.join(root, "pretrain"))
    test_rooms = _folders(os.path.join(tests, "pretrain"))
    problems += [f"tests/pretrain/{r}/ is missing: pretrain/{r}/ has no tests" for r in sorted(rooms - test_rooms)]
    problems += [f"tests/pretrain/{r}/ is no room of pretrain/" for r in sorted(test_rooms - rooms - NOT_ROOMS)]
    problems += [f"tests/{d}/ mirrors no folder of the repository" for d in sorted(_folders(tests) - NOT_PACKAGES)
                 if not os.path.isdir(os.path.join(root, d))]
    for directory, dirs, files in os.walk(tests):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        relative = os.path.relpath(directory, root)
        if "__init__.py" not in files:
            problems.append(f"{relative}/ has no __init__.py")
        for name in sorted(f for f in files if f.endswith(".py")):
            module = ".".join(relative.split(os.sep) + [name[:-3]])
            for target in sorted(_imports_of_tests(os.path.join(directory, name), module)):
                last = target.rpartition(".")[2]
                if not _is_shared_module(target) and (last.startswith("test_") or last == "conftest"):
                    problems.append(f"{relative}/{name} imports {target}: share it through tests/helpers/ or "
                                    "a conftest fixture")
    return problems


# ---------------------------------------------------------------------------------------------
# The real suite.
# ---------------------------------------------------------------------------------------------
def test_the_suite_mirrors_the_rooms_and_shares_through_helpers():
    rooms = {"runtime", "workdir", "training", "data", "tasks", "finetuners", "lm", "distillation", "loops", "jobs"}
    assert rooms <= _folders(os.path.join(REPO, "tests", "pretrain"))
    assert check(REPO) == []


# ---------------------------------------------------------------------------------------------
# The rules fail where they should (synthetic trees).
# ---------------------------------------------------------------------------------------------
CLEAN = {
    "pretrain/__init__.py": "", "pretrain/core/__init__.py": "", "pretrain/loops/__init__.py": "",
    "models/__init__.py": "",
    "tests/__init__.py": "", "tests/conftest.py": "from tests.helpers.paths import REPO\n",
    "tests/helpers/__init__.py": "", "tests/helpers/paths.py": "REPO = '.'\n",
    "tests/models/__init__.py": "", "tests/models/test_a.py": "from tests.helpers import paths\n",
    "tests/pretrain/__init__.py": "",
    "tests/pretrain/core/__init__.py": "", "tests/pretrain/core/test_a.py": "from tests.helpers.paths import REPO\n",
    "tests/pretrain/loops/__init__.py": "", "tests/pretrain/loops/test_b.py": "def f():\n    from .. import core\n",
    "tests/pretrain/commands/__init__.py": "", "tests/pretrain/commands/test_c.py": "import os\n",
}


def test_a_clean_synthetic_suite_passes(tmp_path):
    assert check(write_tree(tmp_path, CLEAN)) == []


def test_a_test_module_importing_another_fails(tmp_path):
    tree = {**CLEAN,
            "tests/models/test_a.py": "from tests.pretrain.core.test_a import helper\n",
            "tests/pretrain/loops/test_b.py": "def f():\n    from ..core import test_a\n",  # lazy and relative
            "tests/pretrain/commands/test_c.py": "from tests import conftest\nimport tests.conftest\n"}
    assert check(write_tree(tmp_path, tree)) == [
        "tests/models/test_a.py imports tests.pretrain.core.test_a: share it through tests/helpers/ or a conftest "
        "fixture",
        "tests/pretrain/commands/test_c.py imports tests.conftest: share it through tests/helpers/ or a conftest "
        "fixture",
        "tests/pretrain/loops/test_b.py imports tests.pretrain.core.test_a: share it through tests/helpers/ or a "
        "conftest fixture",
    ]


def test_rooms_without_tests_and_tests_without_rooms_fail(tmp_path):
    tree = {**CLEAN, "pretrain/lm/__init__.py": "", "tests/pretrain/utils/__init__.py": "",
            "tests/pretrain/utils/test_d.py": "", "tests/tools/__init__.py": ""}
    assert check(write_tree(tmp_path, tree)) == [
        "tests/pretrain/lm/ is missing: pretrain/lm/ has no tests",
        "tests/pretrain/utils/ is no room of pretrain/",
        "tests/tools/ mirrors no folder of the repository",
    ]


def test_a_folder_without_init_fails(tmp_path):
    tree = dict(CLEAN)
    del tree["tests/pretrain/core/__init__.py"]
    assert check(write_tree(tmp_path, tree)) == ["tests/pretrain/core/ has no __init__.py"]
