r"""Builds an offline English pretraining corpus from text that ships with CPython.

  python scripts/build_demo_corpus.py --output DIR/corpus.txt [--max_mb 4]

Sources, in this order: the Language Reference topics of `pydoc_data.topics` (one topic = one
document), then the docstrings of the standard library's modules, classes and functions (one
module = one document), read with `ast` from the .py files -- never imported, since importing
(tkinter, antigravity, this, ...) has side effects. Output is BERT's pretraining text format: one
sentence per line, a blank line between documents. Same Python, same file: the order is sorted.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
import sysconfig

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


def iter_documents():
    """Yields documents (lists of sentences), topics first, then stdlib modules by sorted path."""
    from pydoc_data.topics import topics  # a data module: a dict of strings, safe to import

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


def build_corpus(output_path: str, max_mb: float = 4.0) -> dict:
    """Writes the corpus, stopping before it would exceed `max_mb` MB; returns its stats."""
    budget = int(max_mb * 1e6)
    stats = {"documents": 0, "sentences": 0, "bytes": 0}
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    with open(output_path, "w", encoding="utf-8") as f:
        for sentences in iter_documents():
            if not sentences:
                continue
            chunk = ("\n" if stats["documents"] else "") + "\n".join(sentences) + "\n"
            size = len(chunk.encode("utf-8"))
            if stats["bytes"] + size > budget:
                break
            f.write(chunk)
            stats["documents"] += 1
            stats["sentences"] += len(sentences)
            stats["bytes"] += size
    stats["mb"] = stats["bytes"] / 1e6
    stats["path"] = output_path
    return stats


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", required=True, help="text file to write")
    parser.add_argument("--max_mb", type=float, default=4.0, help="stop before this size")
    args = parser.parse_args(argv)
    s = build_corpus(args.output, args.max_mb)
    print(f"wrote {s['documents']} documents, {s['sentences']} sentences, {s['mb']:.2f} MB to {s['path']}")


if __name__ == "__main__":
    sys.exit(main())
