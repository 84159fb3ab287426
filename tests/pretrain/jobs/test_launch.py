"""The TPU VM launcher (python -m pretrain.launch) against a fake `gcloud` first on PATH: a small Python
script that records every call (one JSON line of argv) and plays the workers. Its `tpu-vm scp` copies
into one home folder per worker, its `tpu-vm ssh` runs --command with bash in that folder, as a worker's
login shell would (a `python3` there only records pip installs), so that the shipped tarball, the
remote commands' quoting and the job's exit status are all exercised for real; plan.json makes chosen
calls fail instead (e.g. ssh exit 255, could not connect), once each.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

from pretrain import launch
from pretrain.jobs import remote_job, shipping, tpu_vm
from tests.helpers.paths import REPO

FAKE_GCLOUD = r'''
import fcntl, json, os, shutil, subprocess, sys

state, argv = os.environ["FAKE_GCLOUD_STATE"], sys.argv[1:]
with open(os.path.join(state, "calls.jsonl"), "a") as f:
    f.write(json.dumps(argv) + "\n")


def planned_failure():
    """The first rule of plan.json whose strings all occur in this call; each rule is used once."""
    with open(os.path.join(state, "plan.json"), "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # the workers' ssh calls run at once
        plan = json.load(f)
        for i, rule in enumerate(plan):
            if all(s in " ".join(argv) for s in rule["match"]):
                del plan[i]
                f.seek(0)
                f.truncate()
                json.dump(plan, f)
                return rule


def option(name):
    return next((a.split("=", 1)[1] for a in argv if a.startswith(name + "=")), None)


def homes(worker):
    for i in range(int(os.environ["FAKE_GCLOUD_WORKERS"])) if worker == "all" else [int(worker)]:
        os.makedirs(os.path.join(state, f"worker-{i}"), exist_ok=True)
        yield i, os.path.join(state, f"worker-{i}")


rule = planned_failure()
if rule:
    print(rule.get("output", ""), flush=True)
    sys.exit(rule["exit"])
if argv[:4] == ["compute", "tpus", "tpu-vm", "describe"] and option("--format") == "json":
    endpoints = [{"ipAddress": f"10.0.0.{i}"} for i in range(int(os.environ["FAKE_GCLOUD_WORKERS"]))]
    print(json.dumps({"state": os.environ.get("FAKE_GCLOUD_TPU_STATE", "READY"), "networkEndpoints": endpoints}))
elif argv[:4] == ["compute", "tpus", "tpu-vm", "scp"]:
    for _, home in homes(option("--worker")):
        shutil.copy(argv[4], os.path.join(home, argv[5].split(":", 1)[1]))
elif argv[:4] == ["compute", "tpus", "tpu-vm", "ssh"]:
    status = 0
    for i, home in homes(option("--worker")):
        env = dict(os.environ, HOME=home, FAKE_WORKER=str(i), PATH=os.environ["FAKE_REMOTE_PATH"])
        status = status or subprocess.run(["bash", "-c", option("--command")], cwd=home, env=env).returncode
    sys.exit(status)
'''

# On the fake workers, python3 is only ever `python3 -m pip install ...`: recorded, not run.
FAKE_PYTHON3 = '#!/bin/sh\necho "python3 $*" >> "$HOME/python3-calls.log"\n'

ZONE = "us-central2-b"


class FakeGcloud:
    def __init__(self, root, monkeypatch, workers=2):
        self.state = root / "gcloud-state"
        self.state.mkdir()
        (self.state / "plan.json").write_text("[]")
        bin_dir, remote_bin = root / "bin", root / "remote-bin"
        for path, text in ((bin_dir / "gcloud", f"#!{sys.executable} -S\n{FAKE_GCLOUD}"),
                           (remote_bin / "python3", FAKE_PYTHON3)):
            path.parent.mkdir()
            path.write_text(text)
            path.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_GCLOUD_STATE", str(self.state))
        monkeypatch.setenv("FAKE_GCLOUD_WORKERS", str(workers))
        monkeypatch.setenv("FAKE_REMOTE_PATH", f"{remote_bin}{os.pathsep}/usr/bin{os.pathsep}/bin")

    def fail(self, *rules):
        """Rules {"match": [strings of the call], "exit": status, "output": text}, each used once."""
        (self.state / "plan.json").write_text(json.dumps(list(rules)))

    def calls(self) -> list[list[str]]:
        path = self.state / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def worker(self, i):
        return self.state / f"worker-{i}"


@pytest.fixture
def gcloud(tmp_path, monkeypatch):
    return FakeGcloud(tmp_path, monkeypatch)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A checkout to ship, the current directory: a git repository made by hand (HEAD, objects/, refs/ are
    all git asks for), with a setup.py, an untracked module and a .gitignore'd folder."""
    root = tmp_path / "project"
    (root / ".git" / "objects").mkdir(parents=True)
    (root / ".git" / "refs").mkdir()
    for path, text in ((".git/HEAD", "ref: refs/heads/main\n"), ("setup.py", "from setuptools import setup\n"),
                       ("pkg/module.py", "VALUE = 1\n"), ("ignored/secret.txt", "not shipped\n"),
                       (".gitignore", "ignored/\n")):
        (root / path).parent.mkdir(exist_ok=True)
        (root / path).write_text(text)
    monkeypatch.chdir(root)
    return root


