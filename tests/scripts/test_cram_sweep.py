"""configs/cram.py's arms and sweeps, and scripts/reproduce/cram_report.py's table: each arm changes what it names
and nothing else, every arm is scored at the same held-out masking rate, and the report finds where a run leaves
the unigram plateau and the minute of the budget it came at."""
from __future__ import annotations

import json

import pytest

from configs import cram
from pretrain.jobs import sweep_cells
from scripts.reproduce import cram_report


def flat(config) -> dict:
    from pretrain.workdir.run_files import flatten
    return flatten(config.to_dict())


def test_bert_arm_is_the_bert_cram_recipe_scored_at_15_percent():
    from configs import bert
    arm, today = flat(cram.get_config("arch=bert")), flat(bert.get_config("size=tiny,recipe=cram,nsp=False"))
    differ = {k for k in today if arm.get(k) != today[k]}
    # the recipe trains as configs/bert.py's cram recipe; the evaluation along the run and the budget are the sweep's
    assert differ <= {"data.path", "tokenizer.path", "eval_every", "checkpoint_every", "budget_minutes",
                      "objective.eval_mask_prob", "optimizer.decay_fraction"}, differ
    assert arm["objective.eval_mask_prob"] == 0.15 and arm["budget_minutes"] == 60.0


@pytest.mark.parametrize("axis, value, changed", [
    ("arch", "bert_preln", {"model.pre_norm": True}),
    ("size", "4x256", {"model.num_layers": 4, "model.hidden_size": 256, "model.num_heads": 4,
                       "model.intermediate_size": 1024}),
    ("seq", "64", {"data.max_seq_length": 64, "batch_size": 64, "objective.max_predictions_per_seq": 26}),
    ("mask", "0.15", {"objective.mask_prob": 0.15, "objective.max_predictions_per_seq": 20}),
    ("schedule", "onecycle", {"optimizer.warmup_steps": 500}),
    ("schedule", "wsd", {"optimizer.schedule": "warmup_stable_decay"}),
    ("clip", "0.5", {"optimizer.grad_clip_norm": 0.5}),
    ("ramp", "on", {"batch_size": 16, "optimizer.ramp_accumulation": 4}),
])
def test_each_axis_changes_what_it_names_and_nothing_else(axis, value, changed):
    base, arm = flat(cram.get_config("arch=bert")), flat(cram.get_config(f"arch=bert,{axis}={value}"))
    assert {k: arm[k] for k in arm if arm[k] != base.get(k)} == changed


def test_modernbert_window_stays_local_in_64_token_rows():
    from pretrain.training import validation
    for seq in (64, 128):
        config = cram.get_config(f"arch=modernbert,seq={seq}")
        validation.validate(config)  # a window covering the whole row is refused there
        assert config.model.local_attention == seq


def test_modernbert_arm_keeps_its_family_at_the_shared_recipe():
    arm = cram.get_config("arch=modernbert,size=4x512")
    assert arm.model.name == "modernbert" and (arm.model.num_layers, arm.model.hidden_size) == (4, 512)
    assert arm.model.intermediate_size == 768 and arm.optimizer.learning_rate == 1e-3  # GeGLU at 1.5x the width
    assert arm.objective.mask_prob == 0.4 and arm.objective.eval_mask_prob == 0.15 and arm.batch_size == 32


def test_best_recipe_is_the_sweeps_choice_and_named_axes_override_it():
    from scripts.reproduce import cram as reproduce_cram
    assert reproduce_cram.CONFIG == "configs/cram.py:recipe=best,size=4x256"  # make cram: the 60-minute winner
    best = {axis: value for axis, value in cram.BEST.items() if axis != "minutes"}
    chosen = flat(cram.get_config("recipe=best"))
    assert chosen == flat(cram.get_config(",".join(f"{axis}={value}" for axis, value in best.items())))
    assert chosen["model.name"] == "modernbert" != flat(cram.get_config(""))["model.name"]
    assert flat(cram.get_config("recipe=best,arch=bert")) == flat(cram.get_config(
        ",".join(f"{axis}={value}" for axis, value in {**best, "arch": "bert"}.items())))
    assert cram.get_config("").model.name == "bert"  # recipe=base, where the sweeps' cells start: 2018's BERT


