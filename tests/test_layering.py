"""The architecture rule, checked on every module's imports and "module:attr" strings (ast, nothing is executed).

Dependencies run one way, configs -> nothing; models -> models; objectives -> models; pretrain's
rooms upward (see README, Layout): runtime -> workdir -> training -> data -> tasks -> {finetuners, lm} ->
distillation -> loops -> entry points, and jobs beside them on runtime and workdir alone. A module may import
its own room and the rooms below it, never a room above it nor a sibling room; a "module:attr" string constant
(what a registry imports on first use, models/registry.py) names only a module its own module may import, so the
rule holds for lazy names too; there is no import cycle (imports inside functions count: a lazy import hides a
cycle but does not remove it); and no module is over MAX_LINES lines. Each rule is also shown to fail on a small
synthetic tree.
"""
from __future__ import annotations

import ast
import os
import re

import pytest

from tests.helpers.trees import write_tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("configs", "models", "objectives", "pretrain", "scripts", "tests")
MAX_LINES = 400
MAX_LOOP_FUNCTION = 60  # lines of a function in pretrain/loops/
MODULE_ATTR = re.compile(r"^[a-z_][\w.]*:[A-Za-z_][\w.]*$")  # "package.module:Class.attribute"

# room -> the rooms it may import (besides itself and third-party libraries), each with the rooms
# inside it. A module belongs to the longest room that prefixes its name; `pretrain` alone holds
# the entry points (the six commands of a run, and launch / sweep, which operate them); `pretrain.tools`
# the commands around a run.
def _above(*rooms: str) -> set[str]:
    """A room's allowed imports: the rooms named and everything they may import."""
    return set(rooms).union(*(ALLOWED[r] for r in rooms))


ALLOWED: dict[str, set[str]] = {"configs": set(), "models": set()}
ALLOWED["objectives"] = {"models"}
# The system's base, bottom up: the process and its devices (CLI, errors, mesh, multi-host, profiling, the chips);
# the workdir (storage, checkpoints, metrics, the lock, preemption); training (optimizers, the train state,
# freezing, PEFT, config validation, pretrained weights).
ALLOWED["pretrain.runtime"] = _above("objectives")
ALLOWED["pretrain.workdir"] = _above("pretrain.runtime")
ALLOWED["pretrain.training"] = _above("pretrain.workdir")
# Operating runs: TPU VMs through gcloud, sweeps of whole commands. They start the entry points as processes
# (locally or on a VM) and read the files those write: nothing of loops, models or objectives.
ALLOWED["pretrain.jobs"] = {"pretrain.runtime", "pretrain.workdir"}
ALLOWED["pretrain.data"] = _above("pretrain.training")
# The fine-tuning tasks (GLUE in tasks.glue, CoNLL, SQuAD): their files and official metrics.
ALLOWED["pretrain.tasks"] = _above("pretrain.data")
# One model family's side of fine-tuning on one kind of task; the language-model tools (generation, few-shot).
ALLOWED["pretrain.finetuners"] = _above("pretrain.tasks")
ALLOWED["pretrain.lm"] = _above("pretrain.tasks")
# Distillation's teachers: a pretraining run's (teacher.py) and a fine-tuning run's logits (task_teacher.py).
ALLOWED["pretrain.distillation"] = _above("pretrain.finetuners")
ALLOWED["pretrain.loops"] = _above("pretrain.distillation")
# The entry points (the six commands of a run, and launch / sweep, which operate them).
ALLOWED["pretrain"] = _above("pretrain.loops", "pretrain.lm", "pretrain.jobs")
# The tools a user runs around a run (python -m pretrain.tools.X: corpus, tokenizer, export, AOT compile):
# entry-point level, like `pretrain`, but a room of their own, so no entry point or lower room imports them.
ALLOWED["pretrain.tools"] = ALLOWED["pretrain"] - {"pretrain"}
ALLOWED["scripts"] = {"scripts", "pretrain", "objectives", "models", "configs"}
ALLOWED["tests"] = {"tests", "scripts", "pretrain", "objectives", "models", "configs"}


