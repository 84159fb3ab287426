"""Every test that starts a subprocess is marked slow (`make test-fast` leaves them out, `make
test-slow` runs only them): checked on the parsed test files, directly or through a helper or
fixture of the same file that starts one."""
from __future__ import annotations

import ast
import os
import textwrap

from tests import conftest

# Calls that start a process: conftest's real-command helpers and the subprocess module.
STARTERS = {"run_module", "run_train", "subprocess.run", "subprocess.Popen", "subprocess.check_output",
            "subprocess.check_call", "subprocess.call", "os.system"}


def _called_names(node: ast.AST) -> set[str]:
    names = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            f = call.func
            if isinstance(f, ast.Name):
                names.add(f.id)
            elif isinstance(f, ast.Attribute):
                names.add(f.attr)
                if isinstance(f.value, ast.Name):
                    names.add(f"{f.value.id}.{f.attr}")
    return names


def _is_slow_mark(node: ast.AST) -> bool:
    return "pytest.mark.slow" in ast.unparse(node)


def unmarked_subprocess_tests(source: str) -> list[str]:
    """Names of the test functions of `source` that start a subprocess but are not marked slow."""
    tree = ast.parse(source)
    module_slow = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                      and _is_slow_mark(n.value) for n in tree.body)
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    starts = {name for name, f in functions.items() if _called_names(f) & STARTERS}
    changed = True
    while changed:  # helpers and fixtures that call (or take as argument) a function that starts one
        changed = False
        for name, f in functions.items():
            uses = _called_names(f) | {a.arg for a in f.args.args}
            if name not in starts and uses & starts:
                starts.add(name)
                changed = True
    return sorted(name for name in starts if name.startswith("test_") and not module_slow
                  and not any(_is_slow_mark(d) for d in functions[name].decorator_list))


def test_every_subprocess_test_is_marked_slow():
    unmarked = {}
    for directory, _, files in os.walk(os.path.join(conftest.REPO, "tests")):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    found = unmarked_subprocess_tests(f.read())
                if found:
                    unmarked[name] = found
    assert unmarked == {}


def test_the_check_finds_an_unmarked_test():
    source = textwrap.dedent('''
        import pytest, subprocess
        from tests.conftest import run_train

        @pytest.fixture
        def workdir(tmp_path):
            run_train(tmp_path, [])
            return tmp_path

        def helper():
            subprocess.run(["true"])

        def test_direct(tmp_path):
            run_train(tmp_path, [])

        def test_through_fixture(workdir):
            assert workdir

        def test_through_helper():
            helper()

        @pytest.mark.slow
        def test_marked(tmp_path):
            run_train(tmp_path, [])

        def test_no_process():
            assert 1 + 1 == 2
        ''')
    assert unmarked_subprocess_tests(source) == ["test_direct", "test_through_fixture", "test_through_helper"]
    assert unmarked_subprocess_tests("import pytest\npytestmark = pytest.mark.slow\n" + source) == []
