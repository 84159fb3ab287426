"""Where metrics go: `metrics.jsonl` (one JSON object per logged step) and TensorBoard events.

metrics.jsonl stays valid JSON whatever the run does: a NaN or infinite value is written as null (a
diverged run's losses included). On resume, the records past the restored step are dropped, and so is an
unreadable last line (a run killed mid-write); TensorBoard is told to purge its points past the restored
step too (SummaryWriter's purge_step: a SessionLog.START event at that step), so that no curve doubles back.

In a bucket (a gs:// workdir) LineLog keeps new lines in memory and appends them every FLUSH_SECS and when
the writer closes (a preempted run closes it) through storage.append, which uploads only those lines (the
server concatenates), and before every checkpoint is saved (flush), so a kill loses at most the lines after the
last checkpoint, which the resumed run logs again, never the file. TensorBoard's events are written by tensorboardX
into a local folder and their new bytes appended the same way (an events file is a sequence of records: appending is
what tensorboardX does locally); its own gs:// writer re-uploads the whole file at every flush, once more
when garbage-collected, and for two minutes into a bucket that is gone.

With config.wandb.project set, Weights & Biases gets the same records (pretrain/workdir/wandb_run.py).

In a multi-host run only process 0 writes them (every process computes the same replicated
metrics); on the others a MetricWriter accepts every call and does nothing.
"""
from __future__ import annotations

import io
import json
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from pretrain.runtime import distributed
from pretrain.workdir import storage
from pretrain.workdir.wandb_run import WandbRun


def _import_summary_writer():
    """tensorboardX's SummaryWriter, imported without torch when torch is not loaded yet: tensorboardX imports
    torch whenever it can (half of a command's import time, ~2 s, only to accept torch tensors), and these
    writers get Python floats. `import torch` fails for that one import (tensorboardX catches ImportError)."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # an ImportError for `import torch` until removed
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


SummaryWriter = _import_summary_writer()

FLUSH_SECS = 30.0  # metrics.jsonl in a bucket: at most this long between uploads


class MetricWriter:
    """config: the run's resolved config; its `wandb` fields (when it has them) turn Weights & Biases on."""

    def __init__(self, workdir: str, resume_step: int = 0, config=None, evaluated: bool = True):
        """evaluated: whether the restored state had done its step's held-out evaluation. Fine-tuning's state saved at
        an epoch's end before the epoch's evaluation has not: the rerun evaluates again, and the evaluation records of
        that step (a killed run's) are dropped too, so that none is there twice."""
        self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
        self.tensorboard_dir = os.path.join(workdir, "tensorboard")
        self.enabled = distributed.is_primary()
        self.wandb = None
        if not self.enabled:
            return
        logged_through = self._drop_records_after(resume_step, evaluated)
        wandb = config.get("wandb") if config is not None else None
        if wandb is not None and wandb.project:
            self.wandb = WandbRun(wandb, workdir, config.to_dict(), logged_through)
        self.jsonl = LineLog(self.jsonl_path, flush_secs=FLUSH_SECS)
        self.events = EventsFolder(self.tensorboard_dir, flush_secs=FLUSH_SECS)
        # purge_step: TensorBoard hides this log's events from that step on (those of a killed run, redone now).
        self.tensorboard = SummaryWriter(self.events.local_dir, flush_secs=10,
                                         purge_step=resume_step + 1 if resume_step else None)

    def _drop_records_after(self, step: int, evaluated: bool = True) -> int:
        """A killed run may have logged past its last checkpoint (those steps will be redone), and may have
        been killed in the middle of a line. Rewritten only when something is dropped. -> the last step logged
        before (-1: none)."""
        if not storage.exists(self.jsonl_path):
            return -1
        lines = io.StringIO(storage.read_text(self.jsonl_path)).readlines()
        kept, dropped_unreadable, logged_through = [], 0, -1
        for n, line in enumerate(lines):
            try:
                record = json.loads(line) if line.strip() else None
            except ValueError:
                record = None
                dropped_unreadable += 1
                print(f"warning: {self.jsonl_path}:{n + 1} is not a JSON record (a run cut short while writing "
                      "it?); dropped", file=sys.stderr, flush=True)
            if isinstance(record, dict):
                logged_through = max(logged_through, record.get("step", 0))
                at = record.get("step", 0)
                if at < step or at == step and (evaluated or not any(key.startswith("eval_") for key in record)):
                    kept.append(line if line.endswith("\n") else line + "\n")
        if kept != lines:
            storage.write_atomic(self.jsonl_path, "".join(kept))
        return logged_through

    def write(self, step: int, metrics: dict[str, float], prefix: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **{k: _to_python(v) for k, v in metrics.items()}}
        if prefix != "train":
            record = {"step": record["step"], **{f"{prefix}_{k}": v for k, v in record.items() if k != "step"}}
        self.jsonl.write(json.dumps(record, allow_nan=False) + "\n")  # flushed (in a bucket: uploaded in time)
        scalars = {name: float(np.asarray(value)) for name, value in metrics.items()}
        for name, value in scalars.items():  # TensorBoard and W&B take NaN as it is
            self.tensorboard.add_scalar(f"{prefix}/{name}", value, int(step))
        self.events.upload_if_due(self.tensorboard)
        if self.wandb is not None:
            self.wandb.log(int(step), scalars, prefix)

    def flush(self) -> None:
        """metrics.jsonl's lines written out now (in a bucket: uploaded), before a checkpoint is saved: a run killed
        once that checkpoint is complete resumes after these steps and would not log them again."""
        if self.enabled:
            self.jsonl.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self.jsonl.close()
        self.tensorboard.close()
        self.events.close()
        if self.wandb is not None:
            self.wandb.finish()


