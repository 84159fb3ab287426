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

import logging as std_logging
import os
import sys

from absl import app, flags, logging

from pretrain.runtime import compilation_cache, errors
from pretrain.runtime.stops import EXIT_INTERRUPTED, INTERRUPTED_LINE, exit_now


def begin(argv: list[str]) -> None:
    """First line of every main(): no positional arguments, Orbax's per-save INFO logs off, and JAX's
    persistent compilation cache on (pretrain/runtime/compilation_cache.py)."""
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}: every option is a --flag=value (--help lists them)",
              file=sys.stderr)
        sys.exit(2)
    logging.set_verbosity(logging.WARNING)
    if not os.environ.get("LMPRETRAIN_TRACEBACK"):
        for handler in std_logging.getLogger().handlers:  # absl's, installed by app.run
            handler.addFilter(_without_traceback)
    compilation_cache.enable()


def _without_traceback(record: std_logging.LogRecord) -> bool:
    """Libraries' log records keep their one line and lose their traceback: a storage client that retries
    logs one per failed try (gcsfs, Orbax's save thread), pages of them while a bucket is unreachable,
    before the command stops with its own one-line error. LMPRETRAIN_TRACEBACK=1 keeps them."""
    if record.exc_info or record.exc_text:
        record.msg = f"{record.getMessage()} [{_exception_line(record.exc_info)}]"
        record.args, record.exc_info, record.exc_text = None, None, None
    return True


def _exception_line(exc_info) -> str:
    error = exc_info[1] if exc_info and exc_info is not True else None
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}" if error else "error"


HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def print_help(argv: list[str]) -> None:
    """The entry point's docstring, its flags, and for the commands with a config: how to see every key."""
    main = sys.modules["__main__"]
    print((main.__doc__ or "").strip() + "\n")
    for module in flags.FLAGS.flags_by_module_dict():  # this command's flags (absl's own left out)
        if not module.startswith("absl."):
            print(flags.FLAGS.module_help(module))
    if "config" in flags.FLAGS:
        print("\nConfig keys: every key of the --config file can be set with --config.KEY=VALUE (e.g."
              " --config.batch_size=64). --print_config prints the resolved config, every key with its value, and"
              " exits:\n  python -m " + _module_name(main) + " --config=FILE[:ARGS] --print_config")
        given = [arg for arg in argv if arg not in HELP_FLAGS]
        if any(arg.startswith("--config=") for arg in given):  # --config=X --help: its keys, with values
            print("\nKeys of this config (--config.KEY=VALUE):")
            parse_flags(given)
            print(flags.FLAGS.config)


def _module_name(main) -> str:
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else os.path.basename(sys.argv[0])


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with one-line errors for a bad config file, argument or override key; --help exits 0."""
    if any(arg in HELP_FLAGS for arg in argv[1:]):
        print_help(argv)
        sys.exit(0)
    try:
        rest = flags.FLAGS(argv)
        if "config" in flags.FLAGS:
            flags.FLAGS["config"].value.keys()  # a file that failed to load raises on first use: here, in one line
        return rest
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
        if os.environ.get("LMPRETRAIN_TRACEBACK"):
            raise
        # config_flags embeds the config file's traceback; its last line is the actual error.
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        message = lines[-1] if lines else type(e).__name__
        message = message.removeprefix("ValueError: ")
        if isinstance(e, OSError):  # config_flags's "Failed loading config file" + every path it tried
            message = f"--config: {message} (give a config file such as configs/bert.py:size=tiny)"
        if isinstance(e, AttributeError) or "has no attribute" in message or "Could not find" in message:
            name = message.strip("\"'")
            flag = next((a.split("=")[0] for a in argv if a.startswith("--config.")
                         and name in a.split("=")[0].split(".")), "--config.?")
            message = (f"unknown config key {flag} (no key {name!r} there; "
                       "the config file lists the keys it defines)")
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def define_config_flags(example: str, workdir_help: str):
    """--config, --workdir and --print_config of the commands that take a config file (train, finetune).
    -> (config, workdir, print_config) FlagHolders. --workdir is checked by `require_workdir` instead of
    absl, so that --print_config needs none."""
    from ml_collections import config_flags
    return (config_flags.DEFINE_config_file("config", None, f"Config file, e.g. {example}.", lock_config=True),
            flags.DEFINE_string("workdir", None, workdir_help),
            flags.DEFINE_bool("print_config", False, "Print the resolved config (every key and value, as "
                              "WORKDIR/config.json will hold it) and exit; nothing is written."))


def model_flags() -> dict:
    """The --config.model.KEY=VALUE flags given on the command line, {KEY: VALUE}: a fine-tuning command applies
    them over the architecture its --config.init brings."""
    from ml_collections import config_flags
    given = config_flags.get_override_values(flags.FLAGS["config"])
    return {key.removeprefix("model."): value for key, value in given.items() if key.startswith("model.")}


def require_workdir(workdir) -> str:
    """The --workdir value, or one line and exit status 2 when it is missing."""
    if not workdir.value:
        print("error: --workdir is required (a new directory, or a run's workdir to resume it)", file=sys.stderr)
        sys.exit(2)
    return workdir.value


def run(main) -> int:
    """absl's app.run with one-line errors for flags and config; returns the exit status. Ctrl-C where the
    loop does not catch it (start-up, compilation, a second Ctrl-C) is one line and status 130; a SIGTERM
    during a loop's set-up (errors.StoppedBeforeFirstStep) one line and status 75, as a preemption."""
    sys.unraisablehook = _stop_on_an_ignored_stop(sys.unraisablehook)
    try:
        app.run(main, flags_parser=parse_flags)
    except KeyboardInterrupt:
        if os.environ.get("LMPRETRAIN_TRACEBACK"):
            raise
        exit_now(INTERRUPTED_LINE, EXIT_INTERRUPTED)
    except errors.StoppedBeforeFirstStep as e:
        exit_now(str(e), errors.EXIT_PREEMPTED)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    return 0


def _stop_on_an_ignored_stop(previous_hook):
    """sys.unraisablehook that stops the process on a Ctrl-C or a set-up SIGTERM which Python could not raise.
    A signal's exception raised while a GC callback or a __del__ runs (JAX's `_xla_gc_callback` is one) is
    printed as "Exception ignored" and dropped, and the run would go on as if no signal had come."""
    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and not os.environ.get("LMPRETRAIN_TRACEBACK"):
            exit_now(INTERRUPTED_LINE, EXIT_INTERRUPTED)
        if isinstance(unraisable.exc_value, errors.StoppedBeforeFirstStep):
            exit_now(str(unraisable.exc_value), errors.EXIT_PREEMPTED)
        previous_hook(unraisable)
    return hook
