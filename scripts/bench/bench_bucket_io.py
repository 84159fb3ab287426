"""A workdir in a bucket vs on the local disk, against a GCS-protocol server on loopback (fake-gcs-server from
the test extra, scripts/bench/gcs_server.py), so that only the protocol's cost shows, not a network's:

1. metrics.jsonl: the bytes sent per logged step by the upload that carries step 100 and step 10,000,
   rewriting the whole object (how a bucket file was kept before appends) vs appending (storage.append:
   the new lines uploaded, the server concatenates). One upload per 10 logged steps, a pretraining record.
2. Checkpoints: save (until complete) and restore time of a tiny state and a BERT-Base-sized train state
   (110M float32 parameters + Adam's two moments, 1.3 GB) with pretrain.workdir.checkpoints, local vs bucket.

  python -m scripts.bench.bench_bucket_io [--skip_base]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import jax
import numpy as np

from pretrain.workdir import checkpoints, storage
from scripts.bench.gcs_server import GcsServer, Proxy

RECORD = {"step": 0, "grad_norm": 1.2345, "learning_rate": 0.0001, "loss": 3.4567, "mlm_accuracy": 0.4567,
          "mlm_loss": 3.1234, "nsp_accuracy": 0.8123, "nsp_loss": 0.3333, "tokens_per_sec": 123456.7,
          "step_time_sec": 0.123}
LINES_PER_UPLOAD = 10
# BERT-Base: 110M parameters as its weight matrices (embeddings, 12 layers of attention and FFN, heads).
BERT_BASE_SHAPES = ([(30522, 768), (512, 768), (2, 768)] + [(768, 768)] * 48 + [(768, 3072), (3072, 768)] * 12
                    + [(768, 768), (768, 2)])


def line(step: int) -> str:
    return json.dumps({**RECORD, "step": step}) + "\n"


def metrics_bytes(proxy: Proxy, url: str, at_steps=(100, 10_000)) -> dict:
    """{(way, step): bytes sent per logged step by the upload that carries `step`}."""
    out = {}
    for way in ("rewrite", "append"):
        path, text = f"{url}/{way}/metrics.jsonl", ""
        for end in range(LINES_PER_UPLOAD, max(at_steps) + 1, LINES_PER_UPLOAD):
            new = "".join(line(s) for s in range(end - LINES_PER_UPLOAD + 1, end + 1))
            before = proxy.sent
            if way == "rewrite":
                text += new
                storage.write_atomic(path, text)
            else:
                storage.append(path, new)
            if end in at_steps:
                out[(way, end)] = (proxy.sent - before) / LINES_PER_UPLOAD
    return out


def random_state(shapes) -> dict:
    rng = np.random.default_rng(0)
    params = {f"w{i}": rng.standard_normal(shape, dtype=np.float32) for i, shape in enumerate(shapes)}
    return {"params": params, "mu": {k: v * 0.1 for k, v in params.items()},
            "nu": {k: v * v for k, v in params.items()}}


def save_restore_seconds(directory: str, state: dict) -> tuple[float, float, dict]:
    """(save seconds until complete, restore seconds, the restored state)."""
    ckpt = checkpoints.Checkpointer(directory, save_every=1, keep=1)
    started = time.perf_counter()
    ckpt.save(1, state, {"step": 1})
    ckpt.wait()
    saved = time.perf_counter() - started
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    started = time.perf_counter()
    restored, _, _ = ckpt.restore(abstract)
    jax.block_until_ready(restored)
    restore = time.perf_counter() - started
    ckpt.close()
    return saved, restore, restored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip_base", action="store_true", help="the tiny state only")
    args = parser.parse_args()
    server = GcsServer().start()
    server.create_bucket("bench")
    proxy = Proxy(server.url)
    os.environ.update(proxy.environment)
    local = tempfile.mkdtemp(prefix="bench_bucket_io_")
    try:
        sent = metrics_bytes(proxy, "gs://bench/metrics")
        print("| metrics.jsonl upload | bytes per logged step at step 100 | at step 10,000 |\n|---|---|---|")
        for way in ("rewrite", "append"):
            print(f"| {way} | {sent[(way, 100)]:,.0f} | {sent[(way, 10_000)]:,.0f} |")
        states = {"tiny": [(1000, 32), (32, 64), (64, 32)]}
        if not args.skip_base:
            states["BERT-Base-sized"] = BERT_BASE_SHAPES
        print("\n| train state (params + 2 Adam moments) | MB | local save s | local restore s | bucket save s "
              "| bucket restore s |\n|---|---|---|---|---|---|")
        for name, shapes in states.items():
            state = random_state(shapes)
            megabytes = sum(x.nbytes for x in jax.tree.leaves(state)) / 1e6
            parameters = sum(x.size for x in state["params"].values())
            times = [save_restore_seconds(where, state) for where in
                     (os.path.join(local, name[:4]), f"gs://bench/checkpoints/{name[:4]}")]
            (local_save, local_restore, _), (bucket_save, bucket_restore, _) = times
            print(f"| {name} ({parameters:,} parameters) | {megabytes:,.1f} | {local_save:.2f} | {local_restore:.2f} "
                  f"| {bucket_save:.2f} | {bucket_restore:.2f} |")
    finally:
        proxy.stop()
        server.stop()
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(server.root, ignore_errors=True)


if __name__ == "__main__":
    main()
