"""pretrain/runtime/distributed.py in-process: the flag rules, the coordinator watchdog and who writes
(the real two-process runs are in tests/pretrain/commands/test_multihost.py)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pretrain.runtime import distributed
from pretrain.runtime.distributed import DistributedError, Setup, resolve
from pretrain.workdir.metric_writers import MetricWriter

ADDRESS = "10.0.0.2:8476"


@pytest.mark.parametrize("kwargs, expected", [
    ({}, None),                                                                    # no flags, no cluster
    ({"cluster_processes": 4}, Setup(None, None, None, 300)),                    # a TPU VM slice, SLURM, ...
    ({"cluster_processes": 1}, None),                                             # a one-host TPU VM
    ({"mode": "on"}, Setup(None, None, None, 300)),                              # JAX detects (or says why not)
    ({"mode": "off", "cluster_processes": 4}, None),
    ({"coordinator_address": ADDRESS, "num_processes": 4, "process_id": 3, "timeout": 10},
     Setup(ADDRESS, 4, 3, 10)),
    ({"num_processes": 1}, None),                                                 # one process: nothing to join
    ({"coordinator_address": ADDRESS, "num_processes": 1, "process_id": 0}, None),
    ({"mode": "off", "num_processes": 1}, None),
])
def test_flags_resolve(kwargs, expected):
    assert resolve(**{"cluster_processes": 0, **kwargs}) == expected


@pytest.mark.parametrize("kwargs, message", [
    ({"num_processes": 2}, "--num_processes also needs --coordinator_address and --process_id"),
    ({"coordinator_address": ADDRESS}, "--coordinator_address also needs --num_processes and --process_id"),
    ({"coordinator_address": ADDRESS, "num_processes": 2}, "also need --process_id"),
    ({"process_id": 1}, "--process_id also needs --coordinator_address and --num_processes"),
    ({"coordinator_address": ADDRESS, "num_processes": 2, "process_id": 2},
     "--process_id=2 must be below --num_processes=2 (processes are numbered 0..1)"),
    ({"coordinator_address": ADDRESS, "num_processes": 2, "process_id": -1}, "--process_id=-1 must be at least 0"),
    ({"num_processes": 0}, "--num_processes=0 must be at least 1"),
    ({"coordinator_address": "10.0.0.2", "num_processes": 2, "process_id": 0}, "must be HOST:PORT"),
    ({"coordinator_address": "10.0.0.2:http", "num_processes": 2, "process_id": 0}, "must be HOST:PORT"),
    ({"mode": "off", "num_processes": 2}, "--distributed=off contradicts --num_processes=2"),
    ({"timeout": 0}, "--initialization_timeout=0 must be a positive number of seconds"),
])
def test_inconsistent_flags_are_one_line_errors(kwargs, message):
    with pytest.raises(DistributedError) as e:
        resolve(**{"cluster_processes": 0, **kwargs})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_watchdog_turns_a_silent_coordinator_into_one_line(monkeypatch, capsys):
    """JAX blocks (then aborts with a C++ stack trace); the watchdog speaks first and exits 2."""
    exited, release = [], threading.Event()
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda *a, **kw: release.wait(10))
    monkeypatch.setattr(distributed.os, "_exit", lambda code: (exited.append(code), release.set()))
    started = time.perf_counter()
    distributed._initialize_with_watchdog(Setup("127.0.0.1:1", 2, 1, 1))
    assert exited == [2] and 1 <= time.perf_counter() - started < 5
    err = capsys.readouterr().err.strip()
    assert err == ("error: process 1 of 2: no answer from the coordinator at 127.0.0.1:1 within "
                   "--initialization_timeout=1 s; start process 0 there with the same --num_processes")


def test_a_coordinator_that_answers_stops_the_watchdog(monkeypatch):
    exited = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda *a, **kw: None)
    monkeypatch.setattr(distributed.os, "_exit", exited.append)
    distributed._initialize_with_watchdog(Setup("127.0.0.1:1", 2, 0, 1))
    time.sleep(1.5)
    assert exited == []


def test_only_process_0_writes_metrics(tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "is_primary", lambda: False)
    writer = MetricWriter(str(tmp_path))
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(distributed, "is_primary", lambda: True)
    writer = MetricWriter(str(tmp_path))
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 1.0}\n'


def test_shard_batch_of_one_process_is_a_device_put():
    from pretrain.runtime import partitioning
    mesh = partitioning.create_mesh((-1, 1, 1))
    rows = mesh.shape["data"] * 2
    batch = {"x": np.arange(rows * 3, dtype=np.int32).reshape(rows, 3)}
    for global_batch in (False, True):
        out = partitioning.shard_batch(batch, mesh, global_batch=global_batch)["x"]
        assert out.sharding == partitioning.batch_sharding(mesh)
        np.testing.assert_array_equal(np.asarray(out), batch["x"])
