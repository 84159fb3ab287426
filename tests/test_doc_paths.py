"""What README.md and docs/*.md cite exists: every repository path (`pretrain/loops/pretraining.py`,
`configs/bert.py:size=base`'s file, `scripts/bench_*.py`, `tests/...`, `docs/x.md`; in backticks, code blocks or
prose), every dotted module of the project (`python -m pretrain.train`, `pretrain.runtime.errors.UserError`), every
local Markdown link and its #anchor. README's Layout is a map of the rooms, not of every module: each folder it
gives exists, each path, file and snake_case name in an entry exists, and each room (a folder directly inside a
package) is on the map. The documents hold no path of a development machine (/work/..., /root/..., /home/USER,
/tmp/... other than the documented examples) and no commit hash: history goes to CHANGELOG.md. Each check is also
shown to fail on a synthetic repository (the files, the text, no import is executed)."""
from __future__ import annotations

import ast
import functools
import glob
import os
import re
import shutil

from tests.helpers.paths import REPO
from tests.helpers.trees import write_tree

PACKAGES = ("configs", "models", "objectives", "pretrain", "scripts", "tests")
TOP_FOLDERS = (*PACKAGES, "docs", ".ci")
# A path from the repository's root: a top folder, then path characters; {a,b} alternatives and * globs allowed.
PATH = re.compile(r"(?<![\w./~$-])(?<!\]\()((?:%s)/(?:[\w./*-]|\{[^{}\s]*\})*)" % "|".join(map(re.escape, TOP_FOLDERS)))
MODULE = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(PACKAGES))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SNAKE = re.compile(r"(?<![\w./-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w/-])")
FILE_NAME = re.compile(r"(?<![\w./-])([\w-]+\.(?:py|sh|md|txt|ini|json|jsonl|cfg|toml))(?![\w/-])")
# /tmp paths the documents may show: the launcher's own temporary tarball (pretrain.launch run --dry_run prints it).
TMP_EXAMPLES = ("/tmp/lmpretrain-",)
MACHINE_PATH = re.compile(r"(?<![\w.~$-])(/work/\S*|/root(?:/\S*)?|/home/\w\S*|/tmp/\S+)")
# A commit: 7-40 hex digits with at least one digit and one letter, alone in backticks or parentheses or after
# "commit", "revision" or "at"; or any 40.
_HEX = r"(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])([0-9a-f]{7,40})"
COMMIT = re.compile(r"(?<=[`(])%s(?=[`)])|\b(?:commit|revision|at)\s+%s\b|\b([0-9a-f]{40})\b" % (_HEX, _HEX))


def documents(root: str) -> list[str]:
    return [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))


