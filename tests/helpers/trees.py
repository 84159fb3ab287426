"""Synthetic source trees for the suite's own checks (layering, suite layout, cited paths)."""
from __future__ import annotations

import textwrap


def write_tree(root, files: dict[str, str]) -> str:
    """{relative path: text} written under `root` (a pathlib.Path; text dedented) -> str(root)."""
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return str(root)
