"""scripts/bench/bench_transfer.py and transfer_report.py: the labels-to-match interpolation, the learning rate chosen
on the carved validation split, seeds spread over the pretraining runs, the table's interval cells (no runs)."""
import json
import math
import os

import pytest

from scripts.bench import bench_transfer, intervals, transfer_report
from scripts.reproduce import glue_study


def fake_workdir(path) -> str:
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model": {"name": "modernbert"}}, f)
    open(os.path.join(path, "metrics.jsonl"), "w").close()
    return str(path)


@pytest.fixture
def rows(tmp_path):
    """arm name -> its Row of recipe ulmfit, for two general runs and their adaptations (no ceiling)."""
    general = [fake_workdir(tmp_path / f"general_{k}") for k in range(2)]
    adapted = [fake_workdir(tmp_path / f"adapted_{k}") for k in range(2)]
    args = bench_transfer.parse_args(["--general", *general, "--adapted", *adapted, "--no_ceiling", "--full_random",
                                      "--output", str(tmp_path / "out"), "--glue_dir", str(tmp_path / "glue")])
    arms = bench_transfer.build_arms(args)
    return args, general, adapted, {arm.name: bench_transfer.Row(arm, "ulmfit", args, {}) for arm in arms}


def flag(command, name: str) -> str:
    return next(arg.split("=", 1)[1] for arg in command if arg.startswith(name + "="))


def test_labels_to_match_interpolates_in_log_labels_between_the_points_around_the_crossing():
    curve = {100: [60.0], 1000: [70.0, 70.0], 8000: [80.0]}
    assert transfer_report.labels_to_match(curve, 65.0) == pytest.approx(math.sqrt(100 * 1000))  # half-way in log
    assert transfer_report.labels_to_match(curve, 72.5) == pytest.approx(1000 * 8 ** 0.25)
    assert transfer_report.labels_to_match(curve, 70.0) == 1000  # an exact hit: that count
    assert transfer_report.labels_to_match(curve, 55.0) == 100  # the smallest count already there
    assert transfer_report.labels_to_match(curve, 85.0) is None  # never reached
    assert transfer_report.labels_to_match({100: [60.0], 300: [], 1000: [70.0]}, 65.0) == pytest.approx(
        math.sqrt(100 * 1000))  # a count not run yet is left out
    assert transfer_report.match_text(curve, 85.0) == "> 8,000"
    assert transfer_report.match_text(curve, 55.0) == "≤ 100"
    assert transfer_report.match_text(curve, float("nan")) == "—"  # random at 8,000 not run yet


def test_the_learning_rate_is_chosen_on_the_carved_validation_split_not_on_dev(rows):
    args, _, _, by_arm = rows
    row = by_arm["pretrained"]
    # dev favours 3e-3, the validation split 1e-3 (means over the two selection seeds)
    accuracy = {3e-4: ([0.70, 0.72], [0.60, 0.62]), 1e-3: ([0.74, 0.76], [0.70, 0.72]),
                3e-3: ([0.90, 0.90], [0.65, 0.69])}
    harness = row.study.harness
    for rate, (dev, validation) in accuracy.items():
        for seed in (0, 1):
            cell = row.cell(1000, rate, seed)
            assert f"--config.optimizer.learning_rate={rate}" in cell.command
            os.makedirs(harness.workdir(cell.name))
            with open(os.path.join(harness.workdir(cell.name), "results.json"), "w") as f:
                json.dump({"metrics": {"dev": {"accuracy": dev[seed]}, "validation": {"accuracy": validation[seed]}}},
                          f)
            harness.sweep.record(cell, 0, 1.0)
    assert bench_transfer.choose_rate(row, args, run=False) == 1e-3
    assert row.selection[3e-3] == pytest.approx([65.0, 69.0])


def test_the_rate_waits_for_every_selection_run():
    assert bench_transfer.select_rate({1e-3: [70.0, 71.0], 3e-3: [90.0]}, seeds=2) is None
    assert bench_transfer.select_rate({1e-3: [70.0, 71.0], 3e-3: [69.0, 80.0]}, seeds=2) == 3e-3


