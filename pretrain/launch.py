"""TPU VM launcher: create a Cloud TPU VM, run one command on all of its workers, follow it, delete it.

  python -m pretrain.launch create --name=bert-v4 --zone=us-central2-b --accelerator_type=v4-32 --spot
  python -m pretrain.launch run --name=bert-v4 --zone=us-central2-b -- \\
      python3 -m pretrain.train --config=configs/bert.py:size=base --workdir=/gcs/BUCKET/bert-base
  python -m pretrain.launch status --name=bert-v4 --zone=us-central2-b --queued
  python -m pretrain.launch logs --name=bert-v4
  python -m pretrain.launch delete --name=bert-v4 --zone=us-central2-b --queued

Every subcommand is a few gcloud commands; --dry_run prints them (ready to paste) and runs nothing.
`run` ships the git working tree (or --revision), installs it with its `tpu` extra on every worker,
starts the command after `--` on all workers at once (JAX joins them into one system by itself),
streams worker 0's output, keeps each worker's output in launch_logs/NAME/RUN_ID/worker-<i>.log and
exits with the job's status: 0, or the first failing worker's. Ctrl-C asks the job to stop (SIGTERM:
a checkpoint, exit status 75; the same `run` resumes it).
"""
from __future__ import annotations

from pretrain.runtime import stops

if __name__ == "__main__":  # first, before the imports below: from here on SIGTERM is one line and exit 75
    stops.answer_from_start(ctrl_c=False)  # Ctrl-C stays KeyboardInterrupt, which stops the job on the workers

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from pretrain.jobs import remote_job, run_logs, shipping, tpu_vm
from pretrain.runtime import children, errors
from pretrain.runtime.cli import (
    EXIT_INTERRUPTED,  # 128 + SIGINT, as the other entry points
)

GCLOUD_MISSING = ("gcloud not found on PATH: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install) "
                  "or use --dry_run")