def _line(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def _alternatives(path: str) -> list[str]:
    """`a/{b,c}/d` -> [a/b/d, a/c/d]."""
    brace = re.search(r"\{([^{}]*)\}", path)
    if not brace:
        return [path]
    return [p for alt in brace.group(1).split(",")
            for p in _alternatives(path[:brace.start()] + alt + path[brace.end():])]


def _exists(root: str, path: str) -> bool:
    return bool(glob.glob(os.path.join(root, path)))


@functools.lru_cache(maxsize=None)
def _defined_names(path: str) -> frozenset[str]:
    """Names a module defines at its top level or in its classes (functions, classes, assignments, imports)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in [*tree.body, *(n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body)]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def _module_file(root: str, dotted: str) -> str | None:
    base = os.path.join(root, *dotted.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def module_exists(root: str, dotted: str) -> bool:
    """`a.b.c`: the module or package a.b.c, or a name c that the module a.b defines."""
    if _module_file(root, dotted) or os.path.isdir(os.path.join(root, *dotted.split("."))):
        return True
    parent, _, name = dotted.rpartition(".")
    module = _module_file(root, parent)
    return module is not None and name in _defined_names(module)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces -> hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def _without_layout(text: str) -> str:
    """README's Layout block blanked (its paths are relative to their entry's folder: layout_problems checks
    them), its lines kept so that line numbers stay true."""
    section = re.search(r"^## Layout\n.*?(```\n.*?```)", text, re.M | re.S)
    if not section:
        return text
    start, end = section.span(1)
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def broken_citations(root: str) -> list[str]:
    """`document:line: problem` for every cited path, module or local link that does not resolve."""
    problems = []
    for document in documents(root):
        with open(document, encoding="utf-8") as f:
            text = _without_layout(f.read())
        where = os.path.relpath(document, root)
        for m in PATH.finditer(text):
            for path in _alternatives(m.group(1).rstrip(".,;:")):
                if not path.endswith("/...") and not _exists(root, path):
                    problems.append(f"{where}:{_line(text, m.start())}: {path} does not exist")
        for m in MODULE.finditer(text):
            if not module_exists(root, m.group(1)):
                problems.append(f"{where}:{_line(text, m.start())}: module {m.group(1)} does not exist")
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(os.path.dirname(document), file)) if file else document
            if not os.path.exists(path):
                problems.append(f"{where}:{_line(text, m.start())}: link {target} leads nowhere")
            elif anchor and (os.path.isdir(path) or anchor not in anchors(path)):
                problems.append(f"{where}:{_line(text, m.start())}: link {target}: no heading #{anchor}")
    return problems


def history_and_machine_paths(root: str) -> list[str]:
    """`document:line: problem` for every development-machine path and every commit hash in the documents."""
    problems = []
    for document in documents(root):
        with open(document, encoding="utf-8") as f:
            text = f.read()
        where = os.path.relpath(document, root)
        for m in MACHINE_PATH.finditer(text):
            path = m.group(1).rstrip(".,;:`'\")")
            if not path.startswith(TMP_EXAMPLES):
                problems.append(f"{where}:{_line(text, m.start())}: machine path {path}")
        for m in COMMIT.finditer(text):
            problems.append(f"{where}:{_line(text, m.start())}: commit {next(filter(None, m.groups()))} (history: CHANGELOG.md)")
    return problems


def cited_paths(root: str) -> list[str]:
    out = []
    for document in documents(root):
        with open(document, encoding="utf-8") as f:
            out += [m.group(1) for m in PATH.finditer(f.read())]
    return out


# ---------------------------------------------------------------------------------------------
# README's Layout
# ---------------------------------------------------------------------------------------------
def layout_entries(readme_text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The Layout section's code block -> (the files its first line names, [(folder, the entry's text)]). An
    entry starts a line with `name/`; indented by two spaces, it is a room of the entry above it."""
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme_text, re.M | re.S).group(1)
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    files, entries, parent = [], [], None
    for line in block.splitlines():
        m = re.match(r"^( {0,2})([\w.-]+)/ +(\S.*)$", line)
        if m:
            folder = m.group(2) if not m.group(1) else f"{parent}/{m.group(2)}"
            parent = parent if m.group(1) else m.group(2)
            entries.append((folder, m.group(3)))
        elif entries:
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
        else:
            files += line.split()
    return files, entries


@functools.lru_cache(maxsize=None)
def project_names(root: str) -> frozenset[str]:
    """Every file stem of the packages and every name their modules define."""
    names = set()
    for package in PACKAGES:
        for directory, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
            names.update(dirs)
            for name in files:
                names.add(name.split(".")[0])
                if name.endswith(".py"):
                    names |= _defined_names(os.path.join(directory, name))
    return frozenset(names)


def layout_problems(root: str) -> list[str]:
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        files, entries = layout_entries(f.read())
    problems = [f"Layout: {name} does not exist" for name in files if not os.path.exists(os.path.join(root, name))]
    names = project_names(root)
    for folder, text in entries:
        path = os.path.join(root, folder)
        if not os.path.isdir(path):
            problems.append(f"Layout: {folder}/ does not exist")
            continue
        for token in text.split():
            token = token.strip("()[],;:'\"`")
            if "/" in token and "://" not in token and token == token.lower() and not _exists(path, token):
                problems.append(f"Layout: {folder}/{token} does not exist")
        for name in FILE_NAME.findall(text):
            if not os.path.isfile(os.path.join(path, name)):
                problems.append(f"Layout: {folder}/{name} does not exist")
        for name in SNAKE.findall(text):
            if name not in names:
                problems.append(f"Layout: {folder}: {name} is neither a module nor a name defined in the project")
    problems += [f"Layout: {room}/ is a room the map does not show" for room in _unmapped_rooms(root, entries)]
    return problems


