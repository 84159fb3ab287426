"""User-facing errors: one line that names the thing and the fix, never a stack trace."""
from __future__ import annotations

import contextlib
import os
import sys

from absl import app


class UserError(ValueError):
    """Raised for bad input a person can fix (config, files, corpus, checkpoints)."""


@contextlib.contextmanager
def one_line_errors():
    """Turns UserError (and its subclasses) into `error: <message>` and exit status 2.

    Set LMPRETRAIN_TRACEBACK=1 to see the traceback instead.
    """
    try:
        yield
    except UserError as e:
        if os.environ.get("LMPRETRAIN_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def run_app(main) -> int:
    """absl's app.run, but a config file that fails to load also gets a one-line error."""
    try:
        app.run(main)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return 0