_ENV = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, `error: ...`, and exit status 2, like the other entry points."""

    def error(self, message):
        print(f"error: {message} ({self.prog} --help lists the flags)", file=sys.stderr)
        sys.exit(2)


def _flag(parser, name: str, **kwargs):
    """--some_flag, as the project's entry points spell flags, also accepted as gcloud's --some-flag."""
    spellings = [name] + ([name.replace("_", "-")] if "_" in name else [])
    return parser.add_argument(*spellings, **kwargs)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m pretrain.launch", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    subcommands = parser.add_subparsers(dest="subcommand", metavar="{create,run,status,logs,stop,delete}")

    def subcommand(name: str, help: str, **kwargs) -> OneLineParser:
        sub = subcommands.add_parser(name, help=help, description=help, **kwargs)
        _flag(sub, "--name", required=True, help="The TPU VM (and queued resource) name, e.g. bert-v4-32.")
        _flag(sub, "--zone", help="Its zone, e.g. us-central2-b (default: gcloud's compute/zone).")
        _flag(sub, "--project", help="Its Google Cloud project (default: gcloud's core/project).")
        _flag(sub, "--dry_run", action="store_true", help="Print the gcloud commands, ready to paste; run nothing.")
        return sub

    create = subcommand("create", "Create a TPU VM, or a queued resource whose node has the same name.")
    _flag(create, "--accelerator_type", required=True, help="e.g. v4-32, v5litepod-16, v5p-8, v6e-8.")
    _flag(create, "--runtime_version", help="TPU software version (default by generation: "
          "tpu-ubuntu2204-base for v2-v4, v2-alpha-tpuv5-lite for v5e, v2-alpha-tpuv5 for v5p, v2-alpha-tpuv6e "
          "for v6e).")
    tier = create.add_mutually_exclusive_group()
    for name, what in (("spot", "spot capacity (cheaper, preemptible)"),
                       ("best-effort", "the best-effort tier (gcloud alpha)"),
                       ("reserved", "the project's reservation")):
        _flag(tier, "--" + name.replace("-", "_"), dest="provisioning", action="store_const", const=name,
              help=f"A queued resource on {what}.")
    _flag(create, "--queued", action="store_true", help="A queued resource even without --spot/--best_effort/"
          "--reserved: waits in Cloud TPU's queue instead of failing when the zone has no capacity.")

    run = subcommand("run", "Ship the code, install it, run the command after -- on every worker, follow it.",
                     usage="python -m pretrain.launch run --name=NAME [--zone=ZONE] [flags] -- COMMAND [ARGS...]",
                     epilog="COMMAND runs as given on every worker, in the shipped code's folder, e.g. -- python3 -m "
                     "pretrain.train --config=configs/bert.py:size=base --workdir=/gcs/BUCKET/bert-base (python3: "
                     "Ubuntu's TPU VM images may have no `python`; a gs:// workdir: every worker must see the "
                     "checkpoints). "
                     "gcloud reaches several workers at once only with your key in ssh-agent: "
                     "ssh-add ~/.ssh/google_compute_engine.")
    _flag(run, "--revision", help="Ship this git revision (git archive) instead of the working tree.")
    _flag(run, "--env", action="append", default=[], metavar="KEY=VALUE", help="Set in the job's environment "
          "on every worker (repeatable).")
    _flag(run, "--workers", type=int, help="Hosts of the TPU VM (default: asked of gcloud, tpu-vm describe).")
    _flag(run, "--retries", type=int, default=3, help="Retries, with backoff (10 s, 20 s, 40 s, ...), of a "
          "step or a worker that gcloud cannot reach (exit status 255); a command's own failure is never retried.")
    _flag(run, "--log_dir", default="launch_logs", help="Local folder of the runs' logs: LOG_DIR/NAME/RUN_ID/.")
    _flag(run, "--run_id", help="Names this run's log folder (default: the start time, YYYYmmdd-HHMMSS).")

    status = subcommand("status", "Describe the TPU VM (state, health, workers) or, with --queued, the queued "
                        "resource (WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE, ...).")
    _flag(status, "--queued", action="store_true", help="Describe the queued resource.")

    logs = subcommand("logs", "Where the workers' logs of a run are, how each worker ended, and the last lines "
                      "of one worker's log (all local: `run` writes them while the job runs).")
    _flag(logs, "--log_dir", default="launch_logs", help="As given to run.")
    _flag(logs, "--run_id", help="The run (default: the last one launched on this TPU from here).")
    _flag(logs, "--worker", type=int, default=0, help="Whose log to show the end of.")
    _flag(logs, "--lines", type=int, default=20, help="How many of its last lines to show.")

    subcommand("stop", "Stop a single-host TPU VM (kept, its chips not billed); a slice of several hosts "
               "cannot be stopped, only deleted.")
    delete = subcommand("delete", "Delete the TPU VM, without asking (gcloud --quiet). With --queued, delete the "
                        "queued resource with --force, which deletes its TPU VM too.")
    _flag(delete, "--queued", action="store_true", help="Delete the queued resource and its node.")
    return parser


# -----------------------------------------------------------------------------------------------------
# The subcommands: (args, the command after --, sleep) -> exit status.
# -----------------------------------------------------------------------------------------------------
def create(args, command, sleep) -> int:
    target = _target(args)
    tpu_vm.check_accelerator_type(args.accelerator_type)
    runtime_version = args.runtime_version or tpu_vm.default_runtime_version(args.accelerator_type)
    if not (args.queued or args.provisioning):
        return _execute(args, tpu_vm.create_vm(target, args.accelerator_type, runtime_version))
    status = _execute(args, tpu_vm.create_queued(target, args.accelerator_type, runtime_version, args.provisioning))
    if status == 0 and not args.dry_run:
        remote_job.say(f"queued: the TPU VM {target.name} exists once the queued resource is ACTIVE "
                       f"(python -m pretrain.launch status --name={target.name} --queued)")
    return status


def run(args, command, sleep) -> int:
    target = _target(args)
    if not command:
        raise errors.UserError("run needs the command to start on every worker after --, e.g. run --name=NAME -- "
                               "python3 -m pretrain.train --config=configs/bert.py:size=base --workdir=gs://BUCKET/run")
    if (args.workers is not None and args.workers < 1) or args.retries < 0:
        raise errors.UserError("--workers must be at least 1 and --retries at least 0")
    plan = remote_job.plan_run(target, command, env=dict(_parse_env(item) for item in args.env),
                               source=shipping.find_source(os.getcwd(), args.revision),
                               log_dir=run_logs.run_dir(args.log_dir, target.name, args.run_id))
    if args.dry_run:
        print("\n".join(remote_job.dry_run_lines(plan, args.workers)))
        return 0
    _require_gcloud()
    workers = args.workers or remote_job.count_workers(target)
    return remote_job.execute(plan, workers, args.retries, sleep, exclude=(args.log_dir,))


def status(args, command, sleep) -> int:
    return _execute(args, tpu_vm.describe(_target(args), queued=args.queued))


def logs(args, command, sleep) -> int:
    name = tpu_vm.check_name(args.name)
    log_dir = run_logs.run_dir(args.log_dir, name, args.run_id) if args.run_id else run_logs.latest(args.log_dir, name)
    if not log_dir or not os.path.isdir(log_dir):
        raise errors.UserError(f"no run{' ' + args.run_id if args.run_id else ''} of {name} under {args.log_dir}/ "
                               f"(python -m pretrain.launch run --name={name} ... writes its logs there)")
    print(run_logs.report(log_dir, args.worker, args.lines))
    return 0


def stop(args, command, sleep) -> int:
    return _execute(args, tpu_vm.stop(_target(args)))


def delete(args, command, sleep) -> int:
    return _execute(args, tpu_vm.delete(_target(args), queued=args.queued))


COMMANDS = {"create": create, "run": run, "status": status, "logs": logs, "stop": stop, "delete": delete}


def _target(args) -> tpu_vm.Target:
    return tpu_vm.Target(tpu_vm.check_name(args.name), tpu_vm.check_zone(args.zone), args.project)


def _parse_env(item: str) -> tuple[str, str]:
    match = _ENV.fullmatch(item)
    if not match:
        raise errors.UserError(f"--env={item!r} is not KEY=VALUE (e.g. --env=JAX_TRACEBACK_FILTERING=off)")
    return match.group(1), match.group(2)


def _require_gcloud() -> None:
    if shutil.which("gcloud") is None:
        raise errors.UserError(GCLOUD_MISSING)


def _execute(args, argv: list[str]) -> int:
    """Prints the command (--dry_run) or runs it in the foreground; -> its exit status."""
    if args.dry_run:
        print(shlex.join(argv))
        return 0
    _require_gcloud()
    return subprocess.run(argv, **children.popen_options()).returncode


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """-> (the launcher's arguments, the command after the first --)."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def main(argv: list[str] | None = None, sleep=time.sleep) -> int:
    """The entry point; `sleep` (the retries' backoff) is there for tests. -> the exit status."""
    own, command = _split_command(list(sys.argv[1:] if argv is None else argv))
    try:
        with errors.one_line_errors():
            args = build_parser().parse_args(own)
            if args.subcommand is None:
                raise errors.UserError("give a subcommand: create, run, status, logs, stop or delete "
                                       "(python -m pretrain.launch --help)")
            if command and args.subcommand != "run":
                raise errors.UserError(f"{args.subcommand} takes no command after -- (only run does)")
            return COMMANDS[args.subcommand](args, command, sleep)
    except SystemExit as e:  # argparse (--help, a usage error) and one_line_errors: main returns, tests call it
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
