"""A sweep's directory: what the sweep is and which of its cells (pretrain/jobs/sweep_cells.py) have finished.

    SWEEP/sweep.json          what the sweep is: config, entry point, the flags every cell gets, the cells
    SWEEP/<cell>/             the cell's run workdir (pretrain.finetune's or pretrain.train's own layout)
    SWEEP/logs/<cell>.log     the run's output;  SWEEP/logs/<cell>.json  its outcome, written once it exits 0

SWEEP may be in a bucket (gs://): a cell's output then goes to a local file while it runs (a child process
writes to a file descriptor) and is uploaded to SWEEP/logs/<cell>.log when it exits.

A cell counts as done only when its outcome file says exit 0, so a sweep killed at any point is resumed by
the same command: done cells are skipped, a cell cut short runs again with the same command in the same
workdir, and the entry points resume their own runs from their checkpoints. A sweep directory holding
other settings (config, entry point, shared flags) is a one-line error rather than a mix of two sweeps.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile

from pretrain.jobs.sweep_cells import Cell
from pretrain.runtime.errors import UserError
from pretrain.workdir import storage
from pretrain.workdir.run_files import write_json_atomic

SPEC_FILE = "sweep.json"
RUN_FILES = ("config.json", "results.json", "checkpoints", "metrics.jsonl")  # what a command's workdir holds


@dataclasses.dataclass
class SweepDir:
    root: str
    _staging: str | None = None  # the local folder of the running cells' logs, for a sweep in a bucket

    def log(self, cell: Cell) -> str:
        return os.path.join(self.root, "logs", cell.name + ".log")

    def local_log(self, cell: Cell) -> str:
        """Where the running cell's output goes: its log, or for a sweep in a bucket a local file that
        keep_log uploads."""
        if not storage.is_url(self.root):
            return self.log(cell)
        self._staging = self._staging or tempfile.mkdtemp(prefix="sweep_logs_")
        return os.path.join(self._staging, cell.name + ".log")

    def keep_log(self, cell: Cell) -> None:
        """After the cell exited: its local log uploaded (a sweep in a bucket)."""
        if storage.is_url(self.root):
            with open(self.local_log(cell), errors="replace") as f:
                storage.write_atomic(self.log(cell), f.read())

    def outcome_path(self, cell: Cell) -> str:
        return os.path.join(self.root, "logs", cell.name + ".json")

    def outcome(self, cell: Cell) -> dict | None:
        """The finished run's outcome (exit 0, wall time), or None when the cell has not completed."""
        path = self.outcome_path(cell)
        if not storage.exists(path):
            return None
        outcome = json.loads(storage.read_text(path))
        return outcome if outcome.get("returncode") == 0 else None

    def record(self, cell: Cell, returncode: int, wall_sec: float) -> None:
        write_json_atomic(self.outcome_path(cell), {"returncode": returncode, "wall_sec": wall_sec,
                                                    "command": list(cell.command)})

    def claim(self, spec: dict) -> None:
        """Writes sweep.json, or checks that the one there has the same settings (its cells may differ:
        a sweep may grow). A mismatch, or a run's own workdir, is a one-line error that changes nothing."""
        path = os.path.join(self.root, SPEC_FILE)
        run_files = [name for name in RUN_FILES if storage.exists(os.path.join(self.root, name))]
        if run_files and not storage.exists(path):
            raise UserError(f"--workdir={self.root} is a run's workdir (it holds {run_files[0]}), not a sweep's: give "
                            "the sweep a directory of its own (its cells' runs go inside it)")
        storage.makedirs(os.path.join(self.root, "logs"))
        if storage.exists(path):
            old = json.loads(storage.read_text(path))
            changed = [k for k in ("config", "entry_point", "shared_flags", "run_root", "launch")
                       if old.get(k) != spec.get(k)]
            if changed:
                raise UserError(f"{path} is a sweep with other {', '.join(changed)} ({old.get(changed[0])!r}); "
                                "give another --workdir, or the same flags to resume it")
        write_json_atomic(path, spec)
