"""Sweep axes for a config file's `get_sweep(arg)`: cells as lists of override dicts, composed the way
XManager's `hyper` and big_vision's sweeps are written.

    def get_sweep(arg):                      # python -m pretrain.sweep --config=configs/glue.py --sweep=lr_seed
        return product(sweep("optimizer.learning_rate", [2e-5, 5e-5]), sweep("seed", [0, 1]))

A cell is {key: value}: a key is a config key as `--config.KEY=VALUE` takes it (`optimizer.learning_rate`),
or `arg.NAME` for an argument of the config string (`arg.task` -> `configs/glue.py:task=...`), which shapes
the config before overrides (the task's head, the model family). Values are plain Python scalars.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

Cell = dict[str, Any]


def sweep(key: str, values: Sequence[Any]) -> list[Cell]:
    """One axis: a cell per value."""
    if isinstance(values, (str, bytes)) or not len(values):
        raise ValueError(f"sweep({key!r}, ...) needs a non-empty list of values, got {values!r}")
    return [{key: value} for value in values]


def _merge(cells: Sequence[Cell]) -> Cell:
    merged: Cell = {}
    for cell in cells:
        repeated = merged.keys() & cell.keys()
        if repeated:
            raise ValueError(f"sweep axes set the same keys twice: {sorted(repeated)}")
        merged.update(cell)
    return merged


def product(*axes: list[Cell]) -> list[Cell]:
    """Every combination, the last axis varying fastest (like nested for-loops)."""
    return [_merge(cells) for cells in itertools.product(*axes)]


def zipit(*axes: list[Cell]) -> list[Cell]:
    """The i-th cells of every axis together (axes of equal length)."""
    lengths = sorted({len(axis) for axis in axes})
    if len(lengths) > 1:
        raise ValueError(f"zipit needs axes of equal length, got lengths {lengths}")
    return [_merge(cells) for cells in zip(*axes)]


def chain(*axes: list[Cell]) -> list[Cell]:
    """The cells of one axis after another (e.g. two sub-sweeps that share no grid)."""
    return [cell for axis in axes for cell in axis]