# create / status / stop / delete: one gcloud command each.
TPU = ["compute", "tpus"]


def test_create_a_tpu_vm(gcloud, capsys):
    assert launch.main(["create", "--name=bert-v4", f"--zone={ZONE}", "--accelerator_type=v4-8"]) == 0
    assert gcloud.calls() == [[*TPU, "tpu-vm", "create", "bert-v4", f"--zone={ZONE}", "--accelerator-type=v4-8",
                               "--version=tpu-ubuntu2204-base"]]


@pytest.mark.parametrize("flag, track, tier", [
    ("--spot", TPU, ["--spot"]),
    ("--best_effort", ["alpha", *TPU], ["--best-effort"]),  # an alpha flag of queued-resources create
    ("--best-effort", ["alpha", *TPU], ["--best-effort"]),  # gcloud's spelling works too
    ("--reserved", TPU, ["--reserved"]),
    ("--queued", TPU, []),
])
def test_create_a_queued_resource(gcloud, capsys, flag, track, tier):
    assert launch.main(["create", "--name=t5-v5e", "--zone=us-west4-a", "--project=my-project",
                        "--accelerator_type=v5litepod-16", flag]) == 0
    assert gcloud.calls() == [[*track, "queued-resources", "create", "t5-v5e", "--zone=us-west4-a",
                               "--project=my-project", "--node-id=t5-v5e", "--accelerator-type=v5litepod-16",
                               "--runtime-version=v2-alpha-tpuv5-lite", *tier]]
    assert "status --name=t5-v5e --queued" in capsys.readouterr().err


@pytest.mark.parametrize("accelerator_type, runtime_version", [
    ("v4-32", "tpu-ubuntu2204-base"), ("v5litepod-16", "v2-alpha-tpuv5-lite"), ("v5p-8", "v2-alpha-tpuv5"),
    ("v6e-8", "v2-alpha-tpuv6e"), ("v3-8", "tpu-ubuntu2204-base")])
def test_default_runtime_version_per_generation(accelerator_type, runtime_version):
    assert tpu_vm.default_runtime_version(accelerator_type) == runtime_version


def test_status_stop_delete(gcloud):
    target = ["my-tpu", f"--zone={ZONE}"]
    for argv in (["status"], ["status", "--queued"], ["stop"], ["delete"], ["delete", "--queued"]):
        assert launch.main([*argv, "--name=my-tpu", f"--zone={ZONE}"]) == 0
    assert gcloud.calls() == [
        [*TPU, "tpu-vm", "describe", *target],
        [*TPU, "queued-resources", "describe", *target],
        [*TPU, "tpu-vm", "stop", *target],
        [*TPU, "tpu-vm", "delete", *target, "--quiet"],
        [*TPU, "queued-resources", "delete", *target, "--force", "--quiet"],  # --force: its node goes too
    ]
    gcloud.fail({"match": ["describe"], "exit": 1, "output": "ERROR: NOT_FOUND"})  # gcloud's status is the launcher's
    assert launch.main(["status", "--name=my-tpu", f"--zone={ZONE}"]) == 1


# run: ship, install, the job on every worker.
def run(*extra, command=("sh", "-c", 'echo "hello from worker $FAKE_WORKER"'), sleeps=None):
    return launch.main(["run", "--name=my-tpu", f"--zone={ZONE}", "--run_id=r1", *extra, "--", *command],
                       sleep=(sleeps if sleeps is not None else []).append)


