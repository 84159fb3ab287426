"""The workdir's own files, on a local disk or in a bucket (gs://BUCKET/run): one set of operations for both.

A local path is handled exactly as before URLs were allowed: os functions, absolute paths, writes through a
temporary file + fsync + rename. A URL goes through etils.epath (fsspec; gcsfs for gs://, from the `tpu`
extra), where three things differ:
  * an object appears only once its upload completes, so `write_atomic` is one upload;
  * there is no append: metric_writers keeps metrics.jsonl in memory and rewrites the object now and then;
  * folders are name prefixes: `makedirs` creates nothing, and `rename` of a folder copies, then deletes,
    its objects one by one, so it is not atomic.
Checkpoint arrays are Orbax's own path (TensorStore's GCS driver; epath for its metadata): only the marker
files and step folders that pretrain.core.checkpoints inspects pass through here.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from typing import IO

import fsspec
from etils import epath

from pretrain.core.errors import UserError

# Scheme -> (fsspec's name of the filesystem epath uses, its package), (tensorboardX's writer module, package).
SCHEMES = {"gs": (("gcs", "gcsfs"), ("google.cloud.storage", "google-cloud-storage"))}


def is_url(path: str) -> bool:
    return "://" in str(path)


def check_url(path: str, flag: str | None = None, *, write: bool = False) -> None:
    """A one-line UserError unless this process can read URL `path` (with `write`: keep a workdir there)."""
    where, scheme = f"{flag}={path}" if flag else path, path.split("://", 1)[0]
    if scheme not in SCHEMES:
        raise UserError(f"{where}: {scheme}:// is not supported; give a local path or gs://BUCKET/PATH")
    (filesystem, package), (module, events_package) = SCHEMES[scheme]
    missing = [] if _has_filesystem(filesystem) else [package]
    if write and not _has_module(module):
        missing.append(events_package)  # TensorBoard's events (tensorboardX)
    if missing:
        raise UserError(f"{where} needs {' and '.join(missing)}: pip install -e '.[tpu]' (or pip install "
                        f"{' '.join(missing)})")


def _has_filesystem(name: str) -> bool:
    try:
        fsspec.get_filesystem_class(name)
    except (ImportError, ValueError):
        return False
    return True


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # its parent package is missing
        return False


def _remote(path: str) -> epath.Path:
    check_url(path)
    return epath.Path(path)


def absolute(path: str) -> str:
    return path.rstrip("/") if is_url(path) else os.path.abspath(path)


def exists(path: str) -> bool:
    return _remote(path).exists() if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    return _remote(path).is_dir() if is_url(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
    return _remote(path).is_file() if is_url(path) else os.path.isfile(path)


def listdir(path: str) -> list[str]:
    return [p.name for p in _remote(path).iterdir()] if is_url(path) else os.listdir(path)


def makedirs(path: str) -> None:
    if is_url(path):
        _remote(path).mkdir(parents=True, exist_ok=True)
    else:
        os.makedirs(path, exist_ok=True)


def rename(source: str, target: str) -> None:
    if is_url(source):
        _remote(source).rename(target)
    else:
        os.rename(source, target)


def rmtree(path: str, ignore_errors: bool = False) -> None:
    if not is_url(path):
        return shutil.rmtree(path, ignore_errors=ignore_errors)
    try:
        _remote(path).rmtree()
    except Exception:  # noqa: BLE001 - fsspec filesystems raise their own errors
        if not ignore_errors:
            raise


def open_file(path: str, mode: str = "r", encoding: str | None = None) -> IO:
    """open(); a file in a bucket is uploaded when it is closed (epath: UTF-8)."""
    return _remote(path).open(mode) if is_url(path) else open(path, mode, encoding=encoding)


def read_text(path: str) -> str:
    with open_file(path) as f:
        return f.read()


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (os.umask only sets: setting and
    restoring it would race with another thread creating a file)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str, text: str) -> None:
    """`text` into `path`, never half-written: locally a temporary file in the same folder + fsync + rename,
    in a bucket one upload."""
    if is_url(path):
        _remote(path).write_text(text)
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0600; others (TensorBoard, a notebook) may read it
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
