"""Multi-host through the real commands: two processes on this machine (CPU, gloo collectives, 4 fake
devices each) joined by --coordinator_address / --num_processes / --process_id train with the losses of
one process with 8 devices, write one metrics.jsonl, save and resume one checkpoint together; a checkpoint
of one process resumes on two and the reverse (elastic resume: the default data order does not depend on
the process count); and the flags fail in one line (inconsistent values, a coordinator that never
answers, a batch that does not split over the processes)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers.commands import subprocess_env
from tests.helpers.paths import REPO, SHARED_DATA
from tests.helpers.tiny_bert import tiny_overrides

pytestmark = pytest.mark.slow  # every test here starts the real command in subprocesses

DEVICES = 8
SHAKESPEARE = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(config: str, workdir, overrides: list[str], processes: int) -> list[subprocess.Popen]:
    """`python -m pretrain.train` as `processes` processes sharing DEVICES fake CPU devices (one process
    runs without the distributed flags)."""
    args = [sys.executable, "-m", "pretrain.train", f"--config={config}", f"--workdir={workdir}", *overrides]
    env = subprocess_env({"XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES // processes}"})
    port = free_port()
    flags = [[] if processes == 1 else
             [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}", f"--process_id={i}",
              "--initialization_timeout=120"] for i in range(processes)]
    return [subprocess.Popen(args + f, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for f in flags]


def finish(*runs: list[subprocess.Popen]) -> list[list[subprocess.CompletedProcess]]:
    """Waits for every process of `runs` (started together: compilation overlaps); each must succeed."""
    done = []
    for procs in runs:
        done.append([])
        for proc in procs:
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, f"{proc.args[5:]} failed ({proc.returncode}):\n{err[-3000:]}"
            done[-1].append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def records(workdir) -> tuple[list[dict], list[dict]]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if "loss" in r], [r for r in rows if "eval_loss" in r]


def saved_steps(workdir) -> list[int]:
    return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


def assert_same_losses(one, two, steps: list[int]):
    (train_one, eval_one), (train_two, eval_two) = records(one), records(two)
    assert [r["step"] for r in train_two] == [r["step"] for r in train_one] == steps  # one file, each step once
    np.testing.assert_allclose([r["loss"] for r in train_two], [r["loss"] for r in train_one], rtol=0, atol=1e-5)
    assert [r["step"] for r in eval_two] == [r["step"] for r in eval_one]
    np.testing.assert_allclose([r["eval_loss"] for r in eval_two], [r["eval_loss"] for r in eval_one],
                               rtol=0, atol=1e-5)


def assert_only_process_0_speaks(procs):
    first, *others = procs
    assert f"Distributed: {len(procs)} processes, {DEVICES} devices ({DEVICES // len(procs)} per process)" \
        in first.stdout
    assert "train:" in first.stderr  # the progress bar
    for proc in others:
        assert proc.stdout == "" and "train:" not in proc.stderr, proc.stderr[-2000:]


BERT = "configs/bert.py:size=tiny"
CUT = 4  # the elastic runs resume from this checkpoint


@pytest.fixture(scope="module")
def bert_runs(tmp_path_factory, corpus_and_tokenizer):
    """BERT trained to step 8 (checkpoints 4 and 8) by one process and by two, started together; copies of both
    cut back to checkpoint CUT, as if preempted after its save (their metrics.jsonl runs on: it is redone);
    the one-process metrics.jsonl as the reference."""
    root = tmp_path_factory.mktemp("bert")
    flags = tiny_overrides(*corpus_and_tokenizer, num_train_steps=8, checkpoint_every=4, log_every=1)
    one, two = root / "one", root / "two"
    _, procs = finish(start(BERT, one, flags, 1), start(BERT, two, flags, 2))
    for source, cut in ((one, root / "one_cut"), (two, root / "two_cut")):
        shutil.copytree(source, cut)
        for step in saved_steps(cut):
            if step > CUT:
                shutil.rmtree(cut / "checkpoints" / str(step))
    (root / "reference").mkdir()  # the one-process losses to step 8 (the test below trains `one` on)
    shutil.copy(one / "metrics.jsonl", root / "reference")
    return root, flags, procs


def test_bert_two_processes_match_one_and_resume_together(bert_runs, corpus_and_tokenizer):
    root, _, procs = bert_runs
    one, two = root / "one", root / "two"
    assert_only_process_0_speaks(procs)
    assert_same_losses(one, two, list(range(1, 9)))
    assert saved_steps(two) == [4, 8]
    assert os.path.isfile(two / "config.json") and not list(two.glob("*.tmp*"))

    # Both processes restore checkpoint 8 and train on; the single process does the same.
    more = tiny_overrides(*corpus_and_tokenizer, num_train_steps=10, checkpoint_every=4, log_every=1)
    _, procs = finish(start(BERT, one, more, 1), start(BERT, two, more, 2))
    assert f"Resumed from {two}/checkpoints/8" in procs[0].stdout and procs[1].stdout == ""
    assert_same_losses(one, two, list(range(1, 11)))
    assert saved_steps(two) == [4, 8, 10]


def test_a_checkpoint_resumes_on_another_number_of_processes(bert_runs):
    """Elastic resume with the default data.streams: checkpoint 4 of one process, resumed by two, and checkpoint
    4 of two processes, resumed by one, reach step 8 with the losses of the uninterrupted one-process run."""
    root, flags, _ = bert_runs
    one_to_two, two_to_one = root / "one_cut", root / "two_cut"
    resumed = finish(start(BERT, one_to_two, flags, 2), start(BERT, two_to_one, flags, 1))
    for workdir, procs in zip((one_to_two, two_to_one), resumed):
        assert f"Resumed from {workdir}/checkpoints/{CUT}" in procs[0].stdout
        assert_same_losses(root / "reference", workdir, list(range(1, 9)))
        assert saved_steps(workdir) == [4, 8]


def t5_overrides(corpus: str, spm_model: str) -> list[str]:
    values = {"data.path": corpus, "tokenizer.path": spm_model, "model.vocab_size": 1152, "model.d_model": 32,
              "model.num_heads": 2, "model.head_dim": 16, "model.d_ff": 64, "model.num_encoder_layers": 1,
              "model.num_decoder_layers": 1, "data.max_seq_length": 32, "batch_size": 8, "num_train_steps": 4,
              "log_every": 1, "checkpoint_every": 4, "eval_every": 0, "data.eval_documents": 4, "eval_batches": 1}
    return [f"--config.{k}={v}" for k, v in values.items()]


def gpt_overrides() -> list[str]:
    values = {"data.path": SHAKESPEARE, "tokenizer.path": SHAKESPEARE, "model.num_layers": 1, "model.d_model": 32,
              "model.num_heads": 2, "model.d_ff": 64, "data.max_seq_length": 32, "batch_size": 8,
              "num_train_steps": 4, "log_every": 1, "checkpoint_every": 4, "eval_every": 0, "eval_batches": 1}
    return [f"--config.{k}={v}" for k, v in values.items()]


@pytest.mark.parametrize("family", ["t5", "gpt"])
def test_t5_and_gpt_two_processes_match_one(tmp_path, corpus_and_tokenizer, family):
    config, flags = {"t5": ("configs/t5.py:size=tiny", t5_overrides(*corpus_and_tokenizer)),
                     "gpt": ("configs/gpt2.py:size=nano_shakespeare_char_cpu", gpt_overrides())}[family]
    one, two = tmp_path / "one", tmp_path / "two"
    _, procs = finish(start(config, one, flags, 1), start(config, two, flags, 2))
    assert_only_process_0_speaks(procs)
    assert_same_losses(one, two, [1, 2, 3, 4])
    assert saved_steps(two) == [4]


# ---------------------------------------------------------------------------------------------
# One-line errors.
# ---------------------------------------------------------------------------------------------
def run_alone(args: list[str], workdir, timeout: int = 300) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "pretrain.train", "--config=configs/bert.py:size=tiny", f"--workdir={workdir}",
           *args]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True, timeout=timeout, check=False)
    return proc, time.perf_counter() - started


def one_line(proc) -> str:
    """The one `error: ...` line of a failed command (a progress bar may share stderr with it)."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line[line.index("error: "):] for line in proc.stderr.splitlines() if "error: " in line]
    assert len(errors) == 1, proc.stderr[-2000:]
    return errors[0]


