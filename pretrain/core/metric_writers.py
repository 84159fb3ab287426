"""Where metrics go: `metrics.jsonl` (one JSON object per logged step) and TensorBoard events.

metrics.jsonl stays valid JSON whatever the run does: a NaN or infinite value is written as null (a
diverged run's losses included). On resume, the records past the restored step are dropped, and so is an
unreadable last line (a run killed mid-write); TensorBoard is told to purge its points past the restored
step too (SummaryWriter's purge_step: a SessionLog.START event at that step), so that no curve doubles back.

In a multi-host run only process 0 writes them (every process computes the same replicated
metrics); on the others a MetricWriter accepts every call and does nothing.
"""
from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
from tensorboardX import SummaryWriter

from pretrain.core import distributed
from pretrain.core.workdir import write_atomic


class MetricWriter:
    def __init__(self, workdir: str, resume_step: int = 0):
        self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
        self.tensorboard_dir = os.path.join(workdir, "tensorboard")
        self.enabled = distributed.is_primary()
        if not self.enabled:
            return
        self._drop_records_after(resume_step)
        self.jsonl = open(self.jsonl_path, "a")
        # purge_step: TensorBoard hides this log's events from that step on (those of a killed run, redone now).
        self.tensorboard = SummaryWriter(self.tensorboard_dir, flush_secs=10,
                                         purge_step=resume_step + 1 if resume_step else None)

    def _drop_records_after(self, step: int) -> None:
        """A killed run may have logged past its last checkpoint (those steps will be redone), and may have
        been killed in the middle of a line. Rewritten only when something is dropped."""
        if not os.path.exists(self.jsonl_path):
            return
        with open(self.jsonl_path) as f:
            lines = f.readlines()
        kept, dropped_unreadable = [], 0
        for n, line in enumerate(lines):
            try:
                record = json.loads(line) if line.strip() else None
            except ValueError:
                record = None
                dropped_unreadable += 1
                print(f"warning: {self.jsonl_path}:{n + 1} is not a JSON record (a run cut short while writing "
                      "it?); dropped", file=sys.stderr, flush=True)
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
        if kept != lines:
            write_atomic(self.jsonl_path, "".join(kept))

    def write(self, step: int, metrics: dict[str, float], prefix: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **{k: _to_python(v) for k, v in metrics.items()}}
        if prefix != "train":
            record = {"step": record["step"], **{f"{prefix}_{k}": v for k, v in record.items() if k != "step"}}
        self.jsonl.write(json.dumps(record, allow_nan=False) + "\n")
        self.jsonl.flush()
        for name, value in metrics.items():  # TensorBoard takes NaN as it is
            self.tensorboard.add_scalar(f"{prefix}/{name}", float(np.asarray(value)), int(step))

    def close(self) -> None:
        if not self.enabled:
            return
        self.jsonl.close()
        self.tensorboard.close()


def _to_python(value) -> float | None:
    """A scalar as a float; NaN and infinities as None (JSON null: json.dumps would write bare NaN)."""
    value = float(np.asarray(value))
    return value if math.isfinite(value) else None
