"""What a Weights & Biases run in WANDB_MODE=offline wrote: its runs under DIR/wandb/offline-run-*, read from their
`run-<id>.wandb` files (a LevelDB-style log of protobuf records: wandb's transaction log) without the network."""
from __future__ import annotations

import glob
import json
import os
import struct
from typing import NamedTuple

BLOCK, HEADER = 32768, 7  # the log's blocks, and a record's header: crc32, length, type (full, first, middle, last)
FULL, LAST = 1, 4


class OfflineRun(NamedTuple):
    run_id: str
    project: str
    name: str
    tags: list[str]
    config: dict            # top-level key -> value, as logged
    history: list[dict]     # one dict per logged step: {"_step": step, "train/loss": ...}


def offline_runs(directory: str) -> list[OfflineRun]:
    """The offline runs under directory/wandb, oldest first."""
    paths = sorted(glob.glob(os.path.join(directory, "wandb", "offline-run-*", "run-*.wandb")))
    return [_read(path) for path in paths]


def _records(path: str):
    from wandb.proto import wandb_internal_pb2
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    index, pending = HEADER, b""
    while index + HEADER <= len(data):
        if BLOCK - index % BLOCK < HEADER:  # a block's tail too short for a header is padding
            index += BLOCK - index % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[index:index + HEADER])
        pending += data[index + HEADER:index + HEADER + length]
        index += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _read(path: str) -> OfflineRun:
    run, config, history = None, {}, []
    for record in _records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
    return OfflineRun(run.run_id, run.project, run.display_name, list(run.tags), config, history)
