"""JAX's persistent compilation cache, on by default for every entry point.

A fine-tuning sweep compiles the same steps in every cell (one per padded length), and a rerun or a
resumed job compiles what the last run compiled; with the cache they load the executables from disk
instead. The cache lives in $XDG_CACHE_HOME/lmpretrain/jax (~/.cache/lmpretrain/jax); the environment
variable LMPRETRAIN_COMPILATION_CACHE moves it (any path, gs:// included, as JAX supports) or turns it
off ("off"). Entries are keyed by the program, the JAX/XLA versions and the devices, so a stale entry is
never used for another program.
"""
from __future__ import annotations

import os
import sys

ENV = "LMPRETRAIN_COMPILATION_CACHE"
OFF = ("", "0", "off", "false", "none")
MIN_COMPILE_SECONDS = 0.5  # cache what took at least this long to compile (JAX's default: 1 s)


def default_directory() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lmpretrain", "jax")


def enable() -> str | None:
    """Points JAX at the cache directory (before the first compilation) -> the directory, or None when off."""
    directory = os.environ.get(ENV, default_directory())
    if directory.strip().lower() in OFF:
        return None
    if "://" not in directory:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:  # a cache is an optimisation: never a reason to stop
            print(f"warning: compilation cache {directory} unusable ({e.strerror}); compiling without it "
                  f"(set {ENV}=off or to a writable directory)", file=sys.stderr)
            return None
    import jax
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return directory
