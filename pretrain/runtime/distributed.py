"""Multi-host runs: the flags that join processes into one JAX system, and who writes what.

Each host runs the same command with its own --process_id; `initialize()`, first in the main() of
pretrain.train / finetune / evaluate, calls `jax.distributed.initialize` before any JAX computation.
Afterwards every process steps the same jitted program on its slice of the global batch; process 0
alone prints, shows the progress bar and writes metrics and result files (`is_primary`), while all
of them take part in Orbax saves. --distributed:

  auto (default)  flags given -> those; none -> JAX's own cluster detection (a Cloud TPU VM slice, SLURM,
                  Open MPI) and, if it finds several processes, jax.distributed.initialize() with no
                  arguments; otherwise one process, no call
  on              always call it (no flags: JAX detects the cluster, Kubernetes included, or says why not)
  off             never (one process)

A coordinator that never answers would make JAX abort the process with a C++ stack trace after its
time-out; a watchdog turns it into one line and exit status 2 at --initialization_timeout instead.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import NamedTuple

import jax
from absl import flags

from pretrain.runtime.errors import UserError

_DISTRIBUTED = flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                                 "Join other processes with jax.distributed.initialize: auto (when the flags "
                                 "below or a detected cluster such as a Cloud TPU VM say so), on, off.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "HOST:PORT of process 0, the same on every process (multi-host runs).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (hosts) of the run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in 0..num_processes-1.")
_TIMEOUT = flags.DEFINE_integer("initialization_timeout", 300,
                                "Seconds to wait for the coordinator and the other processes.")

# JAX's own deadline comes this much later than ours, so that the watchdog always speaks first.
_JAX_GRACE_SECONDS = 30


class DistributedError(UserError):
    """Processes that cannot join (inconsistent flags, no coordinator, no cluster)."""


class Setup(NamedTuple):
    """What to pass to jax.distributed.initialize; None fields: JAX detects them."""
    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    timeout: int


def resolve(mode: str = "auto", coordinator_address: str | None = None, num_processes: int | None = None,
            process_id: int | None = None, timeout: int = 300, cluster_processes: int | None = None
            ) -> Setup | None:
    """The flags -> a Setup to initialize with, or None for a single process; DistributedError if they
    contradict each other. `cluster_processes` (tests) replaces looking at the environment."""
    if timeout <= 0:
        raise DistributedError(f"--initialization_timeout={timeout} must be a positive number of seconds")
    explicit = {"--coordinator_address": coordinator_address, "--num_processes": num_processes,
                "--process_id": process_id}
    given = [name for name, value in explicit.items() if value is not None]
    if num_processes is not None and num_processes < 1:
        raise DistributedError(f"--num_processes={num_processes} must be at least 1")
    if process_id is not None and process_id < 0:
        raise DistributedError(f"--process_id={process_id} must be at least 0")
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise DistributedError(f"--process_id={process_id} must be below --num_processes={num_processes} "
                               f"(processes are numbered 0..{num_processes - 1})")
    if mode == "off":
        if num_processes is not None and num_processes > 1:
            raise DistributedError(f"--distributed=off contradicts --num_processes={num_processes}")
        return None
    if given and (num_processes is None or num_processes > 1 or mode == "on"):
        missing = [name for name, value in explicit.items() if value is None]
        if missing:
            raise DistributedError(f"{' and '.join(given)} also need{'s' if len(given) == 1 else ''} "
                                   f"{' and '.join(missing)} (the same --coordinator_address and "
                                   "--num_processes on every process, each its own --process_id)")
        _check_address(coordinator_address)
        return Setup(coordinator_address, num_processes, process_id, timeout)
    if num_processes == 1 and mode == "auto":
        return None  # one process named explicitly: nothing to join
    if mode == "on" or (cluster_processes if cluster_processes is not None else _cluster_processes()) > 1:
        return Setup(None, None, None, timeout)
    return None


def _check_address(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DistributedError(f"--coordinator_address={address} must be HOST:PORT, e.g. 10.0.0.2:8476 "
                               "(process 0's host and a free port)")


# Left to --distributed=on: a Kubernetes pod is not necessarily one of several (and detecting it calls
# the cluster's API); mpi4py is opt-in in JAX too.
_NOT_AUTO = ("K8sCluster",)


def _cluster_processes() -> int:
    """How many processes jax.distributed.initialize() without arguments would join: those of a Cloud TPU
    VM slice (GCE or GKE), a SLURM job or an Open MPI run; 0 outside any. JAX's own detection, which
    lives in a private module: its absence, or a detector that fails, means no cluster."""
    try:
        from jax._src.clusters import ClusterEnv
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for env in ClusterEnv._cluster_types:
                if not env.opt_in_only_method and env.__name__ not in _NOT_AUTO and env.is_env_present():
                    return int(env.get_process_count())
    except Exception:  # noqa: BLE001
        return 0
    return 0


def initialize() -> None:
    """From the flags: join the other processes (or do nothing for a single process)."""
    setup = resolve(_DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                    _TIMEOUT.value)
    if setup is None:
        return
    # Cross-process collectives on CPU (the tests, CPU clusters); GPUs and TPUs ignore the setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    _initialize_with_watchdog(setup)
    if is_primary():
        count = jax.process_count()
        print(f"Distributed: {count} process{'es' if count > 1 else ''}, {jax.device_count()} devices "
              f"({jax.local_device_count()} per process)" +
              (f", coordinator {setup.coordinator_address}" if setup.coordinator_address else ""), flush=True)
    else:
        # Process 0 speaks for the run: the others' stdout (prints of the loops and entry points, and
        # of C++ libraries such as gloo) goes nowhere. Their errors still reach stderr.
        sys.stdout.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _initialize_with_watchdog(setup: Setup) -> None:
    joined = threading.Event()

    def watchdog():
        if not joined.wait(setup.timeout):
            print(f"error: {_timeout_message(setup)}", file=sys.stderr, flush=True)
            os._exit(2)  # JAX would abort with a stack trace; the main thread is blocked inside it

    threading.Thread(target=watchdog, name="distributed-init-watchdog", daemon=True).start()
    try:
        jax.distributed.initialize(setup.coordinator_address, setup.num_processes, setup.process_id,
                                   initialization_timeout=setup.timeout + _JAX_GRACE_SECONDS)
    except (ValueError, TypeError, RuntimeError) as e:  # e.g. --distributed=on and no cluster found
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        what = "found no cluster to join" if setup.coordinator_address is None else "failed"
        raise DistributedError(f"jax.distributed.initialize {what} ({first}): give --coordinator_address, "
                               "--num_processes and --process_id, or --distributed=off") from None
    finally:
        joined.set()


def _timeout_message(setup: Setup) -> str:
    wait = f"within --initialization_timeout={setup.timeout} s"
    if setup.coordinator_address is None:
        return f"the processes of the detected cluster did not all join {wait}"
    if setup.process_id == 0:
        return (f"process 0 of {setup.num_processes} at {setup.coordinator_address}: the other processes did "
                f"not all join {wait}; start each with the same --coordinator_address and --num_processes")
    return (f"process {setup.process_id} of {setup.num_processes}: no answer from the coordinator at "
            f"{setup.coordinator_address} {wait}; start process 0 there with the same --num_processes")


def is_primary() -> bool:
    """Process 0 writes metrics, results and predictions and prints; True for a single process."""
    return jax.process_index() == 0

