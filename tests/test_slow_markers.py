"""Every test that starts a subprocess is marked slow (`make test-fast` leaves them out, `make
test-slow` runs only them): checked on the parsed test files, directly or through a helper or
fixture of the same file, a helper of tests/helpers/ (run_module, run_train) or a fixture of tests/conftest.py
(a shared trained run) that starts one."""
from __future__ import annotations

import ast
import glob
import os
import textwrap

from tests.helpers.paths import REPO

# Calls that start a process: tests/helpers/commands.py's real commands and the subprocess module.
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


def shared_starters(tests_dir: str = os.path.join(REPO, "tests")) -> frozenset[str]:
    """The functions of tests/helpers/ and the functions and fixtures of tests/conftest.py that start a subprocess
    (run_module, run_train, tiny_bert_workdir, ...), also through one another, across files. A program of
    tests/helpers/ (command_server: `if __name__ == "__main__"`) is started, never called, by the tests."""
    sources = []
    paths = sorted(glob.glob(os.path.join(tests_dir, "helpers", "*.py"))) + [os.path.join(tests_dir, "conftest.py")]
    for path in paths:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        if "\nif __name__ == \"__main__\":" not in source:
            sources.append(source)
    starters: set[str] = set()
    while True:
        found = set().union(*(starting_functions(source, frozenset(starters)) for source in sources))
        if found <= starters:
            return frozenset(starters)
        starters |= found


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
    starters = shared_starters()
    assert {"run_train", "run_module", "tiny_bert_workdir", "tiny_gpt_workdir", "char_gpt_glue_workdir"} <= starters
    assert "corpus_and_tokenizer" not in starters  # built in process
    assert "tiny_overrides" not in starters and "subprocess_env" not in starters  # flags and an environment
    unmarked, checked = {}, 0
    for directory, _, files in os.walk(os.path.join(REPO, "tests")):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    found = unmarked_subprocess_tests(f.read(), starters)
                checked += 1
                if found:
                    unmarked[os.path.relpath(path, REPO)] = found
    assert checked > 80  # the walk reaches the room folders (tests/pretrain/runtime/, ...)
    assert unmarked == {}


def test_the_check_finds_an_unmarked_test():
    source = textwrap.dedent('''
        import pytest, subprocess
        from tests.helpers.commands import run_train

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



def test_shared_starters_follow_helpers_and_fixtures_across_files(tmp_path):
    """A helper of tests/helpers/ that starts a command through another helper, and a conftest fixture that calls
    it, both count; a helper that only builds flags does not."""
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "commands.py").write_text("import subprocess\n\ndef run_module(m):\n"
                                                     "    subprocess.run(['python', '-m', m])\n")
    (tmp_path / "helpers" / "runs.py").write_text("from tests.helpers.commands import run_module\n\n"
                                                 "def train_twice():\n    run_module('a')\n    run_module('b')\n\n"
                                                 "def flags():\n    return ['--x=1']\n")
    (tmp_path / "helpers" / "server.py").write_text("import runpy\n\ndef main():\n    runpy.run_module('x')\n\n"
                                                   "if __name__ == \"__main__\":\n    main()\n")
    (tmp_path / "conftest.py").write_text("import pytest\nfrom tests.helpers.runs import train_twice\n\n"
                                          "@pytest.fixture\ndef trained():\n    train_twice()\n")
    starters = shared_starters(str(tmp_path))
    assert {"run_module", "train_twice", "trained"} <= starters and not {"flags", "main"} & starters
    assert unmarked_subprocess_tests("def test_a(trained):\n    pass\n\ndef test_b():\n    train_twice()\n"
                                     "\ndef test_c():\n    flags()\n", starters) == ["test_a", "test_b"]
