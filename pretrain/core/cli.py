"""The one command-line style of the six entry points (pretrain.train, finetune, evaluate, generate,
perplexity, fewshot): absl flags defined at module level as FlagHolders, `main(argv)` that starts
with `begin(argv)` and runs its work inside `errors.one_line_errors()`, and

    if __name__ == "__main__":
        sys.exit(cli.run(main))

which turns a bad flag, config file or override key into one line and an exit status. The commands
that can span several hosts (train, finetune, evaluate) call `distributed.initialize()` first inside
`one_line_errors()`, before any JAX computation.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags, logging


def begin(argv: list[str]) -> None:
    """First line of every main(): no positional arguments, and Orbax's per-save INFO logs off."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with one-line errors for a bad config file, argument or override key."""
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


def run(main) -> int:
    """absl's app.run with one-line errors for flags and config; returns the exit status."""
    try:
        app.run(main, flags_parser=parse_flags)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    return 0