def job_calls(gcloud) -> list[list[str]]:
    return [call for call in gcloud.calls() if call[3] == "ssh" and "--worker=all" not in call]


def test_run_ships_installs_and_runs_the_command_on_every_worker(gcloud, project, capsys):
    assert run() == 0
    calls = gcloud.calls()
    tarball = calls[1][4]
    job = remote_job.job_command(["sh", "-c", 'echo "hello from worker $FAKE_WORKER"'], {}, "lmpretrain")
    assert calls[:3] == [
        [*TPU, "tpu-vm", "describe", "my-tpu", f"--zone={ZONE}", "--format=json"],
        [*TPU, "tpu-vm", "scp", tarball, "my-tpu:lmpretrain-r1.tar.gz", f"--zone={ZONE}", "--worker=all"],
        [*TPU, "tpu-vm", "ssh", "my-tpu", f"--zone={ZONE}", "--worker=all",
         "--command=set -e; rm -rf lmpretrain; mkdir -p lmpretrain; tar -xzf lmpretrain-r1.tar.gz -C lmpretrain; "
         'rm -f lmpretrain-r1.tar.gz; cd lmpretrain; python3 -m pip install --quiet -e ".[tpu]"'],
    ]
    assert sorted(calls[3:]) == [[*TPU, "tpu-vm", "ssh", "my-tpu", f"--zone={ZONE}", f"--worker={i}",
                                  f"--command={job}"] for i in (0, 1)]
    assert not os.path.exists(tarball)  # the local tarball is removed once copied
    for i in (0, 1):
        home = gcloud.worker(i)
        # the working tree went, untracked files included, .gitignore'd ones and the launcher's logs not
        assert (home / "lmpretrain" / "pkg" / "module.py").read_text() == "VALUE = 1\n"
        assert not (home / "lmpretrain" / "ignored").exists() and not (home / "lmpretrain" / "launch_logs").exists()
        assert not (home / "lmpretrain-r1.tar.gz").exists()
        assert (home / "python3-calls.log").read_text() == "python3 -m pip install --quiet -e .[tpu]\n"
        log = (project / "launch_logs" / "my-tpu" / "r1" / f"worker-{i}.log").read_text()
        assert f"hello from worker {i}\n" in log and "[launch] started on" in log
    out = capsys.readouterr().out  # worker 0's output streams here, the others' do not
    assert "hello from worker 0" in out and "hello from worker 1" not in out
    manifest = json.loads((project / "launch_logs" / "my-tpu" / "r1" / "launch.json").read_text())
    assert manifest["statuses"] == [0, 0] and manifest["exit_status"] == 0 and manifest["workers"] == 2


def test_the_command_and_env_reach_the_workers_intact(gcloud, project):
    """Quoting: arguments with spaces and quotes, and --env values, arrive as given."""
    command = ["sh", "-c", 'printf "<%s>\\n" "$@" "$GREETING"', "_", "a b", "it's", "$HOME"]
    assert run("--workers=1", "--env=GREETING=hi there", command=command) == 0
    log = (project / "launch_logs" / "my-tpu" / "r1" / "worker-0.log").read_text()
    assert "<a b>\n<it's>\n<$HOME>\n<hi there>\n" in log
    assert [call[3] for call in gcloud.calls()] == ["scp", "ssh", "ssh"]  # --workers: no describe


def test_a_worker_that_fails_to_start_is_retried(gcloud, project, capsys):
    gcloud.fail({"match": ["--worker=1", "[launch] started"], "exit": 255,
                 "output": "ssh: connect to host 10.0.0.1 port 22: Connection timed out"})
    sleeps = []
    assert run(sleeps=sleeps) == 0
    assert sorted(call[6] for call in job_calls(gcloud)) == ["--worker=0", "--worker=1", "--worker=1"]
    assert sleeps == [10.0]
    log = (project / "launch_logs" / "my-tpu" / "r1" / "worker-1.log").read_text()
    assert log.index("Connection timed out") < log.index("retry 1 of 3") < log.index("hello from worker 1")


def test_a_worker_never_reached_fails_the_run_after_the_retries(gcloud, project, capsys):
    rule = {"match": ["--worker=1", "[launch] started"], "exit": 255}
    gcloud.fail(*[rule] * 4)
    sleeps = []
    assert run("--retries=3", sleeps=sleeps) == 255
    assert sleeps == [10.0, 20.0, 40.0]
    assert "worker 1: could not be reached" in capsys.readouterr().err


