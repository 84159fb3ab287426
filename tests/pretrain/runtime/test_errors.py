"""The one-line boundary: errors of every layer print as `error: <message>` with exit status 2;
anything else (a bug) keeps its traceback."""
import os
import subprocess
import sys
import threading

import pytest

from models.errors import ModelInputError
from objectives.interface import ObjectiveError
from pretrain.data.tokenizers import MissingTokenError, TokenizerError
from pretrain.runtime import errors


@pytest.mark.parametrize("error", [
    errors.UserError("config.data.path is empty"),
    errors.ConfigError("config.batch_size=3 is not divisible"),
    ModelInputError("top_p=0 must be in (0, 1]"),
    ObjectiveError("config.objective.z_loss=-1 must be >= 0"),
    TokenizerError("sentencepiece model not found: x.model"),
    MissingTokenError("tokenizer t has no [MASK] piece"),
])
def test_user_errors_of_every_layer_are_one_line(error, capsys, monkeypatch):
    monkeypatch.delenv("LMPRETRAIN_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        with errors.one_line_errors():
            raise error
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: {error}\n"


def test_a_bug_is_not_hidden_as_a_user_error(monkeypatch):
    monkeypatch.delenv("LMPRETRAIN_TRACEBACK", raising=False)
    with pytest.raises(ValueError, match="a plain ValueError is a bug"):
        with errors.one_line_errors():
            raise ValueError("a plain ValueError is a bug")


def _in_a_thread(error: Exception) -> None:
    def run():
        raise error
    thread = threading.Thread(target=run, name="metrics writer")
    thread.start()
    thread.join()


def test_a_background_threads_os_error_is_one_warning_line_and_a_bug_keeps_its_traceback(capsys, monkeypatch):
    """A full disk meets the metrics writer's flushing thread as well as the main thread's save: one line each."""
    monkeypatch.delenv("LMPRETRAIN_TRACEBACK", raising=False)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # restored after the test
    with errors.one_line_errors():
        _in_a_thread(OSError(28, "No space left on device"))
        written = capsys.readouterr().err
        _in_a_thread(ValueError("a bug in a thread"))
        bug = capsys.readouterr().err
    assert written.startswith("warning: metrics writer stopped: No space left on device") and written.count("\n") == 1
    assert "Traceback" in bug and "a bug in a thread" in bug


def test_traceback_on_request(monkeypatch):
    monkeypatch.setenv("LMPRETRAIN_TRACEBACK", "1")
    with pytest.raises(ObjectiveError):
        with errors.one_line_errors():
            raise ObjectiveError("shown with its traceback")


def test_missing_token_is_a_lookup_error():
    """objectives.interface.eos_id_or_none catches LookupError without importing pretrain."""
    assert issubclass(MissingTokenError, LookupError) and issubclass(MissingTokenError, errors.UserError)


def chained(outer: Exception, cause: Exception) -> Exception:
    """`outer` raised from `cause`, as a library wraps a client's error."""
    try:
        try:
            raise cause
        except Exception as e:
            raise outer from e
    except Exception as e:
        return e


class ClientConnectorError(Exception):
    """aiohttp's name for a connection that could not be made (matched by name: aiohttp is not imported)."""


@pytest.mark.parametrize("error", [
    chained(RuntimeError("Save Finalize thread failed"), ClientConnectorError("Cannot connect to host 127.0.0.1:1")),
    ValueError("UNAVAILABLE: HTTP request failed (tensorstore)"),
    ConnectionRefusedError(111, "Connection refused"),
])
def test_a_storage_service_that_stopped_answering_is_one_line_and_status_69(error, capsys, monkeypatch):
    monkeypatch.delenv("LMPRETRAIN_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        with errors.one_line_errors():
            raise error
    assert exit_info.value.code == errors.EXIT_UNAVAILABLE == 69
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the storage service stopped answering (")
    assert "rerun the same command to resume" in err


def test_other_errors_are_not_taken_for_an_unreachable_storage():
    assert errors.storage_unreachable(ValueError("NOT_FOUND: no such object")) is None
    assert errors.storage_unreachable(chained(RuntimeError("x"), KeyError("y"))) is None


def test_library_log_records_keep_one_line_without_their_traceback():
    import logging

    from pretrain.runtime import cli
    try:
        raise ClientConnectorError("Cannot connect to host 127.0.0.1:1\nsecond line")
    except ClientConnectorError:
        record = logging.getLogger("gcsfs").makeRecord("gcsfs", logging.ERROR, "retry.py", 185,
                                                       "_request out of retries on %s", ("exception",),
                                                       sys.exc_info())
    assert cli._without_traceback(record)
    line = logging.Formatter().format(record)
    assert line == "_request out of retries on exception [ClientConnectorError: Cannot connect to host 127.0.0.1:1]"
