"""A complete checkpoint step damaged the three ways a disk or a hand damages one after Orbax finished it: noise in
the data files, a missing metadata file, data files cut short (what every checkpoint reader is tested against)."""
from __future__ import annotations

import glob
import os
import random

DAMAGES = ("noise in the data files", "missing metadata file", "truncated data files")


def _files(step_dir: str) -> list[str]:
    return [p for p in glob.glob(os.path.join(step_dir, "state", "**"), recursive=True) if os.path.isfile(p)]


def damage(step_dir: str, kind: str) -> None:
    """Damages the checkpoint in `step_dir` (a checkpoints/<step> folder) in place."""
    data = [p for p in _files(step_dir) if f"{os.sep}d{os.sep}" in p]  # TensorStore's data files
    assert data, f"no data files under {step_dir}/state"
    if kind == "noise in the data files":  # as long as they were
        rng = random.Random(0)
        for path in data:
            with open(path, "wb") as f:
                f.write(rng.randbytes(os.path.getsize(path)))
    elif kind == "missing metadata file":  # the parameters' names, shapes and dtypes
        os.remove(os.path.join(step_dir, "state", "_METADATA"))
    elif kind == "truncated data files":  # a copy cut short: each to half its length (the params are in one)
        for path in data:
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
    else:
        raise ValueError(kind)