def test_the_jobs_own_failure_is_its_status_and_not_retried(gcloud, project, capsys):
    sleeps = []
    assert run(command=["sh", "-c", 'echo "step 1"; exit $((FAKE_WORKER * 3))'], sleeps=sleeps) == 3
    assert len(job_calls(gcloud)) == 2 and sleeps == []
    err = capsys.readouterr().err
    assert "worker 1: exit status 3" in err and "worker 0:" not in err
    manifest = json.loads((project / "launch_logs" / "my-tpu" / "r1" / "launch.json").read_text())
    assert manifest["statuses"] == [0, 3] and manifest["exit_status"] == 3


def test_a_step_that_cannot_connect_is_retried(gcloud, project):
    gcloud.fail({"match": ["scp"], "exit": 255})
    sleeps = []
    assert run(sleeps=sleeps) == 0
    assert [call[3] for call in gcloud.calls()].count("scp") == 2 and sleeps == [10.0]


def test_a_failed_install_stops_the_run_without_retrying(gcloud, project, capsys):
    gcloud.fail({"match": ["pip install"], "exit": 1, "output": "ERROR: No matching distribution found for libtpu"})
    sleeps = []
    assert run(sleeps=sleeps) == 1
    assert job_calls(gcloud) == [] and sleeps == []
    err = capsys.readouterr().err
    assert "error: installing the package on the workers of my-tpu failed (gcloud exit status 1" in err


