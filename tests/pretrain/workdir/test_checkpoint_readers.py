"""Every reader of a checkpoint meets a damaged one the same way (pretrain/workdir/checkpoint_reads.py), for each of
the three damages of tests/helpers/damaged_checkpoints.py: where an earlier complete step exists, one warning line
and that step; where none does, one DamagedCheckpointError line (exit status 1); nothing else on stderr."""
from __future__ import annotations

import os
import re
import shutil

import numpy as np
import optax
import pytest

from configs import glue
from pretrain.distillation import task_teacher
from pretrain.lm import language_model, masked_lm
from pretrain.loops import evaluation
from pretrain.tools import export_hf_bert
from pretrain.training import pretrained
from pretrain.training.train_state import TrainState
from pretrain.workdir import checkpoints
from tests.helpers.commands import run_module, run_train
from tests.helpers.damaged_checkpoints import DAMAGES, damage
from tests.helpers.tiny_bert import tiny_overrides



def step_of(source: str) -> int:
    """The step in a loaded model's source, orbax:<workdir>/checkpoints/<step>."""
    return int(source.rsplit("/", 1)[1])


# The readers of a pretraining run: each returns the step it read (the run has complete checkpoints 3 and 6).
PRETRAINING_READERS = {
    "fine-tuning init": lambda workdir, out: step_of(pretrained.load_pretrained(workdir).source),
    "export": lambda workdir, out: int(re.search(r" step (\d+) \(", export_hf_bert.export(workdir, out)).group(1)),
    "masked-LM scoring": lambda workdir, out: step_of(masked_lm.load_masked_lm(workdir).source),  # lm-eval, pairs
}
NOISE = ("Traceback", "never retrieved", "Event loop is closed", "WARNING:absl", "ERROR:")


def damaged_copy(workdir: str, tmp_path, kind: str, steps: tuple[int, ...]) -> str:
    copy = str(tmp_path / "run")
    shutil.copytree(workdir, copy)
    for step in steps:
        damage(os.path.join(copy, "checkpoints", str(step)), kind)
    return copy


def assert_only(stderr: str, lines: list[str]) -> None:
    """stderr holds exactly `lines` (prefixes) and none of Orbax's, TensorStore's or asyncio's noise."""
    found = [line for line in stderr.splitlines() if line.strip()]
    assert len(found) == len(lines) and all(f.startswith(p) for f, p in zip(found, lines)), stderr[-3000:]
    assert not any(n in stderr for n in NOISE), stderr[-3000:]


@pytest.mark.slow  # the shared trained runs start pretrain.train
@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("reader", PRETRAINING_READERS)
def test_a_reader_falls_back_past_a_damaged_latest_step_with_one_warning(tiny_bert_workdir, tmp_path, capfd,
                                                                         reader, kind):
    workdir = damaged_copy(tiny_bert_workdir, tmp_path, kind, steps=(6,))
    capfd.readouterr()
    assert PRETRAINING_READERS[reader](workdir, str(tmp_path / "out")) == 3
    assert_only(capfd.readouterr().err, [f"warning: skipping checkpoint {workdir}/checkpoints/6: "])


@pytest.mark.slow  # the shared trained runs start pretrain.train
@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("reader", PRETRAINING_READERS)
def test_a_reader_with_no_usable_step_stops_in_one_line(tiny_bert_workdir, tmp_path, capfd, reader, kind):
    workdir = damaged_copy(tiny_bert_workdir, tmp_path, kind, steps=(3, 6))
    capfd.readouterr()
    with pytest.raises(checkpoints.DamagedCheckpointError) as info:
        PRETRAINING_READERS[reader](workdir, str(tmp_path / "out"))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"no usable checkpoint in {workdir}/checkpoints: 6 (")
    assert "; 3 (" in message and info.value.exit_status == 1
    assert_only(capfd.readouterr().err, [f"warning: skipping checkpoint {workdir}/checkpoints/6: "])


@pytest.mark.slow  # the shared trained runs start pretrain.train
@pytest.mark.parametrize("kind", DAMAGES)
def test_the_language_model_of_a_run_with_one_damaged_step_stops_in_one_line(tiny_gpt_workdir, tmp_path, capfd,
                                                                              kind):
    """generate, perplexity, few-shot and lm-eval load a GPT through language_model.load_language_model."""
    workdir = damaged_copy(tiny_gpt_workdir, tmp_path, kind, steps=(10,))
    capfd.readouterr()
    with pytest.raises(checkpoints.DamagedCheckpointError, match=r"^no usable checkpoint in .*checkpoints: 10 \("):
        language_model.load_language_model(workdir)
    assert_only(capfd.readouterr().err, [])