def find_modules(root: str) -> dict[str, str]:
    """-> {dotted module name: file path} for every .py file of PACKAGES under root."""
    modules = {}
    for package in PACKAGES:
        for directory, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    parts = os.path.relpath(path, root)[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    modules[".".join(parts)] = path
    return modules


def imported_modules(module: str, path: str, known: set[str]) -> set[str]:
    """The project modules `module` imports, at any depth of its code (function bodies included)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    is_package = os.path.basename(path) == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            # `from a import b`: the submodule a.b if there is one, else the module a
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b.c` of a package-less name: nearest module
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def named_modules(path: str, known: set[str]) -> set[str]:
    """The project modules named by the "module:attr" string constants of the module at `path`."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = {node.value.partition(":")[0] for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_ATTR.match(node.value)}
    return names & known


def room_of(module: str) -> str | None:
    rooms = [r for r in ALLOWED if module == r or module.startswith(r + ".")]
    return max(rooms, key=len) if rooms else None


def layering_violations(graph: dict[str, set[str]], verb: str = "imports") -> list[str]:
    """Each edge of `graph` (module -> what it imports, or names: `verb`) against a room it may not import."""
    out = []
    for module, imports in sorted(graph.items()):
        room = room_of(module)
        for target in sorted(imports):
            target_room = room_of(target)
            if room is None or target_room is None or target_room == room:
                continue
            if not any(target_room == r or target_room.startswith(r + ".") for r in ALLOWED[room]):
                out.append(f"{module} {verb} {target}: room {room} may not import {target_room}")
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), as a sorted list."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def long_modules(modules: dict[str, str]) -> list[str]:
    out = []
    for module, path in sorted(modules.items()):
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            out.append(f"{module} has {lines} lines (split it before {MAX_LINES})")
    return out


def long_loop_functions(modules: dict[str, str]) -> list[str]:
    """Functions of pretrain/loops/ over MAX_LOOP_FUNCTION lines: a loop reads top to bottom in short parts."""
    out = []
    for module, path in sorted(modules.items()):
        if room_of(module) != "pretrain.loops":
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LOOP_FUNCTION:
                    out.append(f"{module}.{node.name} has {lines} lines (split it before {MAX_LOOP_FUNCTION})")
    return out


def check(root: str) -> list[str]:
    """Every problem of the tree at `root`, one line each."""
    modules = find_modules(root)
    known = set(modules)
    graph = {m: imported_modules(m, p, known) for m, p in modules.items()}
    named = {m: named_modules(p, known) for m, p in modules.items()}
    return (layering_violations(graph) + layering_violations(named, 'names in a "module:attr" string')
            + [f"import cycle: {' <-> '.join(c)}" for c in import_cycles(graph)]
            + long_modules(modules) + long_loop_functions(modules))


# ---------------------------------------------------------------------------------------------
# The real tree.
# ---------------------------------------------------------------------------------------------
def test_every_module_belongs_to_a_room():
    modules = find_modules(REPO)
    assert len(modules) > 100
    assert [m for m in modules if room_of(m) is None] == []


def test_the_repository_follows_the_rules():
    assert check(REPO) == []


def test_lower_layers_never_import_pretrain():
    """The issue's grep, done on the parsed imports: models/ and objectives/ never name pretrain."""
    modules = find_modules(REPO)
    graph = {m: imported_modules(m, p, set(modules)) for m, p in modules.items()}
    upward = {m: sorted(t for t in targets if t.startswith("pretrain"))
              for m, targets in graph.items() if m.startswith(("models", "objectives", "configs"))}
    assert {m: t for m, t in upward.items() if t} == {}
    # the graph sees real edges: the trainer set-up imports the objectives and the model registry
    assert {"objectives", "models", "pretrain.loops.steps"} <= graph["pretrain.loops.setup"]


# ---------------------------------------------------------------------------------------------
# The rules fail where they should (synthetic trees).
# ---------------------------------------------------------------------------------------------
CLEAN = {
    "models/__init__.py": "",
    "models/layers.py": "import numpy as np\n",
    "objectives/__init__.py": "",
    "objectives/mlm.py": "from models import layers\n",
    "pretrain/__init__.py": "",
    "pretrain/runtime/__init__.py": "",
    "pretrain/runtime/errors.py": "class UserError(ValueError):\n    pass\n",
    "pretrain/loops/__init__.py": "",
    "pretrain/loops/pretraining.py": "from objectives import mlm\nfrom pretrain.runtime.errors import UserError\n",
    "pretrain/train.py": "from pretrain.loops import pretraining\n",
    "configs/__init__.py": "",
    "configs/bert.py": "import ml_collections\n",
}


def test_a_clean_synthetic_tree_passes(tmp_path):
    assert check(write_tree(tmp_path, CLEAN)) == []


