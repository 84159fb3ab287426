"""Pretraining throughput, side by side with Hugging Face transformers on PyTorch.

Both sides train the same shape on the same batches (built by this project's data pipeline), with the same
optimizer, schedule and clipping, and are timed per step after a warm-up (compilation for JAX), the batches
already built (the input pipeline is not timed). Prints tokens/s, the time ratio, the loss each side reaches
(quality) and MFU against this machine's measured matmul roofline.

  pip install -e ".[hf]"   # torch==2.13.0 (CPU build) + transformers
  python -m scripts.bench.bench_pretrain --size mini --steps 40      # BERT (MLM + NSP) on the demo corpus
  python -m scripts.bench.bench_pretrain --workdir runs/cram/modernbert   # a run's own config (BERT or ModernBERT)
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from configs import bert as bert_configs
from pretrain.loops import aot, pretraining, setup
from pretrain.loops.steps import micro_batches
from pretrain.runtime import partitioning
from pretrain.training import train_state


def demo_assets(directory: str) -> tuple[str, str]:
    """The demo corpus and tokenizer (built here if `make demo` has not made them)."""
    from pretrain.tools import train_tokenizer
    from pretrain.tools.build_corpus import build_corpus
    corpus, spm = os.path.join(directory, "corpus.txt"), os.path.join(directory, "tokenizer", "spm.model")
    if not os.path.exists(corpus):
        build_corpus(corpus, max_mb=4)
    if not os.path.exists(spm):
        train_tokenizer.train_sentencepiece(corpus, spm[:-len(".model")], vocab_size=8000)
    return corpus, spm


def matmul_roofline(n: int = 2048, repeats: int = 10) -> float:
    """Best float32 matmul FLOP/s of this machine through XLA: the denominator of MFU."""
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = min(_timed(lambda: f(a).block_until_ready()) for _ in range(repeats))
    return 2 * n ** 3 / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed_steps(trainer: setup.Trainer, batches: list[dict[str, np.ndarray]]
                ) -> tuple[train_state.TrainState, list[float], list[float]]:
    """The trainer's fresh state through its step on each [B, ...] batch (one micro-batch, as the loop feeds the
    step, already on the devices); -> (state, seconds per step, losses). A step is timed from its dispatch to its
    loss on the host."""
    state = trainer.init_state()
    device_batches = [partitioning.shard_batch(micro_batches(b, 1), trainer.mesh, batch_dim=1) for b in batches]
    times, losses = [], []
    with trainer.mesh:
        for batch in device_batches:
            start = time.perf_counter()
            state, metrics = trainer.train_step(state, batch, trainer.dropout_rng)
            losses.append(float(metrics["loss"]))  # blocks until the step is done
            times.append(time.perf_counter() - start)
    return state, times, losses


def run_jax(trainer: setup.Trainer, batches: list[dict]) -> tuple[list[float], list[float]]:
    _, times, losses = timed_steps(trainer, batches)
    return times, losses


def run_torch(config, batches: list[dict], threads: int) -> tuple[list[float], list[float]]:
    import torch

    from scripts.bench import torch_bert
    torch.set_num_threads(threads)
    model = torch_bert.build_model(config.model)
    optimizer, scheduler = torch_bert.build_optimizer(model, config.optimizer, config.num_train_steps)
    times, losses = [], []
    for batch in batches:
        inputs = torch_bert.peer_inputs(batch, config)
        start = time.perf_counter()
        losses.append(torch_bert.train_step(model, optimizer, scheduler, inputs, config.optimizer.grad_clip_norm))
        times.append(time.perf_counter() - start)
    return times, losses


def demo_config(args) -> ml_collections.ConfigDict:
    """configs/bert.py's --size (short recipe) on the demo corpus and tokenizer, --batch_size x --seq_len."""
    corpus, spm = demo_assets(args.assets if os.path.isdir(args.assets) else tempfile.mkdtemp())
    config = bert_configs.get_config(f"size={args.size},recipe=short")
    with config.unlocked():
        config.model.vocab_size = 8000
        config.batch_size, config.num_train_steps = args.batch_size, args.steps
        config.data.max_seq_length = args.seq_len
        config.data.path, config.tokenizer.path = corpus, spm
        config.optimizer.warmup_steps = max(1, args.steps // 10)
    return config


def workdir_config(workdir: str) -> ml_collections.ConfigDict:
    """A pretrain.train run's config.json as it ran (model, objective, batch, corpus, tokenizer)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise SystemExit(f"error: {workdir} holds no config.json: give a pretrain.train workdir "
                         "(runs/cram/modernbert after make cram), or use --size")
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="mini", choices=list(bert_configs.SIZES))
    parser.add_argument("--workdir", default="", help="a pretrain.train workdir: its config instead of --size "
                        "(batch, length and data as it ran)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="untimed first steps (JAX compiles here)")
    parser.add_argument("--assets", default="demo_out", help="where the demo corpus/tokenizer live")
    args = parser.parse_args()

    config = workdir_config(args.workdir) if args.workdir else demo_config(args)
    objective, data, held_out = pretraining.training_data(config)
    batches = [rows for _, (_, rows, _) in zip(range(args.steps), data.iterate(0))]
    for stream in filter(None, (data, held_out)):
        stream.close()
    batch_size, seq_len = batches[0]["input_ids"].shape

    threads = os.cpu_count() or 1
    m = config.model
    print(f"{m.name} ({m.num_layers}L/{m.hidden_size}H), batch {batch_size} x {seq_len}, {args.steps} steps "
          f"({args.warmup} untimed), {threads} threads")
    roofline = matmul_roofline()
    trainer = setup.pretraining_trainer(config, objective)
    flops = aot.model_flops(trainer, batch_size)[0]  # attention over the pairs its masks keep
    results = {"jax/flax (ours)": run_jax(trainer, batches),
               "pytorch/transformers": run_torch(config, batches, threads)}
    tokens = batch_size * seq_len
    print(f"matmul roofline {roofline / 1e9:.1f} GFLOP/s; model {flops / 1e9:.2f} GFLOP per step")
    print(f"{'side':24s} {'step ms':>8s} {'tokens/s':>9s} {'MFU':>6s} {'loss@1':>7s} {'loss@end':>8s}")
    median = {}
    for side, (times, losses) in results.items():
        median[side] = float(np.median(times[args.warmup:]))
        end_loss = float(np.mean(losses[-5:]))
        print(f"{side:24s} {median[side] * 1e3:8.1f} {tokens / median[side]:9.0f} "
              f"{flops / median[side] / roofline:6.1%} {losses[0]:7.3f} {end_loss:8.3f}")
    ours, ref = median["jax/flax (ours)"], median["pytorch/transformers"]
    print(f"time ratio ours / reference = {ours / ref:.2f} (below 1: ours is faster)")


if __name__ == "__main__":
    main()
