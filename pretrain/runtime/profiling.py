"""`config.profile_steps='N,M'`: a jax.profiler trace of training steps N..M into WORKDIR/profile/.

TensorBoard's profile plugin and xprof read the trace (`tensorboard --logdir WORKDIR/profile`, or
`xprof WORKDIR/profile`): the XLA ops of each step on each device, the host's work between them, and each
step annotated as `train` with its number (jax.profiler.StepTraceAnnotation), which the tools' step view
uses. Steps count from 1 as the logs do; a resumed run traces the part of N..M it still runs. By default only
the first process traces (`config.profile_all_processes=True`: every host writes its own file); one step
before N should be left out of a trace that times the steady state, since step 1 compiles.
"""
from __future__ import annotations

import contextlib
import os

import jax

from pretrain.runtime.errors import ConfigError


def parse_steps(spec: str) -> tuple[int, int] | None:
    """'N,M' -> (N, M) with 1 <= N <= M; '' -> None (no trace)."""
    if not spec:
        return None
    first, sep, last = str(spec).partition(",")
    try:
        steps = int(first), int(last if sep else first)
    except ValueError:
        steps = (0, 0)
    if not 1 <= steps[0] <= steps[1]:
        raise ConfigError(f"config.profile_steps={spec!r}: expected 'N,M' with 1 <= N <= M (steps counted from 1), "
                          "e.g. --config.profile_steps=10,15")
    return steps


class StepProfiler:
    """Wraps each training step: starts the trace at the first step of the range, annotates every step, and
    stops (after the step's results are ready) at the last."""

    def __init__(self, spec: str, workdir: str, all_processes: bool = False):
        self.range = parse_steps(spec)
        self.directory = os.path.join(workdir, "profile")
        self.enabled = self.range is not None and (all_processes or jax.process_index() == 0)
        self.tracing = False

    @contextlib.contextmanager
    def step(self, number: int):
        """Around step `number` (1-based): yields a list to which the step appends its outputs."""
        outputs: list = []
        if self.enabled and not self.tracing and self.range[0] <= number <= self.range[1]:
            jax.profiler.start_trace(self.directory)
            self.tracing = True
        with jax.profiler.StepTraceAnnotation("train", step_num=number):
            yield outputs
        if self.tracing and number >= self.range[1]:
            jax.block_until_ready(outputs)  # the last step's device work inside the trace
            self.stop()
            print(f"Profile of steps {self.range[0]}..{self.range[1]} written to {self.directory}")

    def stop(self) -> None:
        if self.tracing:
            jax.profiler.stop_trace()
            self.tracing = False