@pytest.mark.parametrize("module, source, expected", [
    # models/ reaching up into pretrain/ (what models/decoding.py used to do)
    ("models/decoding.py", "from pretrain.runtime.errors import UserError\n",
     "models.decoding imports pretrain.runtime.errors: room models may not import pretrain.runtime"),
    # hidden in a function body: still an import
    ("objectives/nsp.py", "def f():\n    from pretrain.loops import pretraining\n",
     "objectives.nsp imports pretrain.loops.pretraining: room objectives may not import pretrain.loops"),
    # a lower pretrain room importing a higher one
    ("pretrain/workdir/checkpoints.py", "from pretrain.loops.pretraining import x\n",
     "pretrain.workdir.checkpoints imports pretrain.loops.pretraining: room pretrain.workdir may not "
     "import pretrain.loops"),
    # configs import nothing of the packages
    ("configs/gpt2.py", "import models\n", "configs.gpt2 imports models: room configs may not import models"),
    # an entry point is not a library: loops may not import it
    ("pretrain/loops/finetuning.py", "from pretrain import train\n",
     "pretrain.loops.finetuning imports pretrain.train: room pretrain.loops may not import pretrain"),
])
def test_an_upward_import_fails(tmp_path, module, source, expected):
    problems = check(write_tree(tmp_path, {**CLEAN, module: source}))
    assert problems == [expected]


def test_an_entry_point_may_not_import_a_tool(tmp_path):
    """pretrain.tools sits beside the entry points: a tool may import the loops, but no entry point imports a tool."""
    tree = {**CLEAN, "pretrain/tools/__init__.py": "",
            "pretrain/tools/export.py": "from pretrain.loops import pretraining\n"}
    assert check(write_tree(tmp_path, tree)) == []
    tree["pretrain/train.py"] = "from pretrain.tools import export\n"
    assert check(write_tree(tmp_path, tree)) == [
        "pretrain.train imports pretrain.tools.export: room pretrain may not import pretrain.tools"]


def test_an_import_cycle_fails_even_behind_a_lazy_import(tmp_path):
    tree = {**CLEAN,
            "pretrain/loops/finetuning.py": "from pretrain.loops import families\n",
            "pretrain/loops/families.py": "def for_config():\n    from pretrain.loops import finetuning\n"}
    assert check(write_tree(tmp_path, tree)) == [
        "import cycle: pretrain.loops.families <-> pretrain.loops.finetuning"]


def test_a_long_module_fails(tmp_path):
    tree = {**CLEAN, "models/big.py": "x = 1\n" * (MAX_LINES + 1)}
    assert check(write_tree(tmp_path, tree)) == [f"models.big has {MAX_LINES + 1} lines (split it before {MAX_LINES})"]
    tree["models/big.py"] = "x = 1\n" * MAX_LINES
    assert check(write_tree(tmp_path, tree)) == []


def test_a_long_loop_function_fails(tmp_path):
    body = "    x = 1\n" * (MAX_LOOP_FUNCTION - 1)
    tree = {**CLEAN, "pretrain/loops/__init__.py": "", "pretrain/loops/run.py": f"def run():\n{body}    return x\n"}
    assert check(write_tree(tmp_path, tree)) == [
        f"pretrain.loops.run.run has {MAX_LOOP_FUNCTION + 1} lines (split it before {MAX_LOOP_FUNCTION})"]
    tree["pretrain/loops/run.py"] = f"def run():\n{body}"
    assert check(write_tree(tmp_path, tree)) == []


@pytest.mark.parametrize("module, source, expected", [
    # a model family's table naming the finetuner that fine-tunes it (what models/families.py used to do)
    ("models/families.py", 'FINETUNER = "pretrain.finetuners.bert:BertFinetuner"\n',
     'models.families names in a "module:attr" string pretrain.finetuners.bert: room models may not import '
     'pretrain.finetuners'),
    # an objective naming a loop, inside a call: every string constant counts
    ("objectives/mlm.py", 'register("x", "pretrain.loops.pretraining:load_teacher")\n',
     'objectives.mlm names in a "module:attr" string pretrain.loops.pretraining: room objectives may not import '
     'pretrain.loops'),
])
def test_an_upward_module_attr_string_fails(tmp_path, module, source, expected):
    tree = {**CLEAN, "pretrain/finetuners/__init__.py": "", "pretrain/finetuners/bert.py": "",
            module: source}
    assert check(write_tree(tmp_path, tree)) == [expected]


def test_a_module_attr_string_below_or_outside_the_project_passes(tmp_path):
    tree = {**CLEAN, "pretrain/loops/registry.py": 'A = "objectives.mlm:Mlm"\nB = "numpy:zeros"\n'
                                                   'C = "configs/bert.py:size=base"\nD = "time: 3:00"\n'}
    assert check(write_tree(tmp_path, tree)) == []


def test_relative_imports_resolve(tmp_path):
    tree = {**CLEAN, "models/gpt.py": "from ..pretrain.runtime import errors\n",
            "models/heads.py": "from . import layers\n"}
    problems = check(write_tree(tmp_path, tree))
    assert problems == ["models.gpt imports pretrain.runtime.errors: room models may not import pretrain.runtime"]
