"""The workdir's own files, on a local disk or in a bucket (gs://BUCKET/run): one set of operations for both.

A local path is handled exactly as before URLs were allowed: os functions, absolute paths, writes through a
temporary file + fsync + rename. A URL goes through etils.epath (fsspec; gcsfs for gs://, from the `tpu`
extra), where three things differ:
  * an object appears only once its upload completes, so `write_atomic` is one upload;
  * there is no append: `append` uploads the new text as an object of its own and has the server
    concatenate the two (GCS's compose, which its documentation gives for appending), so a log written for
    days costs what its new lines weigh, not what the whole file weighs, at every upload;
  * folders are name prefixes: `makedirs` creates nothing, and `rename` of a folder copies, then deletes,
    its objects one by one, so it is not atomic.
Checkpoint arrays are Orbax's own path (TensorStore's GCS driver; epath for its metadata): only the marker
files and step folders that pretrain.workdir.checkpoints inspects pass through here.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from typing import IO

import fsspec
import fsspec.config
import fsspec.core
from etils import epath

from pretrain.runtime.errors import UserError


class _NoBucketTypeWarnings(logging.Filter):
    """gcsfs asks the storage control API for a bucket's layout before most operations and, when it cannot
    tell (no permission for that API; a GCS emulator has none), warns and asks again next time: one console
    line per file operation. The answer only picks gcsfs's paths for zonal and hierarchical buckets; the
    JSON API it falls back to serves every bucket."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "bucket type" not in message and "storage layout api" not in message


logging.getLogger("gcsfs").addFilter(_NoBucketTypeWarnings())
# No listings cache: a workdir in a bucket is also written by other clients (TensorStore writes Orbax's
# arrays, other hosts write theirs), so a listing this process cached would go stale. fsspec passes these
# defaults to every gcsfs filesystem it makes (epath's included).
for _protocol in ("gs", "gcs"):
    fsspec.config.conf.setdefault(_protocol, {}).setdefault("cache_timeout", 0)

# Scheme -> (fsspec's name of the filesystem epath uses, its package).
SCHEMES = {"gs": ("gcs", "gcsfs")}


def is_url(path: str) -> bool:
    return "://" in str(path)


def check_url(path: str, flag: str | None = None) -> None:
    """A one-line UserError unless this process can read and write URL `path`."""
    where, scheme = f"{flag}={path}" if flag else path, path.split("://", 1)[0]
    if scheme not in SCHEMES:
        raise UserError(f"{where}: {scheme}:// is not supported; give a local path or gs://BUCKET/PATH")
    filesystem, package = SCHEMES[scheme]
    if not _has_filesystem(filesystem):
        raise UserError(f"{where} needs {package}: pip install -e '.[tpu]' (or pip install {package})")


def _has_filesystem(name: str) -> bool:
    try:
        fsspec.get_filesystem_class(name)
    except (ImportError, ValueError):
        return False
    return True


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


def append(path: str, data: str | bytes) -> None:
    """`data` at the end of `path` (created if missing). In a bucket: `data` uploaded as `path`.tail, then
    path := compose(path, path.tail) on the server, then the tail deleted; readers see the object before or
    after, never in between. A tail left by a kill is overwritten by the next append."""
    data = data.encode() if isinstance(data, str) else data
    if not is_url(path):
        with open(path, "ab") as f:
            f.write(data)
        return
    filesystem, name = fsspec.core.url_to_fs(path)
    if not filesystem.exists(name):
        filesystem.pipe_file(name, data)
        return
    tail = name + ".tail"
    filesystem.pipe_file(tail, data)
    filesystem.merge(name, [name, tail])
    filesystem.rm_file(tail)


def local_copy(url: str, prefix: str) -> str:
    """The files directly in folder `url` (a Hugging Face directory: config, weights, tokenizer files)
    copied into a new local temporary folder, removed when the process exits: safetensors and the
    tokenizer libraries read local files. Subfolders are left out (a sentence-transformers pooling
    config, a checkpoint history)."""
    local = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, local, ignore_errors=True)
    filesystem, folder = fsspec.core.url_to_fs(url)
    for entry in filesystem.ls(folder, detail=True):
        if entry["type"] == "file":
            name = os.path.basename(entry["name"])
            download(f"{url.rstrip('/')}/{name}", os.path.join(local, name))
    return local


def download(url: str, local_path: str) -> None:
    """The object at `url` as the local file `local_path`, whole or not at all (written as .part, renamed)."""
    filesystem, name = fsspec.core.url_to_fs(url)
    filesystem.get_file(name, local_path + ".part")
    os.replace(local_path + ".part", local_path)


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