@pytest.mark.parametrize("arg, message", [("recipe=paper", "recipe='paper'"), ("arch=gpt", "arch='gpt'"),
                                          ("size=3x100", "LAYERSxWIDTH"), ("schedule=cosine", "schedule='cosine'"),
                                          ("ramp=yes", "ramp='yes'")])
def test_bad_arm_is_a_one_line_error(arg, message):
    with pytest.raises(ValueError, match=message):
        cram.get_config(arg)


def test_sweeps_name_distinct_cells_at_their_budget():
    arch = cram.get_sweep("arch@20")
    assert [c["arg.arch"] for c in arch] == list(cram.ARCHS) and all(c["arg.minutes"] == 20.0 for c in arch)
    recipe = cram.get_sweep("recipe:bert_preln@60")
    assert len({sweep_cells.cell_name(c) for c in recipe}) == len(recipe) == 9
    assert all(c["arg.arch"] == "bert_preln" and c["arg.minutes"] == 60.0 for c in recipe)
    assert cram.get_sweep("best@60") == [{"arg.recipe": "best", "arg.minutes": 60.0}]
    assert cram.get_sweep("long@60") == [{"arg.recipe": "best", "arg.size": "4x256", "arg.minutes": 60.0},
                                         {"arg.recipe": "best", "arg.mask": 0.3, "arg.minutes": 60.0}]
    with pytest.raises(ValueError, match="arch\\[@MINUTES\\]"):
        cram.get_sweep("sizes")


def write_run(workdir, evals: list[tuple[int, float]], step_time: float = 0.5) -> None:
    """A finished budget run's files: config.json of an arm, budget.json, metrics.jsonl (a window every 10 steps)."""
    workdir.mkdir(parents=True)
    from pretrain.loops import budget
    config = budget.stretch(cram.get_config("arch=bert_preln,mask=0.3"), 100)  # as the run saves it
    (workdir / "config.json").write_text(config.to_json())
    (workdir / "budget.json").write_text(json.dumps({"planned_steps": 100, "timed_step_sec": step_time,
                                                     "calibration_sec": 50.0, "setup_sec": 10.0}))
    # this run's own windows were slower (the machine was busy): the minutes are the plan's, not these
    lines = [{"step": s, "loss": 6.0, "step_time_sec": 2 * step_time} for s in range(10, 101, 10)]
    lines += [{"step": s, "eval_mlm_loss": loss, "eval_mlm_accuracy": 0.1} for s, loss in evals]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sorted(lines, key=lambda r: r["step"])))


def test_report_finds_the_plateau_exit_and_its_minute(tmp_path):
    write_run(tmp_path / "run", [(20, 6.3), (40, 6.0), (60, 5.95), (80, 5.2), (100, 4.9)])
    corpus = cram.get_config("").data.path
    row = cram_report.summarize(str(tmp_path / "run"), "python -m pretrain.train --config=X --workdir=DIR",
                                {corpus: 6.2})
    assert row["exit_step"] == 80  # 5.95 is within 0.3 of the plateau, 5.2 is below it
    assert row["exit_minute"] == pytest.approx((50 + 10 + 80 * 0.5) / 60)  # calibration, set-up, 80 steps of 0.5 s
    assert (row["arch"], row["mask"], row["schedule"], row["loss"]) == ("bert_preln", "0.3", "linear", 4.9)
    assert row["command"].endswith("--config.budget_steps=100")
    assert "| bert_preln | 2x128 | 128 | 0.3 | linear | 1 | 32 |" in cram_report.table([row], {corpus: 6.2})


def test_report_says_when_a_run_never_leaves_the_plateau(tmp_path):
    write_run(tmp_path / "run", [(50, 6.1), (100, 6.0)])
    row = cram_report.summarize(str(tmp_path / "run"), "", {cram.get_config("").data.path: 6.2})
    assert row["exit_step"] is None and "not within the run" in cram_report.table([row], {"c": 6.2})
