"""pretrain/loops/budget.py: a pretraining run fitted to a wall-clock budget (config.budget_minutes): the steps that
fit (a StepPlan, the config left as given), the schedule stretched over them, the plan a resumed run keeps, and config.budget_steps replaying it; the
held-out batches at their own masking rate (objective.eval_mask_prob), and held-out evaluations spending none of a
budget. End to end through the loop: tests/scripts/test_cram.py."""
from __future__ import annotations

import json
import time

import ml_collections
import pytest

from pretrain.loops import budget
from pretrain.workdir import preemption
from tests.helpers.tiny_bert import tiny_config


def schedule_config(**extra) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({**dict(
        num_train_steps=1000, budget_minutes=0.0, budget_steps=0, eval_every=25, checkpoint_every=250, log_every=20,
        optimizer=dict(warmup_steps=100), data=dict(long_seq_start_step=0, eval_documents=50)), **extra})


def test_plan_steps_fits_what_is_left_of_the_budget():
    assert budget.plan_steps(budget_left=600.0, step_time=0.25, setup=10.0) == int(budget.SAFETY * 590 / 0.25)
    assert budget.plan_steps(budget_left=5.0, step_time=1.0, setup=10.0) == 1  # at least one step


def test_stretch_keeps_the_schedule_shape_over_the_new_steps():
    stretched = budget.stretch(schedule_config(), 4321)  # the config a finished run records (StepPlan.record)
    assert stretched.num_train_steps == 4321
    assert stretched.optimizer.warmup_steps == 432  # 10% of the steps, as 100 of 1000
    assert stretched.eval_every == 108 and stretched.checkpoint_every == 1080  # 40 evaluations, 4 checkpoints
    assert stretched.log_every == 20 and stretched.data.long_seq_start_step == 0  # not tied to the schedule; unset


def test_stretched_counts_round_the_exact_share_at_a_half():
    """100 of 1,000 over 8,075 steps is 807.5 exactly, which rounds to 808 (a factor 8.075 first gave 807.49...)."""
    plan = budget.StepPlan.of(schedule_config())
    assert [plan.stretched(steps).warmup_steps for steps in (8075, 8085, 4321)] == [808, 808, 432]


def test_a_plan_stretches_the_counts_tied_to_the_schedule_and_leaves_the_config_alone():
    config = schedule_config()
    plan = budget.StepPlan.of(config).stretched(4321)
    assert plan == budget.StepPlan(num_train_steps=4321, warmup_steps=432, eval_every=108, checkpoint_every=1080,
                                   long_seq_start_step=0)
    assert config.num_train_steps == 1000 and config.optimizer.warmup_steps == 100  # derived values live in the plan
    assert budget.StepPlan.of(plan.record(config)) == plan


def fake_training(step_time: float, calls: list):
    """A `train` that records the config it was given and writes the metrics a run at `step_time` would."""
    def train(config, workdir):
        calls.append(config)
        with open(f"{workdir}/metrics.jsonl", "w") as f:
            for step in range(10, config.num_train_steps + 1, 10):
                f.write(json.dumps({"step": step, "step_time_sec": 3.0 if step == 10 else step_time}) + "\n")
    return train


def test_a_budget_times_a_calibration_run_and_writes_the_plan(tmp_path):
    calls = []
    started = time.time()
    fitted, deadline = budget.fit(schedule_config(budget_minutes=2.0), str(tmp_path), fake_training(0.1, calls))
    (calibration,) = calls
    assert calibration.num_train_steps == budget.CALIBRATION_STEPS and calibration.budget_minutes == 0
    assert calibration.data.eval_documents == 0  # the calibration holds nothing out and evaluates nothing
    assert started + 120 <= deadline <= time.time() + 120
    plan = json.loads((tmp_path / budget.PLAN_FILE).read_text())
    assert plan["timed_step_sec"] == pytest.approx(0.1)  # the steps after TIMED_FROM, not the compiling first window
    assert fitted.num_train_steps == plan["planned_steps"]
    assert abs(plan["planned_steps"] - budget.plan_steps(120.0, 0.1, plan["setup_sec"])) <= 2  # less the seconds spent
    assert fitted.warmup_steps == round(0.1 * fitted.num_train_steps)


def test_a_workdir_with_a_plan_resumes_it_without_a_clock(tmp_path):
    (tmp_path / budget.PLAN_FILE).write_text(json.dumps({"planned_steps": 777}))
    calls = []
    fitted, deadline = budget.fit(schedule_config(budget_minutes=2.0), str(tmp_path), fake_training(0.1, calls))
    assert calls == [] and deadline is None and fitted.num_train_steps == 777


def test_budget_steps_replays_a_plan_and_no_budget_changes_nothing(tmp_path):
    fitted, deadline = budget.fit(schedule_config(budget_steps=500, budget_minutes=20.0), str(tmp_path), None)
    assert deadline is None and fitted.num_train_steps == 500 and fitted.warmup_steps == 50
    plain = schedule_config()
    assert budget.fit(plain, str(tmp_path), None) == (budget.StepPlan.of(plain), None)
    assert plain == schedule_config()  # nothing written into the config


def test_extending_the_deadline_moves_a_budget_and_leaves_no_budget_alone():
    with_budget = preemption.Watcher(deadline=100.0)
    with_budget.extend_deadline(2.5)
    assert with_budget.deadline == 102.5
    without = preemption.Watcher()
    without.extend_deadline(2.5)
    assert without.deadline is None


def test_held_out_batches_are_masked_at_their_own_rate(corpus_and_tokenizer):
    from pretrain.loops import pretraining
    config = tiny_config(*corpus_and_tokenizer, **{"data.eval_documents": 8, "objective.mask_prob": 0.4,
                                                   "objective.max_predictions_per_seq": 14,
                                                   "objective.eval_mask_prob": 0.15})
    _, train_data, eval_data = pretraining.training_data(config)

    def masked_share(data) -> float:
        batch = next(b for _, (_, b, _) in zip(range(1), data.iterate(0)))
        real = (batch["input_mask"] > 0).sum() - 2 * len(batch["input_mask"])  # [CLS] and [SEP] never predicted
        return batch["masked_lm_weights"].sum() / real
    try:
        assert masked_share(train_data) == pytest.approx(0.4, abs=0.04)
        assert masked_share(eval_data) == pytest.approx(0.15, abs=0.04)
    finally:
        train_data.close(), eval_data.close()
