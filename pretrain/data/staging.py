"""A prepared corpus in a bucket (--config.data.path=gs://...), copied to this host's disk before training.

ArrayRecord's reader (C++, riegeli) opens local files only, and training reads documents by random access
across every shard, so each host needs the whole corpus. Rather than ask for a FUSE mount (MaxText's way),
each host stages it once: the shards listed in index.json are downloaded into
$XDG_CACHE_HOME/lmpretrain/prepared/<digest of the URL and index.json>/, checked for size, and reused by every
later run (a preempted job that restarts does not download again). A disk too small for it is a one-line
error that names the space needed and the alternatives (another cache disk, or a gcsfuse mount).
docs/operating.md has the measured staging speed.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import fsspec.core

from pretrain.data.sources import CorpusError
from pretrain.workdir import storage

ENV = "LMPRETRAIN_PREPARED_CACHE"  # where staged corpora go (default: $XDG_CACHE_HOME/lmpretrain/prepared)
MARGIN_BYTES = 1 << 30  # left free beside the staged corpus (checkpoints, logs, compilation cache)
COMPLETE = ".staged"    # written last: a folder without it is an interrupted copy, finished by the next run


def cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(ENV) or os.path.join(base, "lmpretrain", "prepared")


def stage(url: str, index_name: str) -> str:
    """gs://.../prepared -> a local directory with the same index.json and shards (downloaded if needed)."""
    filesystem, folder = fsspec.core.url_to_fs(url)
    if not storage.exists(f"{url}/{index_name}"):
        raise CorpusError(f"{url} has no {index_name}, so it is no prepared corpus: write one with python -m "
                          f"pretrain.tools.prepare_corpus and copy the whole directory there")
    index_text = storage.read_text(f"{url}/{index_name}")
    files = _listed_files(json.loads(index_text))
    local = os.path.join(cache_root(), hashlib.sha256(f"{url}\n{index_text}".encode()).hexdigest()[:16])
    if os.path.exists(os.path.join(local, COMPLETE)):
        return local
    sizes = {name: filesystem.size(f"{folder}/{name}") for name in files}
    os.makedirs(local, exist_ok=True)
    _check_space(url, local, sum(size for name, size in sizes.items() if not _have(local, name, size)))
    started = time.perf_counter()
    for name, size in sizes.items():
        if not _have(local, name, size):
            storage.download(f"{url}/{name}", os.path.join(local, name))
    storage.write_atomic(os.path.join(local, index_name), index_text)
    storage.write_atomic(os.path.join(local, COMPLETE), url)
    megabytes = sum(sizes.values()) / 1e6
    print(f"Staged {url} ({len(files)} shards, {megabytes:,.1f} MB) into {local} in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    return local


def _listed_files(index: dict) -> list[str]:
    return [shard["file"] for split in index.get("splits", {}).values() for shard in split.get("shards", [])]


def _have(local: str, name: str, size: int) -> bool:
    path = os.path.join(local, name)
    return os.path.isfile(path) and os.path.getsize(path) == size


def _check_space(url: str, local: str, needed: int) -> None:
    free = shutil.disk_usage(local).free
    if needed + MARGIN_BYTES > free:
        raise CorpusError(f"staging {url} needs {needed / 1e9:.1f} GB on {local} ({free / 1e9:.1f} GB free, "
                          f"{MARGIN_BYTES / 1e9:.0f} GB kept spare): point {ENV} at a larger disk, or mount the "
                          "bucket with gcsfuse and give --config.data.path the mounted directory")
