"""User-facing errors: one line that names the thing and the fix, never a stack trace.

This is the boundary: models/ raise ModelInputError and objectives/ ObjectiveError (both plain
ValueErrors that know nothing of command lines), pretrain/ raises UserError and its subclasses;
`one_line_errors` around an entry point's work prints any of them as `error: <message>`. A run
stopped by a preemption notice is no error at all: it raises `Preempted` once its checkpoint is
complete, and the boundary prints that one line and exits EXIT_PREEMPTED.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

from models.errors import ModelInputError
from objectives.interface import ObjectiveError
from pretrain.runtime.stops import EXIT_PREEMPTED


class UserError(ValueError):
    """Raised for bad input a person can fix (config, files, corpus, checkpoints)."""
    exit_status = 2  # a usage error; a subclass about damaged files, not the command line, says 1


class ConfigError(UserError):
    """A config value that cannot work (one-line message naming the key and the fix)."""


# EXIT_PREEMPTED (75, EX_TEMPFAIL of sysexits.h: "try again later", pretrain/runtime/stops.py): the exit status of
# a run that saved a checkpoint on SIGTERM / SIGINT / a JAX preemption notice; the same command resumes it.
# EX_UNAVAILABLE: a service the run needs (the bucket of its workdir) stopped answering after the clients'
# retries. Not 75: a retry loop that reruns on 75 would spin against a bucket that is gone for good.
EXIT_UNAVAILABLE = 69


class Preempted(Exception):
    """Raised by a loop after its preemption checkpoint is completely written. Not a UserError: the
    person's input is fine, the machine was taken away."""

    def __init__(self, step: int, directory: str, reason: str = "preempted"):
        self.step, self.directory, self.reason = step, directory, reason
        super().__init__(f"{reason} at step {step}: checkpoint saved to {directory}/{step}; "
                         "run the same command to resume")


class StoppedBeforeFirstStep(BaseException):
    """Raised by the SIGTERM handler of a loop's set-up (reading data, building and compiling the model, restoring):
    there is nothing to save yet, so the run stops at once, as Ctrl-C does there, and `cli.run` prints this one
    line and exits EXIT_PREEMPTED. A BaseException, as KeyboardInterrupt, so that no `except Exception` of the
    set-up code (Orbax's restore, a fallback) takes it for a failure of its own."""

    def __init__(self, signal_name: str, directory: str, latest: int | None):
        self.signal_name, self.directory, self.latest = signal_name, directory, latest
        kept = (f"checkpoint {directory}/{latest} stays the latest; rerun the same command to resume"
                if latest is not None else "rerun the same command to start again")
        super().__init__(f"stopped by {signal_name} before the first step: nothing to save; {kept}")


class StoppedAfterLastStep(Exception):
    """Raised by the preemption watcher when a signal came after the last step and the run's final work (its
    checkpoint, last evaluation, results) was let to finish: the entry point prints this line and exits
    EXIT_PREEMPTED, and the same command finds the run complete."""

    def __init__(self, signal_name: str):
        self.signal_name = signal_name
        super().__init__(f"stopped by {signal_name} after the last step, once the run's final checkpoint and outputs "
                         "were written: nothing is lost; the same command finds the run complete")


# What an entry point prints as one line: the person's input is wrong, not the program.
USER_ERRORS = (UserError, ModelInputError, ObjectiveError)


@contextlib.contextmanager
def one_line_errors():
    """Turns USER_ERRORS and OSErrors into `error: <message>` and exit status 2, a storage service that
    stopped answering into one line and EXIT_UNAVAILABLE (69), and Preempted and StoppedAfterLastStep into their
    one line and exit status EXIT_PREEMPTED (75).

    Set LMPRETRAIN_TRACEBACK=1 to see a user error's traceback instead.
    """
    if not os.environ.get("LMPRETRAIN_TRACEBACK"):
        threading.excepthook = _background_os_error_in_one_line  # for the rest of the process: writers flush late
    try:
        yield
    except (Preempted, StoppedAfterLastStep) as e:
        print(e, file=sys.stderr, flush=True)
        sys.exit(EXIT_PREEMPTED)
    except USER_ERRORS as e:
        if os.environ.get("LMPRETRAIN_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(getattr(e, "exit_status", 2))
    except Exception as e:  # noqa: BLE001 - only the machine's and the storage's failures; the rest re-raised
        if os.environ.get("LMPRETRAIN_TRACEBACK"):
            raise
        if unreachable := storage_unreachable(e):
            print(f"error: the storage service stopped answering ({unreachable}); the run stopped and its latest "
                  "complete checkpoint is kept: rerun the same command to resume once it answers",
                  file=sys.stderr, flush=True)
            sys.exit(EXIT_UNAVAILABLE)
        if isinstance(e, OSError):  # a full disk, a permission, a file gone: the machine's state, not a bug
            print(f"error: {describe_os_error(e)}", file=sys.stderr)
            sys.exit(2)
        raise


def _background_os_error_in_one_line(args: threading.ExceptHookArgs) -> None:
    """A background thread's OSError as one warning line, not a traceback: a metrics writer's thread (tensorboardX
    flushes every few seconds) meets the full disk that the main thread's save reports in its own line."""
    if args.exc_type is not None and issubclass(args.exc_type, OSError):
        name = args.thread.name if args.thread is not None else "a background thread"
        print(f"warning: {name} stopped: {describe_os_error(args.exc_value)}", file=sys.stderr, flush=True)
        return
    threading.__excepthook__(args)


# What the GCS clients raise when the service does not answer (after their own retries): gcsfs (aiohttp),
# google-cloud-storage (requests, google.api_core), TensorStore (a ValueError whose text names the gRPC-style
# status). Matched by name so that none of those packages is imported here.
UNREACHABLE_TYPES = ("ClientConnectorError", "ServerDisconnectedError", "ConnectionError", "RetryError",
                     "ServiceUnavailable", "ConnectionRefusedError", "ConnectionResetError", "TimeoutError")
UNREACHABLE_TEXT = ("UNAVAILABLE:", "DEADLINE_EXCEEDED:", "Connection refused", "Connect call failed")


def exception_chain(error: BaseException | None) -> Iterator[BaseException]:
    """`error`, then what it wraps: its causes and contexts and, for an exception group, its members (an Orbax
    save wraps the client's error in its own), each once."""
    todo, seen = [error], set()
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend([e.__cause__, e.__context__, *getattr(e, "exceptions", ())])


def storage_unreachable(error: BaseException) -> str | None:
    """The first line of what says that the storage service stopped answering, anywhere in `error`'s chain;
    None for any other error."""
    for e in exception_chain(error):
        if type(e).__name__ in UNREACHABLE_TYPES or any(t in str(e) for t in UNREACHABLE_TEXT):
            return (str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)[:300]
    return None


def describe_os_error(e: OSError) -> str:
    """'No space left on device: /path (errno 28)', without the traceback."""
    where = ": ".join(str(f) for f in (e.filename, e.filename2) if f)
    lines = [line.strip() for line in (e.strerror or str(e)).splitlines() if line.strip()]
    what = lines[-1] if lines else type(e).__name__
    return f"{what}{': ' + where if where else ''} ({type(e).__name__}; check the path, its permissions and free disk)"
