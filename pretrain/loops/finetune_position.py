"""Where a fine-tuning run is (pretrain/loops/finetuning.py): the epoch and batch in progress, the best epoch so far
and every finished epoch's record, as DIR/resume keeps them beside the train state, and their restore."""
from __future__ import annotations

import copy
import dataclasses

from pretrain.runtime.errors import ConfigError, UserError
from pretrain.training import train_state
from pretrain.workdir import checkpoints, run_files as workdirs


@dataclasses.dataclass
class BestEpoch:
    epoch: int                         # counted from 1
    score: float                       # the task's main metric on the split the run selects on (scoring.selection)
    dev: dict[str, dict[str, float]]   # dev split -> its metrics
    validation: dict[str, float] | None = None  # the validation split's metrics, when one is carved from train


@dataclasses.dataclass
class Position:
    """Where a run is: what DIR/resume keeps beside the train state, and what results.json reports."""

    order: dict                        # what fixes the data order: a resume with another one is refused
    epoch: int = 0                     # the epoch in progress, counted from 0
    index: int = 0                     # its batches done
    step: int = 0                      # updates done
    best: BestEpoch | None = None
    epochs: list[dict] = dataclasses.field(default_factory=list)   # every finished epoch's record
    losses: list[float] = dataclasses.field(default_factory=list)  # the epoch in progress's, so far
    fetched: list[dict] = dataclasses.field(default_factory=list)  # host metrics since the last log
    skipped: int = 0                   # non-finite updates skipped, over the whole run

    def to_json(self) -> dict:
        """A copy: Orbax may write the JSON after these lists have grown."""
        return copy.deepcopy(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, saved: dict) -> "Position":
        best = saved.get("best")  # [epoch, score, dev] in the checkpoints of earlier versions
        best = BestEpoch(*best) if isinstance(best, list) else BestEpoch(**best) if best else None
        return cls(**{**saved, "best": best})

    def start_epoch(self, epoch: int) -> None:
        """Enters `epoch`: a new one starts empty; the one a resume stopped in goes on where it was."""
        if epoch != self.epoch:
            self.epoch, self.index, self.losses, self.fetched = epoch, 0, [], []


def restore_position(resume: checkpoints.Checkpointer, ckpt: checkpoints.Checkpointer, state, shardings,
                     order: dict, workdir: str, config) -> tuple[train_state.TrainState, Position]:
    """The whole train state and the loop's position from DIR/resume (one line if another run wrote it)."""
    try:
        workdirs.check_resume(workdir, config)
        restored, saved, step = resume.restore(checkpoints.abstract_with_shardings(state, shardings))
        if saved.get("order") != order:
            raise ConfigError(f"resume checkpoint {resume.directory}/{step} was written by a run with another data "
                              f"order ({saved.get('order')}, here {order}); rerun with the config that wrote it "
                              "or use a new --workdir")
    except UserError:
        resume.close()  # Orbax's background threads must stop before the process exits
        ckpt.close()
        raise
    position = Position.from_json(saved)
    print(f"Resumed from {resume.directory}/{step} (epoch {position.epoch + 1}, step {step})")
    return restored, position
