"""Every test that starts a subprocess is marked slow (`make test-fast` leaves them out, `make
test-slow` runs only them): checked on the parsed test files, directly or through a helper or
fixture of the same file or of tests/conftest.py (a shared trained run) that starts one."""
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


def starting_functions(source: str, starters: frozenset[str] = frozenset()) -> set[str]:
    """Names of the functions of `source` that start a subprocess: they call a STARTER, or call (or take as a
    fixture argument) a function of `source` or a name of `starters` that does."""
    functions = {n.name: n for n in ast.walk(ast.parse(source))
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    starts = {name for name, f in functions.items() if _called_names(f) & STARTERS}
    changed = True
    while changed:  # helpers and fixtures that call (or take as argument) a function that starts one
        changed = False
        for name, f in functions.items():
            uses = _called_names(f) | {a.arg for a in f.args.args}
            if name not in starts and uses & (starts | starters):
                starts.add(name)
                changed = True
    return starts


def conftest_starters() -> frozenset[str]:
    """tests/conftest.py's functions and fixtures that start a subprocess (run_train, tiny_bert_workdir, ...)."""
    with open(os.path.join(conftest.REPO, "tests", "conftest.py"), encoding="utf-8") as f:
        return frozenset(starting_functions(f.read()))


def unmarked_subprocess_tests(source: str, starters: frozenset[str] = frozenset()) -> list[str]:
    """Names of the test functions of `source` that start a subprocess but are not marked slow (`starters`:
    names defined elsewhere, such as conftest's fixtures, that start one)."""
    tree = ast.parse(source)
    module_slow = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                      and _is_slow_mark(n.value) for n in tree.body)
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    starts = starting_functions(source, starters)
    return sorted(name for name in starts if name.startswith("test_") and not module_slow
                  and not any(_is_slow_mark(d) for d in functions[name].decorator_list))


def test_every_subprocess_test_is_marked_slow():
    starters = conftest_starters()
    assert {"run_train", "run_module", "tiny_bert_workdir", "tiny_gpt_workdir"} <= starters
    assert "corpus_and_tokenizer" not in starters  # built in process
    unmarked = {}
    for directory, _, files in os.walk(os.path.join(conftest.REPO, "tests")):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    found = unmarked_subprocess_tests(f.read(), starters)
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

        def test_through_shared_run(tiny_bert_workdir):
            assert tiny_bert_workdir

        def test_no_process():
            assert 1 + 1 == 2
        ''')
    assert unmarked_subprocess_tests(source) == ["test_direct", "test_through_fixture", "test_through_helper"]
    assert unmarked_subprocess_tests(source, frozenset({"tiny_bert_workdir"})) == [
        "test_direct", "test_through_fixture", "test_through_helper", "test_through_shared_run"]
    assert unmarked_subprocess_tests("import pytest\npytestmark = pytest.mark.slow\n" + source) == []

