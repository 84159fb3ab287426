"""Shipping the code to the workers: a tarball of the working tree or of a git revision, and the shell
command that unpacks it on a worker and installs the package with its `tpu` extra.

The working tree is what `git ls-files -co --exclude-standard` lists: tracked and untracked files,
.gitignore'd ones left out (virtual environments, runs/, checkpoints), edits not yet committed
included, so that what runs is what the person sees. A revision (--revision=REV) is `git archive REV`:
exactly a commit, for runs that must be reproducible from the history alone.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import tarfile
from typing import NamedTuple

from pretrain.runtime.errors import UserError

REMOTE_DIR = "lmpretrain"  # on each worker, under the home directory: the unpacked code, replaced every run


class Source(NamedTuple):
    """What a run ships: the repository root and a revision (None: the working tree)."""
    root: str
    revision: str | None

    def describe(self) -> str:
        if self.revision:
            return f"revision {self.revision} of {self.root} (git archive)"
        return f"the working tree of {self.root} (git ls-files -co --exclude-standard)"


def _git(root: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise UserError("git not found on PATH: the launcher ships the code of a git checkout") from None
    if check and result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        why = lines[-1] if lines else f"exit status {result.returncode}"
        raise UserError(f"git {args[0]} failed in {root}: {why}")
    return result


def find_source(directory: str, revision: str | None = None) -> Source:
    """The git checkout holding `directory`, checked to be an installable project (setup.py at its root);
    a revision is resolved to its commit id, so that the run records exactly what it shipped."""
    found = _git(directory, "rev-parse", "--show-toplevel", check=False)
    if found.returncode != 0:
        raise UserError(f"{os.path.abspath(directory)} is not in a git checkout: run the launcher from the "
                        "project's checkout (it ships the git working tree, or --revision)")
    root = found.stdout.strip()
    if revision is not None:
        commit = _git(root, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", check=False)
        if commit.returncode != 0:
            raise UserError(f"--revision={revision}: no such commit in {root} (a branch, tag or commit id)")
        revision = commit.stdout.strip()
        has_setup = _git(root, "cat-file", "-e", f"{revision}:setup.py", check=False).returncode == 0
    else:
        has_setup = os.path.isfile(os.path.join(root, "setup.py"))
    if not has_setup:
        raise UserError(f"{root} has no setup.py{' at ' + revision if revision else ''}: the workers install the "
                        "shipped code with pip install -e '.[tpu]'")
    return Source(root, revision)


def working_tree_files(root: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """Paths (relative to root) of the files git would see: tracked and untracked, not ignored, present;
    minus those under the `exclude` directories (e.g. the launcher's own log folder)."""
    listed = _git(root, "ls-files", "-co", "--exclude-standard", "-z").stdout.split("\0")
    excluded = [os.path.relpath(os.path.realpath(e), os.path.realpath(root)) + os.sep for e in exclude]
    return sorted(path for path in set(listed)
                  if path and os.path.isfile(os.path.join(root, path))  # a tracked file deleted: not shipped
                  and not any((path + os.sep).startswith(e) for e in excluded))


def pack(source: Source, tarball: str, exclude: tuple[str, ...] = ()) -> int:
    """Writes the gzipped tarball of the source; -> its size in bytes."""
    if source.revision:
        _git(source.root, "archive", "--format=tar.gz", "-o", os.path.abspath(tarball), source.revision)
    else:
        with tarfile.open(tarball, "w:gz") as tar:
            for path in working_tree_files(source.root, exclude):
                tar.add(os.path.join(source.root, path), arcname=path, recursive=False)
    return os.path.getsize(tarball)


def commit_of(source: Source) -> str:
    """The commit a run shipped: the revision, or HEAD of the working tree ('+ changes' when it has edits)."""
    if source.revision:
        return source.revision
    head = _git(source.root, "rev-parse", "--verify", "--quiet", "HEAD", check=False).stdout.strip() or "no commit"
    dirty = _git(source.root, "status", "--porcelain", check=False).stdout.strip()
    return head + (" + changes" if dirty else "")


def unpack_and_install(tarball_name: str, remote_dir: str = REMOTE_DIR) -> str:
    """The shell command that replaces ~/remote_dir with the tarball's content and installs it (editable,
    with the `tpu` extra: jax[tpu] and its libtpu) for the worker's python3."""
    tarball, directory = shlex.quote(tarball_name), shlex.quote(remote_dir)
    return (f"set -e; rm -rf {directory}; mkdir -p {directory}; tar -xzf {tarball} -C {directory}; rm -f {tarball}; "
            f'cd {directory}; python3 -m pip install --quiet -e ".[tpu]"')  # "": no nested quotes in --dry_run
