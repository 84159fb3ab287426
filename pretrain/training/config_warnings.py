"""Relations between config keys that waste a run without making it meaningless: each printed once per process.

A smoke test of a long recipe (`--config.num_train_steps=50` with BERT's 10,000 warm-up steps) or a published recipe
that caps its masking (ALBERT: 20 of a 512-token row) is legitimate, so these are warnings, not errors: one line on
stderr starting "warning:", printed by `validation.validate` once every error check has passed (an error is the one
line a refused command prints). The relations owned by a registered thing (an objective's masking budget, a freezing
strategy's depth) come from that thing's own check; this module holds those of the loop's generic keys.
"""
from __future__ import annotations

import sys

import ml_collections

from pretrain.runtime import profiling

_printed: set[str] = set()


def warn_once(message: str) -> None:
    """Prints `message` as a warning unless this process already has (validation may run twice on one config)."""
    if message not in _printed:
        _printed.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def of(config: ml_collections.ConfigDict) -> list[str]:
    """The warnings the generic keys of `config` deserve, in a fixed order."""
    checks = (_warmup_within_the_run, _warmup_fraction_below_the_run, _decay_decreases, _long_phase_starts,
              _profile_within_the_run, _teacher_weighs_something)
    return [message for check in checks if (message := check(config))]


def _reads_warmup(optimizer: ml_collections.ConfigDict) -> bool:
    """Whether the chosen schedule warms up over warmup_steps (ULMFiT's slanted triangle has its own rise)."""
    from pretrain.training.optimizers import SCHEDULES
    return "warmup_steps" in getattr(SCHEDULES.get(optimizer.schedule), "config_keys", {})


def _warmup_within_the_run(config) -> str | None:
    """A budget run stretches the warm-up with the steps, so the share, and this relation, stay as configured."""
    optimizer, steps = config.get("optimizer"), config.get("num_train_steps")
    if optimizer is None or not steps or not _reads_warmup(optimizer) or optimizer.get("warmup_steps", 0) < steps:
        return None
    return (f"config.optimizer.warmup_steps={optimizer.warmup_steps} >= config.num_train_steps={steps}: the whole run "
            f"is warm-up, the {optimizer.schedule} schedule never reaches config.optimizer.learning_rate="
            f"{optimizer.learning_rate:g}; lower warmup_steps below {steps}")


def _warmup_fraction_below_the_run(config) -> str | None:
    """Fine-tuning's warm-up as a share of its steps (warmup_steps -1)."""
    optimizer, share = config.get("optimizer"), config.get("warmup_fraction")
    if share is None or share < 1 or optimizer is None or optimizer.get("warmup_steps", 0) != -1:
        return None
    if not _reads_warmup(optimizer):
        return None
    return (f"config.warmup_fraction={share:g} warms up over every step: the {optimizer.schedule} schedule never "
            f"reaches config.optimizer.learning_rate={optimizer.learning_rate:g}; lower it (BERT: 0.1)")


def _decay_decreases(config) -> str | None:
    """A decaying schedule whose end is above its peak climbs after the warm-up (a learning-rate sweep that passes
    below a fixed end_learning_rate does this)."""
    from pretrain.training.optimizers import SCHEDULES
    optimizer = config.get("optimizer")
    if optimizer is None or "end_learning_rate" not in getattr(SCHEDULES.get(optimizer.schedule), "config_keys", {}):
        return None
    if optimizer.get("end_learning_rate", 0.0) <= optimizer.learning_rate:
        return None
    return (f"config.optimizer.end_learning_rate={optimizer.end_learning_rate:g} is above config.optimizer."
            f"learning_rate={optimizer.learning_rate:g}: the {optimizer.schedule} schedule climbs after its warm-up "
            "instead of decaying; lower end_learning_rate (0, or a tenth of the peak)")


def _long_phase_starts(config) -> str | None:
    """BERT's second phase at long_seq_length (a budget stretches its start with the steps)."""
    data, steps = config.get("data"), config.get("num_train_steps")
    if data is None or not steps or not data.get("long_seq_length", 0) or data.get("long_seq_start_step", 0) < steps:
        return None
    return (f"config.data.long_seq_start_step={data.long_seq_start_step} >= config.num_train_steps={steps}: the "
            f"config.data.long_seq_length={data.long_seq_length} phase never starts; lower the start step, or set "
            "--config.data.long_seq_length=0")


def _profile_within_the_run(config) -> str | None:
    """The trace's steps are absolute (a budget does not stretch them), so a budget run's are not known here."""
    window = profiling.parse_steps(config.get("profile_steps", ""))
    if window is None or config.get("budget_minutes", 0) > 0 or not config.get("num_train_steps"):
        return None
    steps = config.get("budget_steps", 0) or config.num_train_steps
    if window[0] <= steps:
        return None
    return (f"config.profile_steps={config.profile_steps!r} starts after the run's last step ({steps}, "
            "config.num_train_steps): no trace is written; profile steps within the run")


def _teacher_weighs_something(config) -> str | None:
    """Task distillation computes the teacher's logits of every training example before the first step."""
    distillation = config.get("distillation")
    if distillation is None or not distillation.get("teacher") or distillation.get("alpha", 0.5) > 0:
        return None
    return (f"config.distillation.alpha=0 gives config.distillation.teacher={distillation.teacher!r} no weight: its "
            "logits are computed for nothing; raise alpha, or set --config.distillation.teacher=''")
