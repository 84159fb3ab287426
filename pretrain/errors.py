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


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with one-line errors for a bad config file, argument or override key."""
    from absl import flags
    try:
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        if os.environ.get("LMPRETRAIN_TRACEBACK"):
            raise
        # config_flags embeds the config file's traceback; its last line is the actual error.
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        message = lines[-1] if lines else type(e).__name__
        if isinstance(e, AttributeError) or "has no attribute" in message or "Could not find" in message:
            name = message.strip("\"'")
            flag = next((a.split("=")[0] for a in argv if a.startswith("--config.")
                         and name in a.split("=")[0].split(".")), "--config.?")
            message = (f"unknown config key {flag} (no key {name!r} there; "
                       "the config file lists the keys it defines)")
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def run_app(main) -> int:
    """absl's app.run with one-line errors for flags and config; returns the exit status."""
    try:
        app.run(main, flags_parser=parse_flags)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    return 0
