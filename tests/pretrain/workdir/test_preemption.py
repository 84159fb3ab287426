"""Preemption: the watcher (signals -> a stop at the next step boundary, handlers restored), the exit
status 75 with one line, the loops' save at the step reached, a real SIGTERM sent to
pretrain.train and pretrain.finetune whose reruns end exactly where uninterrupted runs end, and one sent
before their first step (reading data, compiling), which stops them at once with one line and 75."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from pretrain.runtime import errors
from pretrain.workdir import preemption
from tests.helpers.commands import run_module, run_train, subprocess_env
from tests.helpers.paths import REPO, SHARED_DATA
from tests.helpers.states import assert_same_states
from tests.helpers.tiny_bert import tiny_config, tiny_overrides


# ---------------------------------------------------------------------------------------------
# The watcher.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_asks_for_a_stop_and_the_handlers_come_back(sig, terminal_sigint):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with pytest.raises(errors.StoppedAfterLastStep):  # a stop asked for that no step took: reported at the exit
        with preemption.Watcher(multiprocess=False) as watcher:
            assert signal.getsignal(sig) is not before[sig]
            assert not watcher.should_stop(1)
            os.kill(os.getpid(), sig)
            time.sleep(0.01)  # Python runs the handler between bytecodes of the main thread
            assert watcher.should_stop(2) and watcher.should_stop(2) and watcher.received == sig
            assert {s: signal.getsignal(s) for s in before} == before  # the first signal gave them back
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_signal_after_the_last_step_lets_the_final_work_finish_then_stops(tmp_path):
    term = signal.getsignal(signal.SIGTERM)
    finished = []
    with pytest.raises(errors.StoppedAfterLastStep) as info:
        with preemption.Watcher(multiprocess=False, setting_up=str(tmp_path)) as watcher:
            with watcher.steps():
                assert not watcher.should_stop(1)
            assert signal.getsignal(signal.SIGTERM) == watcher._finish_first  # the final save, evaluation, flush
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            assert signal.getsignal(signal.SIGTERM) is term  # a second signal stops at once
            finished.append("the work after the signal")
    assert finished and str(info.value).startswith("stopped by SIGTERM after the last step")
    assert signal.getsignal(signal.SIGTERM) is term


def test_an_error_after_the_last_step_is_not_hidden_by_a_signal(tmp_path):
    with pytest.raises(KeyError):
        with preemption.Watcher(multiprocess=False, setting_up=str(tmp_path)) as watcher:
            with watcher.steps():
                pass
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            raise KeyError("the final save failed")


def test_a_second_ctrl_c_interrupts_at_once(terminal_sigint):
    with pytest.raises(KeyboardInterrupt):
        with preemption.Watcher(multiprocess=False) as watcher:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            assert watcher.requested
            os.kill(os.getpid(), signal.SIGINT)  # the previous handler: KeyboardInterrupt
            time.sleep(0.5)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


SWALLOWED_STOP = """
import sys
from pretrain.runtime import cli, errors

class RaisesWhenCollected:
    def __init__(self, error):
        self.error = error
    def __del__(self):  # as a signal handler's exception raised inside JAX's GC callback: Python drops it
        raise self.error

def main(argv):
    RaisesWhenCollected({error})
    print("went on")