@pytest.mark.parametrize("flags, expected", [  # every rule: tests/pretrain/runtime/test_distributed.py, in-process
    (["--num_processes=2"], "--num_processes also needs --coordinator_address and --process_id"),
    (["--coordinator_address=127.0.0.1:1234", "--num_processes=2", "--process_id=2"],
     "--process_id=2 must be below --num_processes=2"),
])
def test_inconsistent_flags_are_one_line_errors(tmp_path, corpus_and_tokenizer, flags, expected):
    proc, _ = run_alone(tiny_overrides(*corpus_and_tokenizer) + flags, tmp_path / "w")
    assert expected in one_line(proc)
    assert not (tmp_path / "w").exists()  # nothing started


@pytest.mark.parametrize("process_id, expected", [
    (1, "process 1 of 2: no answer from the coordinator at 127.0.0.1:"),
    (0, "process 0 of 2 at 127.0.0.1:"),  # the coordinator itself, waiting for process 1
])
def test_a_coordinator_that_never_answers_is_one_line_after_the_timeout(tmp_path, corpus_and_tokenizer,
                                                                         process_id, expected):
    timeout = 3
    proc, elapsed = run_alone(tiny_overrides(*corpus_and_tokenizer) + [
        f"--coordinator_address=127.0.0.1:{free_port()}", "--num_processes=2", f"--process_id={process_id}",
        f"--initialization_timeout={timeout}"], tmp_path / "w", timeout=120)
    message = one_line(proc)
    assert expected in message and f"--initialization_timeout={timeout} s" in message
    assert timeout <= elapsed < timeout + 30  # Python and JAX start-up is the margin; JAX alone waits 30 s more


@pytest.mark.parametrize("batch_size, expected", [
    (7, "config.batch_size=7 is not divisible by the number of processes (2)"),  # the data pipeline
    (6, ("a batch of 3 rows per process per micro-batch does not split over the 4 batch shards of this "
         "process's devices")),
])
def test_a_batch_that_does_not_split_over_processes_or_devices_is_one_line(tmp_path, corpus_and_tokenizer,
                                                                           batch_size, expected):
    flags = tiny_overrides(*corpus_and_tokenizer, batch_size=batch_size)
    for proc in start("configs/bert.py:size=tiny", tmp_path, flags, 2):
        _, err = proc.communicate(timeout=300)
        assert expected in one_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", err))