def test_seed_k_fine_tunes_from_general_run_k_mod_n_and_its_own_adaptation(rows):
    _, general, adapted, by_arm = rows
    for seed in range(5):
        assert flag(by_arm["pretrained"].cell(300, 1e-3, seed).command, "--config.init") == general[seed % 2]
        assert flag(by_arm["adapted"].cell(300, 1e-3, seed).command, "--config.init") == adapted[seed % 2]
        random = by_arm["random"].cell(300, 1e-3, seed).command
        assert flag(random, "--config.init") == general[0] and "--config.init_weights=random" in random
    command = by_arm["pretrained"].cell(300, 1e-3, 0).command
    assert flag(command, "--config.data.max_train_examples") == "300"
    assert flag(command, "--config.data.validation_examples") == "30"  # a tenth of the labels, at least 10
    assert flag(by_arm["pretrained"].cell(100, 1e-3, 0).command, "--config.data.validation_examples") == "10"
    assert "--config.discriminative_factor=2.6" in command and "--config.model.classifier_pooling=mean" in command
    assert by_arm["random"].arm.labels[-1] == bench_transfer.FULL and by_arm["pretrained"].arm.labels[-1] == 8000


def test_the_table_shows_the_interval_of_each_mean_and_of_each_difference_from_random():
    pretrained, random = [80.0, 82.0, 84.0, 81.0, 83.0], [70.0, 71.0, 75.0, 72.0, 74.0]
    curves = {"random/plain": {1000: random, 8000: [80.0, 81.0, 82.0, 83.0, 84.0]},
              "pretrained/plain": {1000: pretrained, 8000: []}}
    table = transfer_report.table(curves, {"random/plain": 1e-3, "pretrained/plain": None}, seeds=5)
    lines = {line.split(" | ")[0].lstrip("| "): line.split(" | ")
             for line in table.splitlines() if line.startswith("|")}
    assert lines["pretrained/plain"][1:4] == ["—", intervals.format_interval(pretrained), "—"]
    assert lines["random/plain"][1] == "0.001"
    difference, low, high = intervals.difference_interval(pretrained, random)
    assert lines["pretrained/plain - random/plain"][2] == f"{difference:+.1f} [{low:+.1f}, {high:+.1f}]"
    assert lines["pretrained/plain"][4].rstrip(" |") == "≤ 1,000"  # its mean at 1,000 (82) is random's at 8,000
    assert "(n=3)" in transfer_report.cell_text([1.0, 2.0, 3.0], seeds=5)


def test_the_aim_compares_our_best_arm_at_1k_with_the_best_random_row(tmp_path):
    curves = {"random/plain": {1000: [70.0, 72.0], 8000: [80.0, 82.0]},
              "random/ulmfit": {1000: [71.0, 73.0], 8000: [79.0, 80.0]},
              "pretrained/ulmfit": {1000: [82.0, 84.0]}, "minilm/plain": {1000: [90.0, 91.0]}}
    result = transfer_report.aim(curves)
    assert result["best"] == "pretrained/ulmfit"  # the ceiling is not one of our arms
    assert result["vs_reference"]["control"] == "random/plain" and result["vs_random"]["control"] == "random/ulmfit"
    assert result["vs_random"]["difference"] == pytest.approx(11.0) and result["above_zero"]
    assert "lower end above 0: yes" in transfer_report.aim_line(result)
    assert "not run yet" in transfer_report.aim_line(transfer_report.aim({"random/plain": {1000: [70.0]}}))
    record = transfer_report.record({name: {n: dict(enumerate(v)) for n, v in curve.items()}
                                     for name, curve in curves.items()}, {}, {})
    assert record["rows"]["pretrained/ulmfit"]["cells"]["1000"]["minus_random"]["difference"] == pytest.approx(11.0)
    json.dumps(record, allow_nan=False)  # nan as null


