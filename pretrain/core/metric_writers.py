"""Where metrics go: `metrics.jsonl` (one JSON object per logged step) and TensorBoard events.

In a multi-host run only process 0 writes them (every process computes the same replicated
metrics); on the others a MetricWriter accepts every call and does nothing.
"""
from __future__ import annotations

import json
import os

import numpy as np
from tensorboardX import SummaryWriter

from pretrain.core import distributed


class MetricWriter:
    def __init__(self, workdir: str, resume_step: int = 0):
        self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
        self.tensorboard_dir = os.path.join(workdir, "tensorboard")
        self.enabled = distributed.is_primary()
        if not self.enabled:
            return
        self._drop_records_after(resume_step)
        self.jsonl = open(self.jsonl_path, "a")
        self.tensorboard = SummaryWriter(self.tensorboard_dir, flush_secs=10)

    def _drop_records_after(self, step: int) -> None:
        """A killed run may have logged past its last checkpoint; those steps will be redone."""
        if not os.path.exists(self.jsonl_path):
            return
        with open(self.jsonl_path) as f:
            kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        with open(self.jsonl_path, "w") as f:
            f.writelines(kept)

    def write(self, step: int, metrics: dict[str, float], prefix: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **{k: _to_python(v) for k, v in metrics.items()}}
        if prefix != "train":
            record = {"step": record["step"], **{f"{prefix}_{k}": v for k, v in record.items() if k != "step"}}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        for name, value in metrics.items():
            self.tensorboard.add_scalar(f"{prefix}/{name}", _to_python(value), int(step))

    def close(self) -> None:
        if not self.enabled:
            return
        self.jsonl.close()
        self.tensorboard.close()


def _to_python(value) -> float:
    return float(np.asarray(value))