sys.exit(cli.run(main))
"""


@pytest.mark.slow
@pytest.mark.parametrize("error, status, line", [
    ("KeyboardInterrupt()", 130, "interrupted (Ctrl-C): stopped at once"),
    ("errors.StoppedBeforeFirstStep('SIGTERM', '/w', None)", errors.EXIT_PREEMPTED, "SIGTERM")])
def test_a_stop_python_could_not_raise_still_stops_the_command(error, status, line):
    """A Ctrl-C landing in a GC callback was printed as "Exception ignored" and the run trained on."""
    env = {k: v for k, v in subprocess_env().items() if k != "LMPRETRAIN_TRACEBACK"}
    proc = subprocess.run([sys.executable, "-c", SWALLOWED_STOP.format(error=error)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert (proc.returncode, proc.stdout) == (status, ""), proc.stderr[-2000:]
    assert len(lines) == 1 and line in lines[0], proc.stderr[-2000:]


def test_handlers_are_restored_when_nothing_happened_and_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        term = signal.getsignal(signal.SIGTERM)
        with preemption.Watcher(multiprocess=False) as watcher:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == watcher._handle
        assert signal.getsignal(signal.SIGTERM) is term and not watcher.requested
    finally:
        signal.signal(signal.SIGINT, previous)


def test_several_processes_stop_at_the_step_jax_agrees_on(monkeypatch):
    """With jax.distributed the stop step is JAX's preemption sync point, and no handler is installed
    (JAX's preemption service owns SIGTERM)."""
    from jax.experimental import multihost_utils
    asked = []
    monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", lambda s: asked.append(s) or s == 7)
    term = signal.getsignal(signal.SIGTERM)
    with preemption.Watcher(multiprocess=True) as watcher:
        assert signal.getsignal(signal.SIGTERM) is term
        assert [watcher.should_stop(s) for s in (5, 6, 7)] == [False, False, True]
        assert watcher.should_stop(7) and asked == [5, 6, 7]  # the same step again: asked once


def test_preempted_exits_75_with_one_line(capsys, monkeypatch):
    monkeypatch.setenv("LMPRETRAIN_TRACEBACK", "1")  # a user error's traceback only; this is none
    with pytest.raises(SystemExit) as exit_info:
        with errors.one_line_errors():
            raise preemption.Preempted(12, "/runs/a/checkpoints")
    assert exit_info.value.code == preemption.EXIT_PREEMPTED == 75
    assert capsys.readouterr().err == ("preempted at step 12: checkpoint saved to /runs/a/checkpoints/12; "
                                       "run the same command to resume\n")


# ---------------------------------------------------------------------------------------------
# The pretraining loop, in process: a stop request saves at that step and raises Preempted.
# ---------------------------------------------------------------------------------------------
def test_the_loop_saves_at_the_step_it_stops_and_raises_preempted(tmp_path, corpus_and_tokenizer, monkeypatch):
    from pretrain.loops import pretraining
    monkeypatch.setattr(preemption.Watcher, "should_stop", lambda self, step: step == 4)
    workdir = tmp_path / "run"
    with pytest.raises(preemption.Preempted) as info:
        pretraining.train_and_evaluate(tiny_config(*corpus_and_tokenizer, num_train_steps=9, checkpoint_every=3),
                                       str(workdir))
    assert info.value.step == 4 and info.value.directory == str(workdir / "checkpoints")
    assert sorted(int(d) for d in os.listdir(workdir / "checkpoints")) == [3, 4]
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # the stopping step's metrics were fetched (and checked) before its save


def test_a_deadline_stops_like_a_signal_and_names_the_time_budget():
    with preemption.Watcher(multiprocess=False, deadline=time.time() + 3600) as watcher:
        assert not watcher.should_stop(1)
    with preemption.Watcher(multiprocess=False, deadline=time.time() - 1) as watcher:
        assert watcher.should_stop(1) and watcher.reason == "time budget reached"
    error = errors.Preempted(7, "/runs/x/checkpoints", "time budget reached")
    assert str(error).startswith("time budget reached at step 7: checkpoint saved to /runs/x/checkpoints/7;")


def test_the_budget_stop_saves_a_checkpoint_the_rerun_finishes_bitwise(tmp_path, corpus_and_tokenizer):
    """A deadline already past: the loop saves at its first step boundary, evaluates there (a budget ends the run)
    and stops; the same run without a budget resumes from there and ends where an uninterrupted run ends."""
    from pretrain.loops import pretraining
    config = tiny_config(*corpus_and_tokenizer, num_train_steps=6, checkpoint_every=6,
                         **{"data.eval_documents": 4, "eval_batches": 1})
    budgeted = tmp_path / "budgeted"
    with pytest.raises(preemption.Preempted) as info:
        pretraining.train_and_evaluate(config, str(budgeted), deadline=time.time() - 1)
    assert info.value.step == 1 and info.value.reason == "time budget reached"
    assert os.listdir(budgeted / "checkpoints") == ["1"]
    records = [json.loads(line) for line in (budgeted / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 1 and "eval_mlm_loss" in records[-1]
    pretraining.train_and_evaluate(config, str(budgeted))
    reference = tmp_path / "uninterrupted"
    pretraining.train_and_evaluate(config, str(reference))
    assert_same_states(reference / "checkpoints" / "6", budgeted / "checkpoints" / "6")


# ---------------------------------------------------------------------------------------------
# A real SIGTERM through the commands.
# ---------------------------------------------------------------------------------------------
PREEMPTED = re.compile(r"preempted at step (\d+): checkpoint saved to (.+)/(\d+); run the same command to resume")


def start(module: str, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def sigterm_after(proc: subprocess.Popen, metrics_path, lines: int) -> tuple[int, str]:
    """SIGTERM once metrics.jsonl has `lines` records; -> (exit status, stderr)."""
    deadline = time.time() + 400
    while proc.poll() is None and time.time() < deadline:
        if os.path.exists(metrics_path):
            with open(metrics_path) as f:
                if sum(1 for _ in f) >= lines:
                    break
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def preempted_step(returncode: int, stderr: str, directory, *, jax_logs: bool = False) -> int:
    """The step of the one line a preempted run ends with (`jax_logs`: JAX's C++ log lines may follow)."""
    assert returncode == 75, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    last = [line for line in lines if not (jax_logs and re.match(r"[IWE]\d{4} ", line))][-1]
    match = PREEMPTED.fullmatch(last)
    assert match and match.group(2) == str(directory) and match.group(1) == match.group(3), last
    return int(match.group(1))


@pytest.mark.slow
def test_sigterm_saves_where_pretraining_is_and_the_rerun_ends_bitwise_equal(tmp_path, corpus_and_tokenizer):
    steps, every = 60, 40  # the SIGTERM comes between step 0 and the first periodic checkpoint
    flags = tiny_overrides(*corpus_and_tokenizer, num_train_steps=steps, checkpoint_every=every, log_every=1)
    workdir = tmp_path / "preempted"
    proc = start("pretrain.train", ["--config=configs/bert.py:size=tiny", f"--workdir={workdir}", *flags])
    step = preempted_step(*sigterm_after(proc, workdir / "metrics.jsonl", 10), workdir / "checkpoints")
    assert 10 <= step < every, step
    assert os.listdir(workdir / "checkpoints") == [str(step)]  # the preemption save, complete
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == step

    resumed = run_train(workdir, flags)
    assert f"Resumed from {workdir / 'checkpoints'}/{step}" in resumed.stdout
    reference = tmp_path / "uninterrupted"
    run_train(reference, flags)
    assert_same_states(reference / "checkpoints" / str(steps), workdir / "checkpoints" / str(steps))


def _without_times(results: dict) -> str:
    """results.json minus its wall-clock fields, as text (NaN metrics compare equal that way)."""
    return json.dumps({k: v for k, v in results.items() if k not in ("wall_time_sec", "train_time_sec")},
                      sort_keys=True)


@pytest.mark.slow
def test_sigterm_saves_where_finetuning_is_and_the_rerun_gives_the_same_results(tmp_path, tiny_bert_workdir):
    args = ["--config=configs/glue.py:task=wnli", f"--config.init={tiny_bert_workdir}",
            f"--config.data.glue_dir={os.path.join(SHARED_DATA, 'glue')}", "--config.batch_size=4",
            "--config.data.max_train_examples=192", "--config.num_epochs=3", "--config.data.max_seq_length=64",
            "--config.write_test_predictions=False", "--config.log_every=1"]
    workdir = tmp_path / "preempted"
    proc = start("pretrain.finetune", [f"--workdir={workdir}", *args])
    # 48 steps per epoch: the SIGTERM comes early in the second epoch, after a best-epoch checkpoint
    step = preempted_step(*sigterm_after(proc, workdir / "metrics.jsonl", 60), workdir / "resume")
    assert 48 < step < 96, step
    assert os.listdir(workdir / "resume") == [str(step)] and not (workdir / "results.json").exists()
    assert os.listdir(workdir / "checkpoints") == ["48"]  # the best epoch so far, kept apart

    resumed = run_module("pretrain.finetune", [f"--workdir={workdir}", *args])
    assert f"Resumed from {workdir / 'resume'}/{step}" in resumed.stdout
    reference = tmp_path / "uninterrupted"
    run_module("pretrain.finetune", [f"--workdir={reference}", *args])
    ours, theirs = (json.loads((w / "results.json").read_text()) for w in (workdir, reference))
    assert _without_times(ours) == _without_times(theirs)
    assert (workdir / "predictions" / "dev.tsv").read_text() == (reference / "predictions" / "dev.tsv").read_text()
    assert (workdir / "metrics.jsonl").read_text() == (reference / "metrics.jsonl").read_text()
    assert not (workdir / "resume").exists()  # a finished run keeps no resume checkpoint
    assert os.listdir(workdir / "checkpoints") == os.listdir(reference / "checkpoints")


@pytest.mark.slow
def test_sigterm_to_one_of_two_processes_stops_both_at_the_same_step(tmp_path, corpus_and_tokenizer):
    """jax.distributed: JAX's preemption service catches the SIGTERM and both processes save the same
    step (reached_preemption_sync_point) and exit 75."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tmp_path / "two"
    flags = tiny_overrides(*corpus_and_tokenizer, num_train_steps=200, checkpoint_every=1000, log_every=1)
    env = subprocess_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    procs = [subprocess.Popen([sys.executable, "-m", "pretrain.train", "--config=configs/bert.py:size=tiny",
                               f"--workdir={workdir}", *flags, f"--coordinator_address=127.0.0.1:{port}",
                               "--num_processes=2", f"--process_id={i}", "--initialization_timeout=120"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    returncode, err = sigterm_after(procs[1], workdir / "metrics.jsonl", 5)
    _, err0 = procs[0].communicate(timeout=300)
    steps = {preempted_step(returncode, err, workdir / "checkpoints", jax_logs=True),
             preempted_step(procs[0].returncode, err0, workdir / "checkpoints", jax_logs=True)}
    assert len(steps) == 1 and os.listdir(workdir / "checkpoints") == [str(steps.pop())]


# ---------------------------------------------------------------------------------------------
# A SIGTERM before the first step: nothing to save, one line, 75 at once.
# ---------------------------------------------------------------------------------------------
def test_a_sigterm_during_the_set_up_raises_at_once_and_the_steps_get_the_saving_handlers(tmp_path):
    term, interrupt = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with preemption.Watcher(multiprocess=False, setting_up=str(tmp_path)) as watcher:
        assert signal.getsignal(signal.SIGINT) is interrupt  # Ctrl-C stays Python's KeyboardInterrupt
        with pytest.raises(errors.StoppedBeforeFirstStep) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
        assert str(info.value) == ("stopped by SIGTERM before the first step: nothing to save; rerun the same "
                                   "command to start again")
        assert signal.getsignal(signal.SIGTERM) is term  # a second SIGTERM stops the process at once
    with pytest.raises(errors.StoppedAfterLastStep):  # no loop here raised Preempted at the stop
        with preemption.Watcher(multiprocess=False, setting_up=str(tmp_path)) as watcher:
            with watcher.steps():
                assert signal.getsignal(signal.SIGTERM) == watcher._handle
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
                assert watcher.should_stop(1)
            assert signal.getsignal(signal.SIGTERM) is term  # back when the steps end: a second one stops at once
    assert not isinstance(errors.StoppedBeforeFirstStep("SIGTERM", "d", None), Exception)  # no `except Exception`


def start_unbuffered(module: str, args: list[str]) -> subprocess.Popen:
    """The command with its stdout line by line (a test waits for a line), compiling without the persistent cache
    (a cache hit would make the set-up too short to be caught in it)."""
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, text=True,
                            env=subprocess_env({"PYTHONUNBUFFERED": "1", "LMPRETRAIN_COMPILATION_CACHE": "off"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def sigterm_at_line(proc: subprocess.Popen, prefix: str, delay: float = 0.0) -> tuple[int, list[str]]:
    """SIGTERM `delay` seconds after the stdout line starting with `prefix`; -> (exit status, stderr's lines)."""
    for line in proc.stdout:
        if line.startswith(prefix):
            time.sleep(delay)
            proc.send_signal(signal.SIGTERM)
            break
    _, err = proc.communicate(timeout=300)
    return proc.returncode, [line for line in err.splitlines() if line.strip()]


def _before_first_step(directory, latest: int | None) -> str:
    kept = f"checkpoint {directory}/{latest} stays the latest; rerun the same command to resume" if latest else \
        "rerun the same command to start again"
    return f"stopped by SIGTERM before the first step: nothing to save; {kept}"


@pytest.mark.slow
def test_sigterm_before_the_first_step_of_pretraining_is_one_line_and_exit_75(tmp_path, corpus_and_tokenizer):
    """While the model is built and compiled (a model big enough that this takes seconds): no checkpoint yet, so the
    run stops at once. Then a SIGTERM while the first step compiles: the stop comes once the step ran, with its
    checkpoint. Then one while a resumed run restores: the checkpoint stays the latest."""
    flags = tiny_overrides(*corpus_and_tokenizer, **{"model.num_layers": 4, "model.hidden_size": 64,
                                                     "model.intermediate_size": 128, "data.max_seq_length": 128,
                                                     "objective.max_predictions_per_seq": 19})  # 15% of 126
    workdir = tmp_path / "run"
    args = ["--config=configs/bert.py:size=tiny", f"--workdir={workdir}", *flags]
    status, err = sigterm_at_line(start_unbuffered("pretrain.train", args), "Corpus:")  # printed before the model
    assert status == 75 and err == [_before_first_step(workdir / "checkpoints", None)], err
    assert not list(workdir.glob("checkpoints/*"))

    # "Model ..." comes after the set-up: the signal lands in the first step's compilation, or just before it
    status, err = sigterm_at_line(start_unbuffered("pretrain.train", args), "Model ", delay=0.5)
    latest = None
    if err[-1].startswith("stopped by"):  # a slow machine, still in the set-up half a second later
        assert status == 75 and err[-1] == _before_first_step(workdir / "checkpoints", None), err
    else:
        latest = preempted_step(status, "\n".join(err), workdir / "checkpoints")
        assert latest == 1 and os.listdir(workdir / "checkpoints") == ["1"]

    status, err = sigterm_at_line(start_unbuffered("pretrain.train", args), "Corpus:")
    assert status == 75 and err == [_before_first_step(workdir / "checkpoints", latest)], err


@pytest.mark.slow
def test_sigterm_before_the_first_step_of_fine_tuning_is_one_line_and_exit_75(tmp_path, tiny_bert_workdir):
    workdir = tmp_path / "ft"
    args = [f"--workdir={workdir}", "--config=configs/glue.py:task=wnli", f"--config.init={tiny_bert_workdir}",
            f"--config.data.glue_dir={os.path.join(SHARED_DATA, 'glue')}", "--config.data.max_train_examples=32",
            "--config.data.max_seq_length=128"]
    status, err = sigterm_at_line(start_unbuffered("pretrain.finetune", args), "Task ")  # before the model is built
    assert status == 75 and err == [_before_first_step(workdir / "resume", None)], err
    assert not (workdir / "results.json").exists() and not list(workdir.glob("*/[0-9]*"))  # nothing saved
