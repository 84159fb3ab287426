"""The workdir's own files: checked before anything is written, written atomically, compared on resume.

A command writes WORKDIR/config.json only after the config and the workdir passed every check, and
through a temporary file + rename, so a command that is rejected (a bad flag, a config that does not fit
the checkpoints) leaves every file of the workdir as it was, and a kill never leaves a half-written one.

Resuming compares the new config with the stored one, key by key:
  * fixed keys (architecture, objective, tokenizer, data, batch size, seed, optimizer kind): a change is
    a one-line error listing them, since the checkpoints and the data position would not fit;
  * schedule keys (learning rate and the other optimizer numbers, num_train_steps, num_epochs): allowed,
    with a warning listing them;
  * logistics (logging, checkpoint and evaluation intervals, mesh, prefetch, workers, micro-batches):
    allowed silently; the run's batches and results do not depend on them.
"""
from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import ml_collections

from pretrain.runtime.errors import ConfigError, UserError
from pretrain.workdir import storage

CONFIG_FILE = "config.json"

SCHEDULE_KEYS = ("num_train_steps", "num_epochs", "warmup_fraction", "optimizer.*", "skip_nonfinite_updates")
LOGISTICS_KEYS = ("log_every", "checkpoint_every", "keep_checkpoints", "eval_every", "eval_batches", "prefetch",
                  "mesh_shape", "mesh_mode", "grad_accum_steps", "data.workers", "eval_batch_size",
                  "write_test_predictions", "model.attention", "model.remat")  # how the same function is computed
FIXED_EXCEPTIONS = ("optimizer.name",)  # the optimizer state's structure depends on it


def prepare(workdir: str, flag: str = "--workdir") -> str:
    """Creates `workdir` if needed; a one-line UserError when it is a file or cannot be written. -> abspath
    (a URL as given, without a trailing slash)."""
    if storage.is_url(workdir):  # never os.path: gs://b/x would become a local folder 'gs:/b/x'
        return _prepare_url(workdir, flag)
    path = os.path.abspath(workdir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{flag}={workdir} is a file, not a directory; give a directory (new or a run's workdir)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"{flag}={workdir} cannot be created ({e.strerror}); give a writable directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{flag}={workdir} is not writable; give a writable directory")
    return path


@contextlib.contextmanager
def prepared(workdir: str, flag: str = "--workdir") -> Iterator[str]:
    """prepare(workdir) around a run's start: when the block raises, the folders prepare created that are still empty
    are removed again, so a refused start leaves no workdir of its own behind (one that was there stays)."""
    created = _missing_folders(workdir)
    path = prepare(workdir, flag)
    try:
        yield path
    except BaseException:
        for folder in created:  # the deepest first; one that holds anything stops the removal
            try:
                os.rmdir(folder)
            except OSError:
                break
        raise


def _missing_folders(workdir: str) -> list[str]:
    """The local folders that creating `workdir` makes, deepest first (none for a bucket's: prefixes, not folders)."""
    missing, path = [], "" if storage.is_url(workdir) else os.path.abspath(workdir)
    while path and not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _prepare_url(workdir: str, flag: str) -> str:
    """A bucket's workdir: its packages installed, not a file. Folders are name prefixes (makedirs creates
    nothing) and permissions show at the first write."""
    storage.check_url(workdir, flag)
    path = storage.absolute(workdir)
    try:
        if _bucket_missing(path):  # some gcsfs releases make no request for makedirs: it would show at a write
            raise FileNotFoundError(f"no bucket {'/'.join(path.split('/')[:3])}")
        is_file = storage.isfile(path)
        if not is_file:
            storage.makedirs(path)
    except Exception as e:  # noqa: BLE001 - gcsfs raises its own errors (credentials, no such bucket)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UserError(f"{flag}={workdir} cannot be reached ({first}); check the bucket and your credentials") \
            from None
    if is_file:
        raise UserError(f"{flag}={workdir} is a file, not a directory; give a directory (new or a run's workdir)")
    return path


def _bucket_missing(url: str) -> bool:
    """Whether the bucket of a gs:// path is known not to exist. Credentials that may write objects but not read
    the bucket's own metadata cannot tell: then the first write does."""
    try:
        return not storage.exists("/".join(url.split("/")[:3]))
    except Exception:  # noqa: BLE001 - a permission error on the bucket itself
        return False


write_atomic = storage.write_atomic  # `text` into `path`, never half-written (see pretrain.workdir.storage)


def write_json_atomic(path: str, value: Any) -> None:
    write_atomic(path, json.dumps(value, indent=2, allow_nan=False) + "\n")


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
    write_atomic(os.path.join(workdir, CONFIG_FILE), config.to_json_best_effort(indent=2) + "\n")


def stored_config(workdir: str) -> dict | None:
    """WORKDIR/config.json as a dict, or None when there is none (or it is unreadable: a new run rewrites it)."""
    try:
        return json.loads(storage.read_text(os.path.join(workdir, CONFIG_FILE)))
    except (OSError, ValueError):
        return None


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1} (tuples as lists): config.json and results.json key by key."""
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: list(tree) if isinstance(tree, tuple) else tree}


def _kind(key: str) -> str:
    """'fixed', 'schedule' or 'logistics' (see the module docstring)."""
    if key in FIXED_EXCEPTIONS:
        return "fixed"
    if any(fnmatch.fnmatchcase(key, pattern) for pattern in SCHEDULE_KEYS):
        return "schedule"
    if key in LOGISTICS_KEYS:
        return "logistics"
    return "fixed"


def check_resume(workdir: str, config: ml_collections.ConfigDict) -> list[str]:
    """Compares `config` with WORKDIR/config.json of the run being resumed.

    Raises ConfigError listing the fixed keys that differ; prints a warning listing the schedule keys
    that differ and returns them. Nothing stored (a workdir of an older version): no check.
    """
    stored = stored_config(workdir)
    if stored is None:
        return []
    old = flatten(stored)
    new = flatten(json.loads(config.to_json_best_effort()))
    # Keys on one side only are a version's new or retired fields, not a change of this run.
    differ = {k: (old[k], new[k]) for k in sorted(set(old) & set(new)) if old[k] != new[k]}
    listed = {kind: "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in differ.items() if _kind(k) == kind)
              for kind in ("fixed", "schedule")}
    if listed["fixed"]:
        raise ConfigError(f"{workdir} holds a run with another model or data ({listed['fixed']}); resume with "
                          "the config in its config.json or use a new --workdir")
    if listed["schedule"]:
        print(f"warning: resuming {workdir} with a changed schedule ({listed['schedule']})", file=sys.stderr,
              flush=True)
    return [k for k in differ if _kind(k) == "schedule"]
