"""A sweep's cells: a config file's `get_sweep(arg)` (written with configs/sweep_axes.py), each cell's name,
config string and command line: `python -m pretrain.finetune` or `pretrain.train` in its own workdir, locally or
through `pretrain.launch run` on a TPU VM. Where the cells' outcomes are kept is pretrain/jobs/sweep_dir.py.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import sys
from typing import Any

from pretrain.runtime.errors import UserError

ENTRY_POINTS = {"finetune": "pretrain.finetune", "train": "pretrain.train"}
ARG_PREFIX = "arg."  # a cell key for the config string's arguments (configs/sweep_axes.py)


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str                   # directory name, a function of the values (so resuming finds it)
    values: dict[str, Any]      # the sweep's cell: config keys and arg.* keys
    config: str                 # the --config string of this cell's run
    command: tuple[str, ...]    # the whole command line


# ----------------------------------------------------------------------------------------------
# The config file's cells.

def split_config(config: str) -> tuple[str, dict[str, str]]:
    """'configs/glue.py:task=mrpc,peft=lora' -> ('configs/glue.py', {'task': 'mrpc', 'peft': 'lora'})."""
    path, _, arg = config.partition(":")
    items = [item.partition("=") for item in filter(None, arg.split(","))]
    return path, {key: value for key, _, value in items}


def load_cells(config: str, sweep_arg: str) -> list[dict[str, Any]]:
    """The config file's get_sweep(sweep_arg); one-line errors for a file without one or a bad argument."""
    path, _ = split_config(config)
    if not os.path.isfile(path):
        raise UserError(f"--config: no file {path!r} (give a config file such as configs/glue.py:task=mrpc)")
    spec = importlib.util.spec_from_file_location(f"_sweep_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_sweep"):
        raise UserError(f"{path} defines no get_sweep(arg): add one returning the cells (see configs/sweep_axes.py)")
    try:
        cells = module.get_sweep(sweep_arg)
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(f"--sweep={sweep_arg}: {e}") from None
    if not cells or not all(isinstance(c, dict) and c for c in cells):
        raise UserError(f"{path}: get_sweep({sweep_arg!r}) must return a non-empty list of non-empty dicts")
    names = [cell_name(c) for c in cells]
    if len(set(names)) < len(names):
        raise UserError(f"{path}: get_sweep({sweep_arg!r}) repeats a cell ({names}); every cell must differ")
    return cells


def cell_name(values: dict[str, Any]) -> str:
    """'learning_rate=2e-05,seed=0' from the last part of each key (the whole key where two share it)."""
    leaves = [key.rsplit(".", 1)[-1] for key in values]
    parts = [f"{leaf if leaves.count(leaf) == 1 else key}={format_value(value)}"
             for key, leaf, value in zip(values, leaves, values.values())]
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", "_".join(parts))


def format_value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def cell_config(config: str, values: dict[str, Any]) -> str:
    """The cell's config string: its arg.* values over the sweep's config string."""
    path, args = split_config(config)
    args.update({k[len(ARG_PREFIX):]: format_value(v) for k, v in values.items() if k.startswith(ARG_PREFIX)})
    return path + (":" + ",".join(f"{k}={v}" for k, v in args.items()) if args else "")


# ----------------------------------------------------------------------------------------------
# Commands.

def build_cells(config: str, cells: list[dict[str, Any]], entry: str, shared_flags: list[str], run_root: str,
                launch: list[str] | None = None) -> list[Cell]:
    """Each cell's command: [launcher prefix] python -m <entry> --config=<cell's> --workdir=<run_root>/<name>
    <shared flags> --config.KEY=VALUE for the cell's keys (after the shared ones: a cell's value wins)."""
    out = []
    for values in cells:
        name = cell_name(values)
        overrides = [f"--config.{k}={format_value(v)}" for k, v in values.items() if not k.startswith(ARG_PREFIX)]
        run = ["python3" if launch else sys.executable, "-m", ENTRY_POINTS[entry],
               f"--config={cell_config(config, values)}", f"--workdir={run_root.rstrip('/')}/{name}",
               *shared_flags, *overrides]
        out.append(Cell(name, dict(values), cell_config(config, values), tuple((launch or []) + run)))
    return out


def entry_point(config_dict) -> str:
    """finetune for a fine-tuning config (it names a task), train otherwise."""
    return "finetune" if "task" in config_dict else "train"


def launch_prefix(launch: str, launch_flags: str) -> list[str]:
    """--launch=tpu:NAME -> the launcher's command that runs a cell on every worker of that TPU VM."""
    kind, _, name = launch.partition(":")
    if kind != "tpu" or not name:
        raise UserError(f"--launch={launch!r}: give tpu:NAME (a TPU VM made with python -m pretrain.launch create)")
    return [sys.executable, "-m", "pretrain.launch", "run", f"--name={name}", *shlex.split(launch_flags), "--"]
