"""Shared fixtures: a small offline corpus + SentencePiece model and finished tiny runs that several test files
read (trained once per session); the suite's XLA level; the `tpu` and `long` marks' bookkeeping; the order in
which pytest-xdist's workers take the files. What test files import (paths, the real commands, ...) is in
tests/helpers/, never here."""
from __future__ import annotations

import collections
import hashlib
import importlib.util
import os
import pathlib
import signal

import pytest

from tests.helpers.commands import USER_XLA_FLAGS_ENV, run_train
from tests.helpers.paths import SHARED_DATA
from tests.helpers.tiny_bert import tiny_overrides

# `--progress-every=SECONDS` (make test): a readable progress line beside the dots (tests/helpers/progress.py).
pytest_plugins = ["tests.helpers.progress", "pytester"]  # pytester: tests/test_progress_line.py

TPU_REASON = "libtpu is not installed: `make test-tpu` runs them in a venv of its own"
# Why a mark's tests can be deselected, said at the end of the run whenever they are (never silently).
DESELECTED_BECAUSE = {
    "tpu": TPU_REASON,
    "long": "minutes-long end-to-end runs, each covered by a faster test that `make test` runs; "
            "`make test-long` runs them",
}

# The suite's programs are tiny, so compiling them costs more than running them, and most of a compile is
# LLVM optimising the generated machine code: a 4-step tiny-BERT `pretrain.train` takes 16 CPU-s at XLA's
# backend optimisation level 0 and 30 at its default. So the suite (this process, its pytest-xdist workers
# and every command it starts, through tests/helpers/commands.py) compiles at level 0: the same HLO programs, slower
# machine code that may round a last bit differently (comparisons inside the suite see one level). Tests
# that run a real model for minutes are marked `xla_optimized` and run their commands at XLA's default;
# LMPRETRAIN_TEST_XLA_LEVEL=default runs the whole suite as users' jobs run.
XLA_LEVEL_ENV = "LMPRETRAIN_TEST_XLA_LEVEL"
# The flags before the suite added its own: pytest-xdist's workers inherit the controller's environment, in
# which XLA_FLAGS already has level 0, so the controller passes the user's flags on in an environment variable.
USER_XLA_FLAGS = os.environ.setdefault(USER_XLA_FLAGS_ENV, os.environ.get("XLA_FLAGS", ""))
if os.environ.get(XLA_LEVEL_ENV, "0") != "default":
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [
        USER_XLA_FLAGS, f"--xla_backend_optimization_level={int(os.environ.get(XLA_LEVEL_ENV, '0'))}"]))


@pytest.fixture(autouse=True)
def _xla_optimized(request, monkeypatch):
    """`xla_optimized` tests: their commands compile at XLA's default level (what the suite set aside)."""
    if request.node.get_closest_marker("xla_optimized"):
        monkeypatch.setenv("XLA_FLAGS", USER_XLA_FLAGS)


def pytest_collection_modifyitems(config, items):
    """Files with the most `slow` tests first (see _slow_files_first); tests marked `tpu` need libtpu (the
    `tpu` extra), which the main venv must not have (JAX would probe for a TPU at start-up): without it they
    are deselected, and said so at the end, never skipped."""
    _slow_files_first(items)
    if importlib.util.find_spec("libtpu") is not None:
        return
    deselected = [item for item in items if item.get_closest_marker("tpu")]
    if deselected:
        items[:] = [item for item in items if not item.get_closest_marker("tpu")]
        config.hook.pytest_deselected(items=deselected)


def pytest_deselected(items):
    """Counts the deselected tests of each DESELECTED_BECAUSE mark (by `-m` or by the hook above)."""
    for item in items:
        config = item.config
        counts = config.__dict__.setdefault("_deselected_by_mark", collections.Counter())
        counts.update(mark for mark in DESELECTED_BECAUSE if item.get_closest_marker(mark))
        if hasattr(config, "workeroutput"):  # a pytest-xdist worker: the controller prints the summary
            config.workeroutput["deselected_by_mark"] = dict(counts)


def _slow_files_first(items) -> None:
    """pytest-xdist (make test) hands whole files to its workers in collection order, the next file to the
    first worker free: the files with the longest tests (`xla_optimized`: minutes each) and then those with
    the most end-to-end tests start first, so that no worker is left alone with a long file at the end.
    Within a file the order stays as written (a stable sort)."""
    slow = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
    longest = {item.path for item in items if item.get_closest_marker("xla_optimized")}
    items.sort(key=lambda item: (item.path not in longest, -slow[item.path]))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller (make test runs one worker per core): every worker deselects the same tests."""
    counts = node.config.__dict__.setdefault("_deselected_by_mark", collections.Counter())
    for mark, count in getattr(node, "workeroutput", {}).get("deselected_by_mark", {}).items():
        counts[mark] = max(counts[mark], count)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for mark, count in sorted(getattr(config, "_deselected_by_mark", {}).items()):
        if count:
            terminalreporter.write_line(f"{count} test(s) marked {mark} deselected: {DESELECTED_BECAUSE[mark]}")


@pytest.fixture
def terminal_sigint():
    """Ctrl-C as in a terminal. A job started in the background (`make test &`, some CI runners) inherits SIGINT
    ignored, and so would the commands it starts; the watcher and the entry points rightly leave it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def corpus_and_tokenizer(tmp_path_factory) -> tuple[str, str]:
    """(corpus.txt, spm.model) built like `make demo` does, but smaller."""
    from pretrain.tools import train_tokenizer
    from pretrain.tools.build_corpus import build_corpus
    root = tmp_path_factory.mktemp("demo_assets")
    corpus = str(root / "corpus.txt")
    build_corpus(corpus, max_mb=0.5)
    model = train_tokenizer.train_sentencepiece(corpus, str(root / "spm"), vocab_size=1000)
    return corpus, model