def _rooms(root: str) -> list[str]:
    """The folders directly inside a package (`pretrain/runtime`, `models/convert`, `tests/helpers`)."""
    return sorted(f"{package}/{name}" for package in PACKAGES if os.path.isdir(os.path.join(root, package))
                  for name in os.listdir(os.path.join(root, package))
                  if not name.startswith((".", "__")) and os.path.isdir(os.path.join(root, package, name)))


def _unmapped_rooms(root: str, entries: list[tuple[str, str]]) -> list[str]:
    """Rooms that are neither an entry of the Layout nor named (`name`, `name/`) in their package's entry."""
    texts = dict(entries)
    name = lambda room: re.compile(r"(?<![\w.-])%s(?![\w-])" % re.escape(room.partition("/")[2]))
    return [room for room in _rooms(root)
            if room not in texts and not name(room).search(texts.get(room.partition("/")[0], ""))]


# ---------------------------------------------------------------------------------------------
# The real documents.
# ---------------------------------------------------------------------------------------------
def test_every_cited_path_module_and_link_exists():
    assert len(cited_paths(REPO)) > 100  # the parser sees the citations
    assert broken_citations(REPO) == []


def test_the_layout_names_what_exists():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        files, entries = layout_entries(f.read())
    assert "setup.py" in files
    assert {"configs", "pretrain/runtime", "pretrain/loops", "scripts", "tests"} <= dict(entries).keys()
    assert layout_problems(REPO) == []


def test_no_machine_path_and_no_commit_hash():
    assert history_and_machine_paths(REPO) == []


# ---------------------------------------------------------------------------------------------
# The checks fail where they should (a synthetic repository).
# ---------------------------------------------------------------------------------------------
README = """\
    # Project

    Run `python -m pretrain.train --config=configs/bert.py:size=base`; see [training](docs/training.md#resume)
    and `scripts/bench_*.py`, `pretrain/{runtime,loops}/`, `pretrain.runtime.errors.UserError`.

    ## Layout

    ```
    setup.py
    configs/     get_config(arg) files: bert.py (this entry's paths are its own: tools/)
    pretrain/    the system: train.py (main_loop)
      runtime/   errors.py
      loops/     none yet
    scripts/     bench_glue
    ```
    """
FILES = {
    "setup.py": "",
    "configs/__init__.py": "", "configs/bert.py": "def get_config(arg):\n    pass\n", "configs/tools/x.txt": "",
    "pretrain/__init__.py": "", "pretrain/train.py": "def main_loop():\n    pass\n",
    "pretrain/runtime/__init__.py": "", "pretrain/runtime/errors.py": "class UserError(ValueError):\n    pass\n",
    "pretrain/loops/__init__.py": "",
    "scripts/bench_glue.py": "",
    "docs/training.md": "# Training\n\n## Resume\n",
}


def test_a_synthetic_repository_whose_citations_hold_passes(tmp_path):
    root = write_tree(tmp_path, {**FILES, "README.md": README})
    assert broken_citations(root) == [] and layout_problems(root) == [] and history_and_machine_paths(root) == []


