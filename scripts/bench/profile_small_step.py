"""Where a small training step's time goes on a CPU: nanoGPT's shakespeare_char CPU recipe (4 layers, width 128,
batch 12 x 64), our step taken apart piece by piece, and nanoGPT's own model (its model.py, when a clone is
present) timed the same way.

  ours      host batch   one batch from the real streaming pipeline (pretrain/data/streaming.py), no prefetch
            dispatch     a jitted no-op on the same device, round trip (the floor of any jitted call)
            forward      the jitted loss (model + objective)
            fwd + bwd    the jitted value_and_grad of the loss
            step         the loop's jitted train_step (fwd + bwd + clipping + AdamW), batch already on the device
  nanoGPT   forward, fwd + bwd, step (+ clip_grad_norm_ + AdamW), batch from its get_batch

Each figure is the median over --iters calls after --warmup (the host batch: the mean over 10 x --iters).
Ours: step - (fwd + bwd) is the optimizer, (fwd + bwd) - forward the backward pass.

  python -m scripts.bench.profile_small_step                  # ours; + nanoGPT with ../nanoGPT or NANOGPT_DIR
  python -m scripts.bench.profile_small_step --jax_profile=/tmp/trace   # and a TensorBoard/Perfetto trace of our step

With --jax_profile the script also sums the trace's XLA ops by kind (the HLO name without its number:
`ynn_fusion` = the matmuls XLA's CPU backend hands to YNNPACK, `copy_bitcast_fusion` = layout copies and
the fusions that end in one) and prints ms per step per kind, summed over both threads.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import importlib.util
import json
import os
import re
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

CONFIG_ARG = "size=nano_shakespeare_char_cpu"


def mean_ms(fn, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return 1e3 * (time.perf_counter() - start) / iters


def median_ms(fn, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def profile_ours(args) -> dict:
    import jax
    import jax.numpy as jnp

    import objectives
    from configs import gpt2 as gpt2_configs
    from pretrain.data import documents, streaming, tokenizers
    from pretrain.loops import setup
    from pretrain.loops.steps import micro_batches
    from pretrain.runtime import partitioning

    config = gpt2_configs.get_config(CONFIG_ARG)
    with config.unlocked():
        config.data.path = config.tokenizer.path = os.path.join(REPO, config.data.path)
    tokenizer = tokenizers.from_config(config.tokenizer)
    objective = objectives.build_objective(config.objective, tokenizer)
    train_docs, _ = documents.load_documents(config.data, tokenizer)
    data = streaming.StreamingData(train_docs, objective=objective, max_seq_length=config.data.max_seq_length,
                                   batch_size=config.batch_size, window_documents=config.data.window_documents,
                                   streams=config.data.streams, seed=config.seed, workers=0)
    rows = data.iterate(0)
    # the mean: rows are built a window of documents at a time, so most calls only slice
    out = {"host_batch_ms": mean_ms(lambda: next(rows), 10 * args.iters)}
    data.close()

    trainer = setup.pretraining_trainer(config, objective)  # the loop's set-up: its state, its jitted step
    state, step, rng = trainer.init_state(), trainer.train_step, trainer.dropout_rng
    host_batch = next(data.iterate(0))[1]
    batch = partitioning.shard_batch(micro_batches(host_batch, 1), trainer.mesh, batch_dim=1)
    flat = jax.tree.map(lambda x: x[0], batch)

    def loss(params):
        outputs = state.apply_fn({"params": params}, **objective.model_inputs(flat), deterministic=False,
                                 rngs={"dropout": rng})
        return objective.loss(outputs, flat)[0]

    forward, grads = jax.jit(loss), jax.jit(jax.value_and_grad(loss))
    noop, x = jax.jit(lambda v: v + 1), jnp.zeros(())
    holder = [state]

    def run_step():
        holder[0], metrics = step(holder[0], batch, rng)
        jax.block_until_ready(metrics)

    with trainer.mesh:
        out["dispatch_ms"] = median_ms(lambda: noop(x).block_until_ready(), args.iters, args.warmup)
        out["forward_ms"] = median_ms(lambda: jax.block_until_ready(forward(state.params)), args.iters, args.warmup)
        out["fwd_bwd_ms"] = median_ms(lambda: jax.block_until_ready(grads(state.params)), args.iters, args.warmup)
        out["step_ms"] = median_ms(run_step, args.iters, args.warmup)
        if args.jax_profile:
            with jax.profiler.trace(args.jax_profile):
                for _ in range(PROFILED_STEPS):
                    run_step()
    return out


PROFILED_STEPS = 10
HLO_NAME = re.compile(r"[a-z][a-z0-9_\-]*(\.\d+)?")  # an XLA op (`ynn_fusion.12`), not a Python frame or a
                                                     # runtime span (`ThunkExecutor::Execute`, `end: ...`)


def op_kinds(trace_dir: str, steps: int = PROFILED_STEPS) -> dict[str, tuple[float, float]]:
    """{op kind: (ms per step, ops per step)} from the newest trace under trace_dir, largest first."""
    files = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.trace.json.gz")))
    events = json.load(gzip.open(files[-1]))["traceEvents"]
    micros, counts = collections.Counter(), collections.Counter()
    for event in events:
        if event.get("ph") == "X" and HLO_NAME.fullmatch(event["name"]):
            kind = re.sub(r"\.\d+$", "", event["name"])
            micros[kind] += event["dur"]
            counts[kind] += 1
    return {kind: (us / 1e3 / steps, counts[kind] / steps) for kind, us in micros.most_common()}


def profile_nanogpt(args) -> dict:
    import torch
    spec = importlib.util.spec_from_file_location("nanogpt_model", os.path.join(args.nanogpt_dir, "model.py"))
    nanogpt = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclass looks its module up
    spec.loader.exec_module(nanogpt)  # nanoGPT's model.py, as is
    GPT, GPTConfig = nanogpt.GPT, nanogpt.GPTConfig

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    model = GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")  # its train.py's call
    x = torch.randint(65, (12, 64))
    y = torch.randint(65, (12, 64))

    def forward():
        with torch.no_grad():
            model(x, y)

    def fwd_bwd():
        _, loss = model(x, y)
        loss.backward()
        optimizer.zero_grad(set_to_none=True)

    def step():
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    return {"forward_ms": median_ms(forward, args.iters, args.warmup),
            "fwd_bwd_ms": median_ms(fwd_bwd, args.iters, args.warmup),
            "step_ms": median_ms(step, args.iters, args.warmup)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--nanogpt_dir", default=os.environ.get("NANOGPT_DIR", os.path.join(REPO, "..", "nanoGPT")))
    parser.add_argument("--jax_profile", default="", help="write a jax.profiler trace of 10 steps here")
    parser.add_argument("--top_kinds", type=int, default=12, help="op kinds to print with --jax_profile")
    parser.add_argument("--output", default="")
    args = parser.parse_args()
    results = {"ours": profile_ours(args)}
    if os.path.exists(os.path.join(args.nanogpt_dir, "model.py")):
        results["nanogpt"] = profile_nanogpt(args)
    print(f"median ms over {args.iters} calls, {os.cpu_count()} cores, 12 x 64 tokens, 4 layers x 128")
    names = ("host_batch_ms", "dispatch_ms", "forward_ms", "fwd_bwd_ms", "step_ms")
    print(f"{'':10s}" + "".join(f"{n[:-3]:>12s}" for n in names))
    for side, row in results.items():
        print(f"{side:10s}" + "".join(f"{row[n]:12.2f}" if n in row else f"{'-':>12s}" for n in names))
    ours = results["ours"]
    print(f"ours: optimizer (step - fwd+bwd) {ours['step_ms'] - ours['fwd_bwd_ms']:.2f} ms, "
          f"backward (fwd+bwd - forward) {ours['fwd_bwd_ms'] - ours['forward_ms']:.2f} ms")
    if "nanogpt" in results:
        nano = results["nanogpt"]
        print("ours / nanoGPT: " + ", ".join(f"{n[:-3]} {ours[n] / nano[n]:.2f}"
                                             for n in ("forward_ms", "fwd_bwd_ms", "step_ms")))
    if args.jax_profile:
        kinds = op_kinds(args.jax_profile)
        results["ours"]["op_kinds_ms"] = {kind: ms for kind, (ms, _) in kinds.items()}
        total = sum(ms for ms, _ in kinds.values())
        print(f"our step's XLA ops by kind, ms per step summed over threads ({total:.1f} in all):")
        for kind, (ms, count) in list(kinds.items())[:args.top_kinds]:
            print(f"  {ms:8.2f}  {count:6.1f} ops  {kind}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
