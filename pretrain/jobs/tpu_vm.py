"""The gcloud commands of Cloud TPU VMs, as argv lists: pure functions, nothing runs here.

A TPU VM comes either straight from `gcloud compute tpus tpu-vm create` (fails at once when the zone has
no capacity) or from a queued resource, `gcloud compute tpus queued-resources create` (waits in Cloud
TPU's queue; the only way to ask for spot, best-effort or reserved capacity). A queued resource is
created with its node named like itself (--node-id=NAME), so that every later command (scp, ssh,
describe) names the TPU VM the same way whichever path made it.

Flags checked against gcloud 528's own command definitions: `--best-effort` exists only in the alpha
track of `queued-resources create`; `tpu-vm create` takes the runtime as --version, `queued-resources
create` as --runtime-version; `tpu-vm stop` works for single-host TPU VMs only (the API stops single
nodes); `queued-resources delete --force` deletes the queued resource's nodes first.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from pretrain.runtime.errors import UserError

TPU = ["gcloud", "compute", "tpus"]
TPU_ALPHA = ["gcloud", "alpha", "compute", "tpus"]  # --best-effort is an alpha flag of queued-resources create

PROVISIONING = ("spot", "best-effort", "reserved")

# Accelerator type prefix (v4-32, v5litepod-16, ...) -> the TPU software version Cloud TPU's docs name
# for JAX on that generation (https://cloud.google.com/tpu/docs/runtimes).
RUNTIME_VERSIONS = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",  # v5e
    "v5e": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}

_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_ACCELERATOR = re.compile(r"(v[0-9][a-z]*)-([0-9]+)")
_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")  # REGION-ZONE, e.g. us-central2-b, europe-west4-a
# The sizes Cloud TPU offers per generation (docs.cloud.google.com/tpu/docs/<generation>): v2 to v5p count
# TensorCores, 8 per host, so a size is a multiple of 8; v5e and v6e count chips, in powers of two up to 256
# with 2 left out. A size outside these is a typo that gcloud would only report after a round trip.
CORE_COUNTED = ("v2", "v3", "v4", "v5p")
CHIP_COUNTED = ("v5litepod", "v5e", "v6e")
CHIP_SIZES = (1, 4, 8, 16, 32, 64, 128, 256)


class Target(NamedTuple):
    """Which TPU VM: its name, and the zone and project (None: gcloud's configured default)."""
    name: str
    zone: str | None = None
    project: str | None = None

    def flags(self) -> list[str]:
        return ([f"--zone={self.zone}"] if self.zone else []) + ([f"--project={self.project}"] if self.project else [])


def check_name(name: str) -> str:
    """A TPU name as Cloud TPU accepts it (lowercase letters, digits, hyphens); it also goes into remote
    paths and shell commands unquoted, so nothing else may pass."""
    if not _NAME.fullmatch(name or ""):
        raise UserError(f"--name={name!r} is not a TPU name: lowercase letters, digits and hyphens, starting "
                        "with a letter (e.g. --name=bert-v4-32)")
    return name


def check_accelerator_type(accelerator_type: str) -> re.Match:
    """A generation and a size (v4-32, v5litepod-16, ...): anything else is a typo gcloud would only
    report after a round trip."""
    match = _ACCELERATOR.fullmatch(accelerator_type)
    if not match:
        raise UserError(f"--accelerator_type={accelerator_type!r} is not a TPU accelerator type: a generation "
                        "and a size, e.g. v4-32, v5litepod-16, v5p-8, v6e-8")
    generation, size = match.group(1), int(match.group(2))
    if generation in CORE_COUNTED and (size < 8 or size % 8):
        raise UserError(f"--accelerator_type={accelerator_type}: a {generation} size is a multiple of 8, its "
                        f"TensorCores (e.g. {generation}-8, {generation}-32)")
    if generation in CHIP_COUNTED and size not in CHIP_SIZES:
        raise UserError(f"--accelerator_type={accelerator_type}: a {generation} size is one of "
                        f"{', '.join(map(str, CHIP_SIZES))}, its chips (e.g. {generation}-16)")
    return match  # another generation: gcloud decides


def check_zone(zone: str | None) -> str | None:
    """REGION-ZONE as Cloud names zones (us-central2-b); None: gcloud's configured compute/zone."""
    if zone is not None and not _ZONE.fullmatch(zone):
        raise UserError(f"--zone={zone!r} is not a zone name: REGION-ZONE in lowercase, e.g. us-central2-b "
                        "(`gcloud compute tpus locations list` lists them)")
    return zone


def default_runtime_version(accelerator_type: str) -> str:
    """The runtime version for an accelerator type such as v4-32 or v5litepod-16."""
    match = check_accelerator_type(accelerator_type)
    if match.group(1) not in RUNTIME_VERSIONS:
        raise UserError(f"no default runtime version for {accelerator_type}: give --runtime_version "
                        "(`gcloud compute tpus tpu-vm versions list --zone=ZONE` lists them)")
    return RUNTIME_VERSIONS[match.group(1)]


def create_vm(target: Target, accelerator_type: str, runtime_version: str) -> list[str]:
    """A TPU VM now, on on-demand capacity (fails if the zone has none free)."""
    return [*TPU, "tpu-vm", "create", target.name, *target.flags(), f"--accelerator-type={accelerator_type}",
            f"--version={runtime_version}"]


def create_queued(target: Target, accelerator_type: str, runtime_version: str,
                  provisioning: str | None = None) -> list[str]:
    """A queued resource whose node is named like it; provisioning: spot, best-effort, reserved or None."""
    if provisioning not in (None, *PROVISIONING):
        raise ValueError(f"provisioning {provisioning!r} is none of {PROVISIONING}")
    track = TPU_ALPHA if provisioning == "best-effort" else TPU
    return [*track, "queued-resources", "create", target.name, *target.flags(), f"--node-id={target.name}",
            f"--accelerator-type={accelerator_type}", f"--runtime-version={runtime_version}",
            *([f"--{provisioning}"] if provisioning else [])]


def describe(target: Target, queued: bool = False, json: bool = False) -> list[str]:
    """The TPU VM (state, health, one network endpoint per worker) or the queued resource (its state)."""
    group = "queued-resources" if queued else "tpu-vm"
    return [*TPU, group, "describe", target.name, *target.flags(), *(["--format=json"] if json else [])]


def stop(target: Target) -> list[str]:
    """Stops a single-host TPU VM (kept, not billed for chips); a slice of several hosts cannot be stopped."""
    return [*TPU, "tpu-vm", "stop", target.name, *target.flags()]


def delete(target: Target, queued: bool = False) -> list[str]:
    """Deletes without asking (--quiet). A queued resource goes with --force: its node is deleted first."""
    if queued:
        return [*TPU, "queued-resources", "delete", target.name, *target.flags(), "--force", "--quiet"]
    return [*TPU, "tpu-vm", "delete", target.name, *target.flags(), "--quiet"]


def scp_to_workers(target: Target, local_path: str, remote_path: str) -> list[str]:
    """Copies a local file to remote_path (relative to the home directory) on every worker."""
    return [*TPU, "tpu-vm", "scp", local_path, f"{target.name}:{remote_path}", *target.flags(), "--worker=all"]


def ssh(target: Target, command: str, worker: int | str = "all") -> list[str]:
    """Runs a shell command (a string: the login shell of the worker parses it) on one worker or on all
    of them at once (--worker=all)."""
    return [*TPU, "tpu-vm", "ssh", target.name, *target.flags(), f"--worker={worker}", f"--command={command}"]


def worker_count(description: dict) -> int:
    """The number of hosts of a TPU VM, from `describe --format=json`: one network endpoint each."""
    return len(description.get("networkEndpoints") or [])
