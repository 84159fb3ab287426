"""Crash consistency under kill -9 (scripts/bench/kill9.py): pretraining, fine-tuning and pretraining into a gs://
bucket SIGKILLed at random moments drawn from an uninterrupted run's timeline (inside its compilation, saves,
evaluations and final save, and anywhere), each rerun with the same command: it resumes from the latest complete
checkpoint, ends bitwise equal to the uninterrupted run, leaves no temporary file and prints no leak warning.
A few moments in `make test`; 50 (10 in a bucket) in `make test-long`. Then the harness's own parts, and the fix it
led to in the metrics log."""
from __future__ import annotations

import json
import os

import pytest

from scripts.bench import kill9, kill9_harness as harness
from tests.helpers.paths import SHARED_DATA

GLUE_DIR = os.path.join(SHARED_DATA, "glue")
SEED = 0


def assert_survived(outcomes: list[harness.Outcome], moments: int) -> None:
    assert len(outcomes) == moments
    failed = [harness.describe(o) for o in outcomes
              if not o.bitwise or o.steps_lost or o.temporary_left or o.leak_warnings or o.rerun_error]
    assert not failed, "\n".join(failed)


@pytest.fixture(scope="module")
def pretraining(corpus_and_tokenizer, tmp_path_factory) -> tuple[harness.Command, harness.Reference]:
    command = kill9.pretraining(*corpus_and_tokenizer)
    return command, harness.run_reference(command, str(tmp_path_factory.mktemp("kill9") / "reference"))


@pytest.fixture(scope="module")
def fine_tuning(pretraining, tmp_path_factory) -> tuple[harness.Command, harness.Reference]:
    """Fine-tuning from the pretraining reference's final checkpoint."""
    command = kill9.fine_tuning(pretraining[1].workdir, GLUE_DIR)
    return command, harness.run_reference(command, str(tmp_path_factory.mktemp("kill9_ft") / "reference"))


@pytest.mark.slow  # the real commands, in subprocesses
@pytest.mark.parametrize("runs, moments", [
    pytest.param("pretraining", 2, id="pretraining, 2 moments"),
    pytest.param("fine_tuning", 1, id="fine-tuning, 1 moment"),
    pytest.param("pretraining", 50, id="pretraining, 50 moments", marks=pytest.mark.long),
    pytest.param("fine_tuning", 50, id="fine-tuning, 50 moments", marks=pytest.mark.long)])
def test_a_command_killed_at_random_moments_resumes_bitwise_with_nothing_lost(runs, moments, request, tmp_path):
    command, reference = request.getfixturevalue(runs)  # the command and its uninterrupted run
    assert_survived(harness.campaign(command, str(tmp_path), moments, reference, SEED), moments)


@pytest.mark.slow  # the real commands, in subprocesses
@pytest.mark.parametrize("moments", [pytest.param(1, id="1 moment"),
                                     pytest.param(10, id="10 moments", marks=pytest.mark.long)])
def test_pretraining_in_a_bucket_killed_at_random_moments_resumes_bitwise(pretraining, gcs_server, moments):
    """A bucket run ends bitwise where the local one does (tests/pretrain/commands/test_gcs_workdir.py), so the local
    reference serves. The root has no [ ] of a test id: in a gs:// path fsspec reads them as a glob, and a rotation's
    delete fails (`error: [] (FileNotFoundError; ...)`)."""
    command, reference = pretraining
    outcomes = harness.campaign(kill9.in_a_bucket(command), f"gs://bucket/kill9_{moments}", moments, reference,
                                SEED + 1)
    assert_survived(outcomes, moments)


def test_the_moments_fall_inside_each_phase_and_anywhere_and_follow_the_mark_before_them():
    marks = {"start": 0.0, "model": 2.0, "record:0": 5.0, "saving:checkpoints/10": 5.5, "saved:checkpoints/10": 5.8,
             "record:1": 6.0, "record:2": 7.0, "eval:2": 7.0, "record:3": 8.0, "saving:checkpoints/20": 8.5,
             "saved:checkpoints/20": 8.9, "record:4": 9.0, "eval:4": 9.0}
    moments = harness.draw_moments(harness.Timeline(marks, exit=10.0), 12, seed=3)
    inside = {phase: [m.seconds for m in moments if m.phase == phase] for phase in harness.PHASES}
    assert [m.phase for m in moments[:6]] == ["compile", "save", "eval", "final save", "compile", "save"]
    assert all(2.0 <= s <= 5.0 for s in inside["compile"]) and all(5.5 <= s <= 5.8 for s in inside["save"])
    assert all(6.0 <= s <= 7.0 or 8.0 <= s <= 9.0 for s in inside["eval"])  # from the record before each
    assert all(8.5 <= s <= 8.9 for s in inside["final save"])
    assert sum(m.phase == "anywhere" for m in moments) == 6 and all(0 <= m.seconds <= 10 for m in moments)
    for m in moments:  # the last mark at or before it
        assert marks[m.anchor] <= m.seconds and not any(marks[m.anchor] < t <= m.seconds for t in marks.values())
        assert abs(marks[m.anchor] + m.after - m.seconds) < 1e-9
    assert harness.draw_moments(harness.Timeline(marks, exit=10.0), 12, seed=3) == moments  # seeded


def test_the_harness_finds_temporary_files_and_leak_warnings(tmp_path):
    for folder in ("checkpoints/20/state", "checkpoints/30.orbax-checkpoint-tmp-1", "checkpoints/10.unusable"):
        (tmp_path / folder).mkdir(parents=True)
    for name in (".metrics.jsonl.x1.tmp", ".lock", "metrics.jsonl", "checkpoints/20/state/manifest.ocdbt"):
        (tmp_path / name).write_text("")
    assert harness.temporary_files(str(tmp_path)) == [
        ".lock", ".metrics.jsonl.x1.tmp", "checkpoints/10.unusable", "checkpoints/30.orbax-checkpoint-tmp-1"]
    tracker = ("resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 50 leaked semaphore "
               "objects to clean up at shutdown")
    assert harness.leak_lines("loss=7.1\n" + tracker) == [tracker]


def test_a_rerun_that_evaluates_its_resume_step_again_drops_the_killed_runs_evaluation_there(tmp_path):
    """Fine-tuning's state saved at an epoch's end (asynchronously) before the epoch's evaluation: a kill after the
    evaluation's record left it in metrics.jsonl, and the rerun, evaluating again, wrote it twice (found here)."""
    from pretrain.workdir.metric_writers import MetricWriter
    records = [{"step": 31, "loss": 0.7}, {"step": 32, "loss": 0.6}, {"step": 32, "eval_dev_accuracy": 0.5},
               {"step": 33, "loss": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for evaluated, kept in ((True, records[:3]), (False, records[:2])):
        MetricWriter(str(tmp_path), resume_step=32, evaluated=evaluated).close()
        assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == kept