def _to_python(value) -> float | None:
    """A scalar as a float; NaN and infinities as None (JSON null: json.dumps would write bare NaN)."""
    value = float(np.asarray(value))
    return value if math.isfinite(value) else None


class LineLog:
    """Lines appended to a text file (metrics.jsonl). Local: opened for appending, flushed after every line.

    In a bucket every append is an upload and a compose request: the lines wait in memory and go together
    once `flush_secs` have passed since the last append, and at flush() and close(). An upload carries the
    new lines only, so its size does not grow with the run."""

    def __init__(self, path: str, flush_secs: float = 30.0):
        self.path, self.flush_secs, self._remote = path, flush_secs, storage.is_url(path)
        if self._remote:
            self._pending: list[str] = []
            self._uploaded = time.monotonic()
        else:
            self._file = open(path, "a")

    def write(self, line: str) -> None:
        if not self._remote:
            self._file.write(line)
            return self._file.flush()
        self._pending.append(line)
        if time.monotonic() - self._uploaded >= self.flush_secs:
            self.flush()

    def flush(self) -> None:
        if not self._remote:
            return self._file.flush()
        if self._pending:
            storage.append(self.path, "".join(self._pending))
            self._pending, self._uploaded = [], time.monotonic()

    def close(self) -> None:
        self.flush()
        if not self._remote:
            self._file.close()


class EventsFolder:
    """Where tensorboardX writes: the workdir's tensorboard/ folder itself on a local disk; for a bucket, a
    local temporary folder whose files' new bytes are appended to tensorboard/ in the bucket every
    `flush_secs` and at close()."""

    def __init__(self, directory: str, flush_secs: float = 30.0):
        self.directory, self.flush_secs, self._remote = directory, flush_secs, storage.is_url(directory)
        self.local_dir = tempfile.mkdtemp(prefix="tensorboard_") if self._remote else directory
        self._uploaded_bytes: dict[str, int] = {}
        self._uploaded = time.monotonic()

    def upload_if_due(self, writer) -> None:
        if self._remote and time.monotonic() - self._uploaded >= self.flush_secs:
            writer.flush()
            self.upload()

    def upload(self) -> None:
        for name in sorted(os.listdir(self.local_dir)):
            with open(os.path.join(self.local_dir, name), "rb") as f:
                f.seek(self._uploaded_bytes.get(name, 0))
                new = f.read()
            if new:
                storage.append(f"{self.directory}/{name}", new)
                self._uploaded_bytes[name] = self._uploaded_bytes.get(name, 0) + len(new)
        self._uploaded = time.monotonic()

    def close(self) -> None:
        """After the SummaryWriter closed (its last events are in the local files)."""
        if self._remote:
            self.upload()
            shutil.rmtree(self.local_dir, ignore_errors=True)