def finetuned_workdir(tmp_path, corpus_and_tokenizer, kind: str) -> str:
    """The layout of a pretrain.finetune run of SST-2 (its config.json, its best checkpoint as checkpoints/<step>,
    Orbax's only kept step) with that checkpoint damaged: the readers stop at the checkpoint, before the model."""
    workdir = tmp_path / "finetuned"
    config = glue.get_config("task=sst2")
    config.tokenizer.update(kind="sentencepiece", path=corpus_and_tokenizer[1])
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "config.json").write_text(config.to_json())
    write_random_checkpoint(str(workdir / "checkpoints"), step=4)
    damage(str(workdir / "checkpoints" / "4"), kind)
    return str(workdir)


def write_random_checkpoint(directory: str, step: int) -> None:
    """A complete checkpoint of random (incompressible) weights, as Checkpointer writes one."""
    params = {"dense": {"kernel": np.random.default_rng(step).normal(size=(64, 64)).astype(np.float32)}}
    ckpt = checkpoints.Checkpointer(directory, save_every=1, keep=1)
    ckpt.save(step, TrainState.create(apply_fn=None, params=params, tx=optax.adam(1e-3)), {"step": step})
    ckpt.close()


FINETUNED_READERS = {
    "evaluate": lambda workdir: evaluation.evaluate_workdir(workdir, ["dev"]),
    "distillation teacher": lambda workdir: task_teacher.teacher_logits(workdir, glue.get_config("task=sst2"), []),
}


@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("reader", FINETUNED_READERS)
def test_a_reader_of_a_finetuned_run_with_a_damaged_best_checkpoint_stops_in_one_line(
        tmp_path, corpus_and_tokenizer, capfd, reader, kind):
    workdir = finetuned_workdir(tmp_path, corpus_and_tokenizer, kind)
    capfd.readouterr()
    with pytest.raises(checkpoints.DamagedCheckpointError, match=r"^no usable checkpoint in .*checkpoints: 4 \("):
        FINETUNED_READERS[reader](workdir)
    assert_only(capfd.readouterr().err, [])


@pytest.mark.slow
@pytest.mark.parametrize("kind", DAMAGES)
def test_resuming_training_past_a_damaged_latest_step_prints_one_warning(tiny_bert_workdir, corpus_and_tokenizer,
                                                                        tmp_path, kind):
    workdir = damaged_copy(tiny_bert_workdir, tmp_path, kind, steps=(6,))
    proc = run_train(workdir, tiny_overrides(*corpus_and_tokenizer, log_every=6))
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: skipping checkpoint")]
    assert len(warnings) == 1 and f"{workdir}/checkpoints/6:" in warnings[0], proc.stderr[-3000:]
    assert not any(n in proc.stderr for n in NOISE[:3]), proc.stderr[-3000:]
    assert f"Resumed from {workdir}/checkpoints/3" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
def test_export_of_a_run_with_no_usable_step_is_one_line_and_exit_status_1(tiny_bert_workdir, tmp_path):
    workdir = damaged_copy(tiny_bert_workdir, tmp_path, "truncated data files", steps=(3, 6))
    proc = run_module("pretrain.tools.export_hf_bert", [f"--workdir={workdir}", f"--output={tmp_path / 'out'}"],
                      check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert_only(proc.stderr, ["warning: skipping checkpoint", "error: no usable checkpoint in "])
    assert not os.path.exists(tmp_path / "out")


def test_asyncio_records_of_failed_tensorstore_reads_are_dropped_and_others_kept(caplog):
    """What asyncio logs for a TensorStore read that failed after the restore gave up on its step."""
    import asyncio
    checkpoints.reads.drop_late_callbacks()
    loop = asyncio.new_event_loop()
    for error in (ValueError('DATA_LOSS: Error reading "x" [tensorstore_spec=\'{}\']'),
                  RuntimeError("Event loop is closed"), ValueError("a bug of ours")):
        loop.call_exception_handler({"message": "Future exception was never retrieved", "exception": error})
    loop.close()
    assert [str(r.exc_info[1]) for r in caplog.records if r.name == "asyncio"] == ["a bug of ours"]