def _digest(directory: str) -> str:
    digest = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(directory)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, directory).encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _read_only(directory: str):
    """Yields `directory`; at the session's end, fails if any test changed a file of it."""
    before = _digest(directory)
    yield directory
    assert _digest(directory) == before, f"a test wrote into the shared run {directory}: copy it first"


@pytest.fixture(scope="session")
def tiny_bert_workdir(corpus_and_tokenizer, tmp_path_factory):
    """A finished `pretrain.train` run of the tiny BERT (tiny_overrides: 6 steps, checkpoints 3 and 6), trained
    once for every test that starts from it or copies it. Read only (checked at the session's end)."""
    directory = str(tmp_path_factory.mktemp("tiny_bert") / "run")
    run_train(directory, tiny_overrides(*corpus_and_tokenizer))
    yield from _read_only(directory)


@pytest.fixture(scope="session")
def gcs_server():
    """A GCS-protocol server on loopback for the whole session (scripts/bench/gcs_server.py) with a bucket
    `gs://bucket`, and this process's environment pointing every GCS client at it, so that the commands the
    tests start find it as they would find the real service."""
    from scripts.bench.gcs_server import GcsServer
    server = GcsServer().start()
    server.create_bucket("bucket")
    saved = {key: os.environ.get(key) for key in server.environment}
    os.environ.update(server.environment)
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture
def through_proxy(gcs_server, monkeypatch):
    """This process's GCS clients talk to the session's server through a counting Proxy for this test."""
    import gcsfs
    from etils.epath import backend as epath_backend

    from scripts.bench.gcs_server import Proxy
    proxy = Proxy(gcs_server.url)
    for key, value in proxy.environment.items():
        monkeypatch.setenv(key, value)
    gcsfs.GCSFileSystem.clear_instance_cache()  # a cached filesystem keeps the address it was made with
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    yield proxy
    gcsfs.GCSFileSystem.clear_instance_cache()
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    proxy.stop()


@pytest.fixture
def gs_run(gcs_server, request) -> str:
    """gs://bucket/<this test's name>/run: a workdir of its own in the session's bucket."""
    return f"gs://bucket/{request.node.name}/run"


GPT_CHAR = "configs/gpt2.py:size=nano_shakespeare_char_cpu"


@pytest.fixture(scope="session")
def tiny_gpt_workdir(tmp_path_factory):
    """A finished `pretrain.train` run of a 1-layer char GPT on tinyshakespeare (10 steps, a 32-token context),
    trained once for every test that reads it. Read only (checked at the session's end)."""
    shakespeare = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")
    directory = str(tmp_path_factory.mktemp("tiny_gpt") / "run")
    run_train(directory, [
        "--config.num_train_steps=10", "--config.model.num_layers=1", "--config.model.d_model=32",
        "--config.model.num_heads=2", "--config.model.d_ff=64", "--config.model.n_positions=32",
        "--config.data.max_seq_length=32", "--config.eval_every=0", "--config.checkpoint_every=10",
        f"--config.data.path={shakespeare}", f"--config.tokenizer.path={shakespeare}"], config=GPT_CHAR)
    yield from _read_only(directory)


@pytest.fixture(scope="session")
def char_gpt_glue_workdir(tmp_path_factory):
    """A 30-step Shakespeare GPT (1 layer, the nano config's 64-character context) whose char vocabulary also
    holds SST-2's text and the few-shot prompt templates: the honest way to make GLUE readable for a
    character model (its training text is Shakespeare alone). For fine-tuning and few-shot tests. Read only."""
    from pretrain.tasks.glue import prompts
    shakespeare = os.path.join(SHARED_DATA, "tinyshakespeare", "input.txt")
    root = tmp_path_factory.mktemp("char_gpt_glue")
    parts = [pathlib.Path(shakespeare).read_text(encoding="utf-8")]
    for split in ("train", "dev"):
        with open(os.path.join(SHARED_DATA, "glue", "SST-2", f"{split}.tsv"), encoding="utf-8") as f:
            parts.append(f.read())
    parts += [prompts.instruction_text(f) for f in prompts.FORMATS.values()]
    vocabulary = root / "vocabulary.txt"
    vocabulary.write_text("".join(parts), encoding="utf-8")
    vocab_size = len(set(vocabulary.read_text(encoding="utf-8")))
    directory = str(root / "gpt")
    run_train(directory, [
        "--config.num_train_steps=30", "--config.model.num_layers=1", "--config.model.d_model=32",
        "--config.model.num_heads=2", "--config.model.d_ff=64", "--config.eval_every=0",
        "--config.checkpoint_every=30", f"--config.data.path={shakespeare}", f"--config.tokenizer.path={vocabulary}",
        f"--config.model.vocab_size={vocab_size}"], config=GPT_CHAR)
    yield from _read_only(directory)