def test_extra_seeds_go_to_the_widest_interval_first():
    curves = {"a/plain": {100: [50.0, 60.0, 70.0], 1000: [80.0, 80.5, 81.0]}, "b/plain": {100: [], 300: [70.0]}}
    assert bench_transfer.widest(curves) == ("b/plain", 300)  # one seed: no interval yet
    del curves["b/plain"][300]
    assert bench_transfer.widest(curves) == ("a/plain", 100)


def test_report_runs_nothing_and_shows_what_has_finished(rows, monkeypatch, capsys):
    args, general, adapted, by_arm = rows
    monkeypatch.setattr("scripts.reproduce.reproduction.Reproduction.run",
                        lambda *a, **k: pytest.fail("--report ran something"))
    for name, row in by_arm.items():
        harness = row.study.harness
        for rate in args.learning_rates:
            for seed in (0, 1):
                cell = row.cell(1000, rate, seed)
                os.makedirs(harness.workdir(cell.name))
                accuracy = 0.5 + rate * 10 + (0.1 if name == "pretrained" else 0.0) + seed / 100
                with open(os.path.join(harness.workdir(cell.name), "results.json"), "w") as f:
                    json.dump({"metrics": {"dev": {"accuracy": accuracy}, "validation": {"accuracy": accuracy}}}, f)
                harness.sweep.record(cell, 0, 1.0)
    bench_transfer.main(["--general", *general, "--adapted", *adapted, "--no_ceiling", "--recipes", "ulmfit",
                         "--output", args.output, "--glue_dir", args.glue_dir, "--report"])
    out = capsys.readouterr().out
    assert "pretrained/ulmfit: learning rate 0.003" in out
    assert "| pretrained/ulmfit | 0.003 | — | — | 63.5 ± " in out
    assert "Aim: needs" in out  # random at 8,000 not run yet
    with open(os.path.join(args.output, "bench_transfer.json")) as f:
        record = json.load(f)
    assert record["rows"]["pretrained/ulmfit"]["cells"]["1000"]["dev"] == pytest.approx({"0": 63.0, "1": 64.0})
    assert record["rows"]["random/ulmfit"]["cells"]["8000"]["mean"] is None
    assert os.path.exists(os.path.join(args.output, "sample_efficiency.png"))


def test_extra_seeds_are_spent_in_rounds_of_parallel_and_a_resumed_run_spends_only_the_rest(rows, monkeypatch):
    args, _, _, by_arm = rows
    args.extra_seeds, args.parallel = 3, 2
    row = by_arm["pretrained"]
    row.rate = 1e-3
    ran = []

    def finish(harness, cells, parallel=None):
        ran.append([cell.name for cell in cells])
        for cell in cells:
            if harness.sweep.outcome(cell) is None:
                os.makedirs(harness.workdir(cell.name))
                labels = glue_study.task_spec(cell.values["task"])[1]
                accuracy = 0.5 + cell.values["seed"] / 10 if labels == 100 else 0.8
                with open(os.path.join(harness.workdir(cell.name), "results.json"), "w") as f:
                    json.dump({"metrics": {"dev": {"accuracy": accuracy}}}, f)
                harness.sweep.record(cell, 0, 1.0)

    monkeypatch.setattr("scripts.reproduce.reproduction.Reproduction.run", finish)
    row.run([row.cell(n, 1e-3, seed) for n in (100, 1000) for seed in args.seeds])
    path = os.path.join(args.output, "extra_seeds.json")
    extra = {}
    bench_transfer.spend_extra_seeds(list(by_arm.values()), args, extra, path)
    assert extra == {"pretrained/ulmfit@100": [5, 6, 7]}  # 1,000 labels scored alike on every seed: no interval
    assert [len(names) for names in ran[1:]] == [2, 1] and ran[1][0] == "pretrained_ulmfit_lr0.001_sst2-100_seed5"
    with open(path) as f:
        resumed = json.load(f)
    ran.clear()
    bench_transfer.spend_extra_seeds(list(by_arm.values()), args, resumed, path)
    assert resumed == extra and ran == [[f"pretrained_ulmfit_lr0.001_sst2-100_seed{s}" for s in (5, 6, 7)]]