def test_a_readme_citing_what_is_not_there_fails(tmp_path):
    cited = ("`scripts/bench_*.py`, `tests/test_train.py`, `python -m scripts.cram`, [gone](docs/gone.md), "
             "[here](#nowhere)")
    readme = README.replace("`scripts/bench_*.py`", cited)
    readme = readme.replace("docs/training.md#resume", "docs/training.md#resuming")
    root = write_tree(tmp_path, {**FILES, "README.md": readme})
    assert broken_citations(root) == [
        "README.md:4: tests/test_train.py does not exist",
        "README.md:4: module scripts.cram does not exist",
        "README.md:3: link docs/training.md#resuming: no heading #resuming",
        "README.md:4: link docs/gone.md leads nowhere",
        "README.md:4: link #nowhere: no heading #nowhere",
    ]


def test_a_moved_file_and_a_missing_module_fail(tmp_path):
    files = {**FILES, "README.md": README}
    files["scripts/bench/glue.py"] = files.pop("scripts/bench_glue.py")  # `scripts/bench_*.py` matches nothing now
    files["pretrain/runtime/errors.py"] = "class Error(ValueError):\n    pass\n"
    root = write_tree(tmp_path, files)
    assert broken_citations(root) == ["README.md:4: scripts/bench_*.py does not exist",
                                      "README.md:4: module pretrain.runtime.errors.UserError does not exist"]


def test_a_layout_out_of_date_fails(tmp_path):
    readme = README.replace("files: bert.py", "files: bert.py t5.py (also get_sweep)")
    files = {**FILES, "README.md": readme, "pretrain/workdir/storage.py": "", "pretrain/runtime/cli.py": ""}
    del files["configs/tools/x.txt"]
    root = write_tree(tmp_path, files)
    assert layout_problems(root) == [
        "Layout: configs/tools/ does not exist",
        "Layout: configs/t5.py does not exist",
        "Layout: configs: get_sweep is neither a module nor a name defined in the project",
        "Layout: pretrain/workdir/ is a room the map does not show",
    ]  # a module the map does not name (runtime/cli.py) is no problem: the map shows rooms, not every module
    os.remove(os.path.join(root, "setup.py"))
    os.remove(os.path.join(root, "pretrain", "runtime", "errors.py"))
    shutil.rmtree(os.path.join(root, "pretrain", "loops"))
    problems = layout_problems(root)
    assert problems[0] == "Layout: setup.py does not exist" and "Layout: pretrain/loops/ does not exist" in problems
    assert "Layout: pretrain/runtime/errors.py does not exist" in problems


def test_a_room_named_in_its_package_entry_is_on_the_map(tmp_path):
    readme = README.replace("the system: train.py", "the system: train.py, workdir/ (a run's files)")
    root = write_tree(tmp_path, {**FILES, "README.md": readme, "pretrain/workdir/storage.py": ""})
    assert layout_problems(root) == []


def test_machine_paths_and_commit_hashes_fail(tmp_path):
    readme = README.replace("# Project\n", "# Project\n\n"
                            "Built in /work/main, cached in /root/.cache and /home/dev/x, unpacked to /tmp/site;\n"
                            "the launcher packs /tmp/lmpretrain-bert-1.tar.gz, not https://x.org/work/a or ~/tmp/a.\n"
                            "Fixed in (5c9f994) and `e9c2436`, as commit 802c270 had it; see\n"
                            "60113d4aaee088570231a5fab541be3b82bd6afe.\n"
                            "Not commits: (decade), (1234567), `abcdef`, at 1,200 steps, a commit of the code.\n")
    root = write_tree(tmp_path, {**FILES, "README.md": readme, "docs/training.md": "# T\n\nin /tmp/x.\n"})
    assert history_and_machine_paths(root) == [
        "README.md:3: machine path /work/main",
        "README.md:3: machine path /root/.cache",
        "README.md:3: machine path /home/dev/x",
        "README.md:3: machine path /tmp/site",
        "README.md:5: commit 5c9f994 (history: CHANGELOG.md)",
        "README.md:5: commit e9c2436 (history: CHANGELOG.md)",
        "README.md:5: commit 802c270 (history: CHANGELOG.md)",
        "README.md:6: commit 60113d4aaee088570231a5fab541be3b82bd6afe (history: CHANGELOG.md)",
        "docs/training.md:3: machine path /tmp/x",
    ]
