"""scripts/reproduce/glue_study.py: which runs a study makes and which learning rate each (init, task) takes."""
import argparse

import pytest

from scripts.reproduce import glue_study

RATES = [1e-4, 3e-4, 1e-3]
# dev accuracy by (init, rate) -> per seed: seed 0 favours 3e-4 for `pretrained`, the mean over seeds 1e-3
DEV = {("pretrained", 1e-4): [0.60, 0.60, 0.60], ("pretrained", 3e-4): [0.70, 0.50, 0.50],
       ("pretrained", 1e-3): [0.65, 0.66, 0.67], ("random", 1e-4): [0.55, 0.56, 0.57],
       ("random", 3e-4): [0.52, 0.52, 0.52], ("random", 1e-3): [0.51, 0.51, 0.51]}


def study_with_fake_runs(tmp_path, monkeypatch, rate_selection: str):
    args = argparse.Namespace(output=str(tmp_path), glue_dir="g", parallel=1, tasks=["sst2-1k"], seeds=[0, 1, 2],
                              learning_rates=RATES, epochs=3, batch_size=32, minutes=0.0,
                              rate_selection=rate_selection)
    study = glue_study.GlueStudy(args, {"pretrained": [], "random": []}, settings=[])
    by_name = {cell.name: DEV[init, rate][seed] for (init, _, rate), cells in study.cells.items()
               for seed, cell in enumerate(cells)}
    ran = []
    monkeypatch.setattr(study.harness, "run", lambda cells: ran.append(sorted(c.name for c in cells)))
    monkeypatch.setattr(study.harness, "results", lambda cell: {"metrics": {"dev": {"accuracy": by_name[cell.name]}}})
    return study, ran


def test_first_seed_selection_runs_the_other_seeds_at_the_rate_best_on_seed_0_only(tmp_path, monkeypatch):
    study, ran = study_with_fake_runs(tmp_path, monkeypatch, "first_seed")
    scores = study.run()
    assert len(ran) == 2 and len(ran[0]) == 6 and all(name.endswith("seed0") for name in ran[0])
    assert ran[1] == ["pretrained_lr0.0003_sst2-1k_seed1", "pretrained_lr0.0003_sst2-1k_seed2",
                      "random_lr0.0001_sst2-1k_seed1", "random_lr0.0001_sst2-1k_seed2"]
    assert study.chosen == {("pretrained", "sst2-1k"): 3e-4, ("random", "sst2-1k"): 1e-4}
    assert scores["pretrained", "sst2-1k"] == pytest.approx([70.0, 50.0, 50.0])
    assert "best on dev for seed 0" in study.table(scores)


def test_mean_selection_runs_every_rate_and_seed_and_takes_the_best_mean(tmp_path, monkeypatch):
    study, ran = study_with_fake_runs(tmp_path, monkeypatch, "mean")
    scores = study.run()
    assert len(ran) == 1 and len(ran[0]) == 18
    assert study.chosen == {("pretrained", "sst2-1k"): 1e-3, ("random", "sst2-1k"): 1e-4}
    assert scores["pretrained", "sst2-1k"] == pytest.approx([65.0, 66.0, 67.0])


def test_few_label_rows_score_dev_every_few_epochs(tmp_path):
    args = argparse.Namespace(output=str(tmp_path), glue_dir="g", parallel=1, tasks=["sst2-100", "sst2-1k"],
                              seeds=[0], learning_rates=[1e-4], epochs=3, batch_size=32, minutes=0.0)
    study = glue_study.GlueStudy(args, {"pretrained": []}, settings=[])
    commands = {task: study.cells["pretrained", task, 1e-4][0].command for task in args.tasks}
    assert "--config.eval_every_epochs=5" in commands["sst2-100"] and "--config.num_epochs=100" in commands["sst2-100"]
    assert not any(flag.startswith("--config.eval_every_epochs") for flag in commands["sst2-1k"])


def test_first_seed_selection_runs_an_init_with_one_rate_whole_in_the_first_round(tmp_path, monkeypatch):
    args = argparse.Namespace(output=str(tmp_path), glue_dir="g", parallel=1, tasks=["sst2-1k"], seeds=[0, 1, 2],
                              learning_rates=RATES, epochs=3, batch_size=32, minutes=0.0, rate_selection="first_seed")
    study = glue_study.GlueStudy(args, {"pretrained": [], "ceiling": []}, settings=[], rates={"ceiling": [5e-5]})
    ran = []
    monkeypatch.setattr(study.harness, "run", lambda cells: ran.append(sorted(c.name for c in cells)))
    monkeypatch.setattr(study.harness, "results", lambda cell: {"metrics": {"dev": {"accuracy": 0.5}}})
    study.run()
    assert [n for n in ran[0] if n.startswith("ceiling")] == [f"ceiling_lr5e-05_sst2-1k_seed{s}" for s in range(3)]
    assert not any(n.startswith("ceiling") for n in ran[1])


def test_any_sst2_label_count_is_a_row_and_a_carved_validation_split_comes_out_of_its_labels(tmp_path):
    assert glue_study.task_spec("sst2-1k") == glue_study.TASKS["sst2-1k"]
    assert glue_study.task_spec("sst2-2000") == ("sst2", 2000, 5, 1)  # 63 steps an epoch: 5 epochs for 300 steps
    assert glue_study.task_spec("sst2-20k")[1:3] == (20000, 0)  # --epochs already make 300 steps
    assert glue_study.sst2_row(8000) == "sst2-8k" and glue_study.sst2_row(67349) == "sst2-67349"
    with pytest.raises(ValueError, match="no GLUE study row"):
        glue_study.task_spec("mnli-1k")
    args = argparse.Namespace(output=str(tmp_path), glue_dir="g", parallel=1, tasks=["sst2-300"], seeds=[0, 1],
                              learning_rates=[1e-4], epochs=3, batch_size=32, minutes=0.0)
    study = glue_study.GlueStudy(args, {"pretrained": ["--config.x=1"]}, settings=[], carve_validation=True,
                                 per_cell={"pretrained": lambda task, seed: [f"--config.init=run{seed % 2}"]})
    command = study.cells["pretrained", "sst2-300", 1e-4][1].command
    assert "--config.data.validation_examples=30" in command and command[-2:] == ("--config.x=1", "--config.init=run1")