def test_a_tpu_vm_that_is_not_ready(gcloud, project, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_GCLOUD_TPU_STATE", "CREATING")
    assert run() == 2
    assert capsys.readouterr().err.startswith("error: the TPU VM my-tpu is CREATING, not READY")
    assert [call[3] for call in gcloud.calls()] == ["describe"]


def test_ctrl_c_stops_the_job_on_every_worker(gcloud, project, monkeypatch, capsys):
    """Ctrl-C (here: raised once the job runs on both workers) sends the job SIGTERM through gcloud on every
    worker; the launcher goes on streaming and ends with the job's own status (75: checkpoint saved)."""
    real_wait, interrupted = remote_job._wait, []

    def wait(threads):
        if not interrupted:
            interrupted.append(True)
            deadline = time.monotonic() + 30
            logs = [project / "launch_logs" / "my-tpu" / "r1" / f"worker-{i}.log" for i in (0, 1)]
            while not all(log.exists() and "trapped" in log.read_text() for log in logs):
                assert time.monotonic() < deadline, "the job did not start"
                time.sleep(0.05)
            raise KeyboardInterrupt
        real_wait(threads)

    monkeypatch.setattr(remote_job, "_wait", wait)
    job = "trap 'kill $!; echo stopped on $FAKE_WORKER; exit 75' TERM; echo trapped; sleep 20 & wait"
    assert run(command=["sh", "-c", job]) == 75
    stop = [*TPU, "tpu-vm", "ssh", "my-tpu", f"--zone={ZONE}", "--worker=all", f"--command={remote_job.STOP_COMMAND}"]
    assert gcloud.calls()[-1] == stop
    assert "stopped on 0" in capsys.readouterr().out


def test_logs_reports_the_last_run(gcloud, project, capsys):
    assert run(command=["sh", "-c", 'echo "line of $FAKE_WORKER"; exit $FAKE_WORKER']) == 1
    capsys.readouterr()
    calls = len(gcloud.calls())
    assert launch.main(["logs", "--name=my-tpu", "--worker=1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(os.path.join("launch_logs", "my-tpu", "r1") + "/\n")
    assert "worker-0.log  exit status 0" in out and "worker-1.log  exit status 1" in out
    assert out.rstrip().endswith("line of 1")
    assert len(gcloud.calls()) == calls  # local: no gcloud
    assert launch.main(["logs", "--name=other-tpu"]) == 2


# --dry_run, a missing gcloud, bad usage.
def test_dry_run_prints_the_commands_and_runs_nothing(gcloud, project, capsys):
    assert run("--workers=2", "--dry_run") == 0
    lines = capsys.readouterr().out.splitlines()
    assert gcloud.calls() == [] and not (project / "launch_logs").exists()
    assert lines[0].startswith("# pack the working tree of ")
    assert lines[1].startswith("gcloud compute tpus tpu-vm scp ") and "--worker=all" in lines[1]
    assert lines[2].startswith("gcloud compute tpus tpu-vm ssh my-tpu --zone=us-central2-b --worker=all '--command=")
    assert [line.split()[7] for line in lines[4:]] == ["--worker=0", "--worker=1"]
    assert len(lines) == 6


def test_dry_run_needs_no_gcloud(project, tmp_path, monkeypatch, capsys):
    (tmp_path / "bin").mkdir()
    os.symlink(shutil.which("git"), tmp_path / "bin" / "git")  # git (find the checkout), no gcloud
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert launch.main(["create", "--name=x", "--accelerator_type=v4-32", "--spot", "--dry_run"]) == 0
    assert capsys.readouterr().out == ("gcloud compute tpus queued-resources create x --node-id=x "
                                       "--accelerator-type=v4-32 --runtime-version=tpu-ubuntu2204-base --spot\n")
    assert run("--dry_run") == 0
    assert "# ... and the same with --worker=1 ... --worker=N-1" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["status", "--name=x"], ["delete", "--name=x", "--queued"],
                                  ["run", "--name=x", "--", "true"]])
def test_missing_gcloud_is_one_line(project, tmp_path, monkeypatch, capsys, argv):
    (tmp_path / "bin").mkdir()
    os.symlink(shutil.which("git"), tmp_path / "bin" / "git")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert launch.main(argv) == 2
    assert capsys.readouterr().err == f"error: {launch.GCLOUD_MISSING}\n"


@pytest.mark.parametrize("argv, message", [
    ([], "give a subcommand"),
    (["create", "--name=x", "--accelerator_type=v4-8", "--spot", "--reserved"], "not allowed with argument"),
    (["create", "--name=x", "--accelerator_type=v9-8"], "no default runtime version for v9-8"),
    (["create", "--name=x", "--accelerator_type=big"], "is not a TPU accelerator type"),
    (["create", "--name=x", "--accelerator_type=v4-31"], "a v4 size is a multiple of 8, its TensorCores"),
    (["create", "--name=x", "--accelerator_type=v5litepod-2"], "a v5litepod size is one of 1, 4, 8, 16"),
    (["create", "--name=x", "--zone=us central2", "--accelerator_type=v4-8"], "--zone='us central2' is not a zone"),
    (["status", "--name=x", "--zone=US-CENTRAL2-B"], "is not a zone name"),
    (["create", "--name=My_TPU", "--accelerator_type=v4-8"], "is not a TPU name"),
    (["status"], "the following arguments are required: --name"),
    (["run", "--name=x"], "run needs the command to start on every worker after --"),
    (["run", "--name=x", "--env=oops", "--", "true"], "--env='oops' is not KEY=VALUE"),
    (["status", "--name=x", "--", "true"], "status takes no command after --"),
    (["run", "--name=x", "--revision=no-such-branch", "--dry_run", "--", "true"], "no such commit"),
])
def test_bad_usage_is_one_line(gcloud, project, capsys, argv, message):
    assert launch.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert gcloud.calls() == []


# Shipping a revision, and the real command line (subprocesses: slow).
@pytest.mark.slow
def test_a_revision_ships_exactly_its_commit(project, tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "add", "setup.py", "pkg/module.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    (project / "pkg" / "module.py").write_text("VALUE = 2\n")  # an edit after the commit: not shipped
    source = shipping.find_source(str(project), "HEAD")
    assert len(source.revision) == 40
    shipping.pack(source, str(tmp_path / "code.tar.gz"))
    with tarfile.open(tmp_path / "code.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["pkg", "pkg/module.py", "setup.py"]
        assert tar.extractfile("pkg/module.py").read() == b"VALUE = 1\n"
    assert shipping.commit_of(shipping.find_source(str(project))).endswith(" + changes")


@pytest.mark.slow
def test_the_command_line(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # no gcloud
    result = subprocess.run([sys.executable, "-m", "pretrain.launch", "stop", "--name=x"], cwd=REPO, env=env,
                            capture_output=True, text=True)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"error: {launch.GCLOUD_MISSING}\n")
    result = subprocess.run([sys.executable, "-m", "pretrain.launch", "delete", "--name=x", "--zone=us-east5-a",
                             "--queued", "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, "gcloud compute tpus queued-resources delete x --zone=us-east5-a "
                                                     "--force --quiet\n")
