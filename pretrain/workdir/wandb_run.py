"""Weights & Biases beside metrics.jsonl and TensorBoard (pretrain/workdir/metric_writers.py): on when
config.wandb.project is set (off by default; `pip install -e ".[wandb]"`), for pretraining and fine-tuning alike.

The W&B run's id is kept in WORKDIR/wandb_run.json, so the same command resumed (after preemption, on another host)
continues the same W&B run (`wandb.init(id=..., resume="allow")`). The steps a killed run logged past its last
checkpoint are not sent again: the resumed run recomputes them bitwise, and W&B keeps a run's steps increasing. The
resolved config is logged once, when the run starts. `WANDB_MODE=offline` keeps everything under WORKDIR/wandb (`wandb
sync` uploads it later); a gs:// workdir keeps W&B's files in a local temporary folder. Process 0 only, as the other
writers.
"""
from __future__ import annotations

import json
import os
import secrets
import string
import tempfile

import ml_collections

from pretrain.runtime.errors import UserError
from pretrain.workdir import storage

RUN_FILE = "wandb_run.json"


def _import_wandb():
    try:
        import wandb
    except ImportError:
        raise UserError("config.wandb.project is set but wandb is not installed: pip install -e '.[wandb]' "
                        "(or leave config.wandb.project empty)") from None
    return wandb


def _new_id() -> str:
    """Eight characters of [a-z0-9], the form of W&B's own run ids."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbRun:
    """One W&B run for a workdir. logged_through: the last step already sent (-1: none)."""

    def __init__(self, settings: ml_collections.ConfigDict, workdir: str, config: dict, logged_through: int = -1):
        wandb = _import_wandb()
        path = os.path.join(workdir, RUN_FILE)
        run_id = json.loads(storage.read_text(path))["id"] if storage.exists(path) else _new_id()
        local_dir = tempfile.mkdtemp(prefix="wandb_") if storage.is_url(workdir) else workdir
        tags = [tag.strip() for tag in settings.tags.split(",") if tag.strip()]
        try:
            self.run = wandb.init(project=settings.project, entity=settings.entity or None, id=run_id,
                                  name=settings.name or os.path.basename(os.path.normpath(workdir)),
                                  tags=tags or None, resume="allow", dir=local_dir, config=config)
        except wandb.errors.UsageError as e:  # online without credentials, say
            raise UserError(f"Weights & Biases did not start ({str(e).splitlines()[0]}): run `wandb login`, or set "
                            "WANDB_MODE=offline to keep the run under the workdir") from None
        storage.write_atomic(path, json.dumps({"id": run_id, "project": settings.project}))
        self.logged_through = logged_through

    def log(self, step: int, metrics: dict[str, float], prefix: str) -> None:
        if step > self.logged_through:
            self.run.log({f"{prefix}/{name}": value for name, value in metrics.items()}, step=step)

    def finish(self) -> None:
        self.run.finish()
