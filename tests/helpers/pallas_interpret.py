"""Pallas' TPU kernels run on this CPU by Pallas' TPU interpreter (`tpu_interpret()`), vmapped ones included.

Mapping a pallas_call over an axis (models/attention.py maps the flash kernel over the rows when every row shares
its bias) prepends that axis to the kernel's grid. Mosaic's lowering knows such axes (`vmapped_dims`) and gives
the user's dimension semantics to the others; the interpreter of this JAX zips the semantics with the whole grid
and fails on the length. `tpu_interpret()` lets it read the prepended axes as sequential ("arbitrary", what
Mosaic runs them as), so the kernel the TPU compiles is the one the tests run.
"""
from __future__ import annotations

import contextlib

from jax._src.pallas.mosaic.interpret import interpret_pallas_call
from jax.experimental.pallas import tpu as pltpu

_semantics = interpret_pallas_call._get_parallel_dim_semantics


def _with_mapped_axes(mosaic_params, num_dimensions_in_grid: int) -> tuple[bool, ...]:
    given = mosaic_params.dimension_semantics
    user = len(given) if given is not None else num_dimensions_in_grid
    return (False,) * (num_dimensions_in_grid - user) + tuple(_semantics(mosaic_params, user))


@contextlib.contextmanager
def tpu_interpret():
    """pltpu.force_tpu_interpret_mode(), with the grid axes vmap prepends read as sequential."""
    interpret_pallas_call._get_parallel_dim_semantics = _with_mapped_axes
    try:
        with pltpu.force_tpu_interpret_mode():
            yield
    finally:
        interpret_pallas_call._get_parallel_dim_semantics = _semantics
