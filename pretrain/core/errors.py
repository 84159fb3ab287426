"""User-facing errors: one line that names the thing and the fix, never a stack trace.

This is the boundary: models/ raise ModelInputError and objectives/ ObjectiveError (both plain
ValueErrors that know nothing of command lines), pretrain/ raises UserError and its subclasses;
`one_line_errors` around an entry point's work prints any of them as `error: <message>`.
"""
from __future__ import annotations

import contextlib
import os
import sys

from models.errors import ModelInputError
from objectives.interface import ObjectiveError


class UserError(ValueError):
    """Raised for bad input a person can fix (config, files, corpus, checkpoints)."""


class ConfigError(UserError):
    """A config value that cannot work (one-line message naming the key and the fix)."""


# What an entry point prints as one line: the person's input is wrong, not the program.
USER_ERRORS = (UserError, ModelInputError, ObjectiveError)


@contextlib.contextmanager
def one_line_errors():
    """Turns USER_ERRORS into `error: <message>` and exit status 2.

    Set LMPRETRAIN_TRACEBACK=1 to see the traceback instead.
    """
    try:
        yield
    except USER_ERRORS as e:
        if os.environ.get("LMPRETRAIN_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
