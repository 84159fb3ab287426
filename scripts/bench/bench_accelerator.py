"""Training throughput of BERT, GPT-2 and T5 here against Hugging Face transformers (eager and torch.compile),
on whatever device is present: a CUDA GPU (both frameworks use it, bf16 compute) or the CPU (float32).

Each side trains the same architecture (ours from configs/{bert,gpt2,t5}.py via get_config + overrides and
models.build_model; HF's BertForPreTraining / GPT2LMHeadModel / T5ForConditionalGeneration built from the
same numbers) on the same batches: random token ids of the objective's shapes, drawn once here with numpy
and saved for every side (MLM + NSP batches for BERT, next-token windows for GPT-2, span-corruption-shaped
encoder/decoder batches for T5: 512 inputs -> 114 targets). Ours runs this project's real `train_step`
(pretrain/loops/steps.py) as pretrain/loops/setup.py builds it for the pretraining loop; HF
runs forward + loss, backward, clipping and AdamW. Same optimizer on both: AdamW with the config's lr,
betas, eps and weight decay (matrices and embeddings decay, biases and norm scales do not), constant
learning rate, global-norm clipping 1.0; the configs' dropout; no z-loss (HF has none).
Precision: on a GPU ours computes in bfloat16 with float32 parameters (--config.model.dtype=bfloat16) and
HF runs under torch.autocast(bfloat16) with float32 parameters and fused AdamW; on a CPU both are float32.

Every (model, side) runs in a fresh process, so each has the whole device: peak memory is that process's
own (torch.cuda.max_memory_allocated; JAX's memory_stats()['peak_bytes_in_use']), an out-of-memory ends
only that try (--find_max_batch doubles the batch until one does, GPU only), and JAX's preallocation
cannot starve PyTorch. On a CPU, peak memory and the largest batch are printed as n/a, and the torch.compile
side is skipped unless --compile: on the 2-core development machine Inductor's first step (its C++ compile)
took 65 s for BERT tiny against XLA's 20 s, about a minute more per model. PyTorch gets as many CPU threads
as XLA uses (all cores) unless --torch_threads: on cores busy with other jobs OpenMP's threads wait on
descheduled ones (BERT tiny: 2.7 s per step with 2 threads, 0.27 s with 1, on the 2 shared cores).
The table also gives each side's first step (compilation included) and its loss at the first and last step.

Model FLOPs per step, one formula for both sides (PaLM's, Chowdhery et al. 2022, Appendix B, with the
non-embedding matmul weights N of each stack applied to that stack's tokens):
  6 * (N_enc * enc_tokens + N_dec * dec_tokens + N_head * predicted_tokens)
  + 12 * sum over stacks of (layers * d_attn * context * tokens)
where N per layer is 4 d d_attn + 2 d d_ff (3 d d_ff gated; + 4 d d_attn for T5's cross-attention), N_head
is d * vocab (+ d^2 for BERT's MLM transform) and predicted tokens are BERT's masked positions (HF's head
also scores the unmasked ones: work that is not counted), every GPT-2 position and every T5 target;
context is the sequence attended to (T5 decoder: targets + inputs). Biases, norms and softmax are left out.
MFU = FLOPs / step time / peak: on a GPU the bf16 dense peak of the table below, on a CPU the float32
matmul roofline measured through XLA (scripts/bench/bench_pretrain.py's matmul_roofline).

  python -m scripts.bench.bench_accelerator                           # CPU: tiny shapes, ~3 min; GPU: the sizes below
  python -m scripts.bench.bench_accelerator --models=gpt2 --size=base --steps=20 --find_max_batch --output=gpu.json
Sizes (batch x sequence): tiny: every model's tiny config, 8 x 128; small: BERT-small 32 x 128, GPT-2 small
4 x 256, T5-small 16 x 128; base (the GPU default): BERT-Base 256 x 128, GPT-2 small 32 x 1024, T5-small
128 x 512; and at base only, `--models=t5-base`: T5-Base 128 x 512.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from scripts.bench.bench_accelerator_sides import SIZES, build_config, worker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIDES = ("jax", "torch_eager", "torch_compile")
# bf16 dense tensor-core peak per GPU, FLOP/s: NVIDIA's datasheets give it "with sparsity" (twice dense):
# H100 SXM 1,979 -> 989 (H100 PCIe 1,513 -> 756), H200 SXM 1,979 -> 989 (same compute as H100 SXM), A100
# 312 dense (624 sparse), L4 242 -> 121. First match of the device name wins (PCIe before the H100 default).
GPU_PEAKS = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12), ("L4", 121e12))


# ---------------------------------------------------------------------------------------------
# Configs, batches and FLOPs (shared by the parent and the workers: the same function, the same numbers).
# ---------------------------------------------------------------------------------------------
def t5_lengths(config) -> tuple[int, int]:
    """(encoder, decoder) lengths of span corruption at config.data.max_seq_length: 512 -> 114."""
    from objectives.span_corruption import compute_input_and_target_lengths
    o, seq = config.objective, config.data.max_seq_length
    return seq, compute_input_and_target_lengths(seq, o.noise_density, o.mean_noise_span_length)[1]


def make_batches(model: str, config, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """[steps, B, ...] per key of the objective's batch, random ids in [5, vocab) (0-4: specials)."""
    rng = np.random.default_rng(seed)
    m, B, L = config.model, config.batch_size, config.data.max_seq_length
    vocab = m.vocab_size - config.tokenizer.get("extra_ids", 0)
    ids = lambda *shape: rng.integers(5, vocab, (steps, B, *shape), dtype=np.int32)  # noqa: E731
    ones = lambda *shape, t=np.int32: np.ones((steps, B, *shape), t)  # noqa: E731
    if model == "bert":
        P = config.objective.max_predictions_per_seq
        positions = np.sort(np.argsort(rng.random((steps, B, L - 1)), axis=-1)[..., :P] + 1, axis=-1)  # not [CLS]
        return {"input_ids": ids(L), "segment_ids": np.broadcast_to(np.arange(L) >= L // 2, (steps, B, L)).astype(
                    np.int32), "input_mask": ones(L), "masked_lm_positions": positions.astype(np.int32),
                "masked_lm_ids": ids(P), "masked_lm_weights": ones(P, t=np.float32),
                "next_sentence_labels": rng.integers(0, 2, (steps, B), dtype=np.int32)}
    if model == "gpt2":
        rows = ids(L + 1)  # a window of L + 1 tokens: inputs [:L], next-token targets [1:]
        return {"input_ids": rows[..., :-1], "target_ids": rows[..., 1:], "loss_weights": ones(L, t=np.float32),
                "segment_ids": ones(L), "positions": np.broadcast_to(np.arange(L, dtype=np.int32), (steps, B, L))}
    S, T = t5_lengths(config)
    targets = ids(T)
    decoder_inputs = np.concatenate([np.zeros_like(targets[..., :1]), targets[..., :-1]], axis=-1)  # 0 first
    return {"encoder_input_ids": ids(S), "encoder_segment_ids": ones(S),
            "encoder_positions": np.broadcast_to(np.arange(S, dtype=np.int32), (steps, B, S)),
            "decoder_input_ids": decoder_inputs, "decoder_target_ids": targets, "decoder_segment_ids": ones(T),
            "decoder_positions": np.broadcast_to(np.arange(T, dtype=np.int32), (steps, B, T)),
            "decoder_loss_weights": ones(T, t=np.float32)}


def model_flops(model: str, config) -> tuple[float, int]:
    """-> (model FLOPs of one training step, tokens per step) by the docstring's formula."""
    m, B, L = config.model, config.batch_size, config.data.max_seq_length
    if model == "bert":
        d, f, layers, P = m.hidden_size, m.intermediate_size, m.num_layers, config.objective.max_predictions_per_seq
        matmul = 6 * (layers * (4 * d * d + 2 * d * f) * B * L + (d * d + d * m.vocab_size) * B * P)
        return matmul + 12 * layers * d * L * B * L, B * L
    if model == "gpt2":
        d, layers = m.d_model, m.num_layers
        matmul = 6 * (layers * (4 * d * d + 2 * d * m.d_ff) + d * m.vocab_size) * B * L
        return matmul + 12 * layers * d * L * B * L, B * L
    S, T = t5_lengths(config)
    d, inner, ffn = m.d_model, m.num_heads * m.head_dim, (3 if "gated" in m.feed_forward else 2) * m.d_model * m.d_ff
    enc, dec = m.num_encoder_layers * (4 * d * inner + ffn), m.num_decoder_layers * (8 * d * inner + ffn)
    matmul = 6 * (enc * B * S + dec * B * T + d * m.vocab_size * B * T)
    attention = 12 * inner * (m.num_encoder_layers * S * B * S + m.num_decoder_layers * (T + S) * B * T)
    return matmul + attention, B * (S + T)


def gpu_peak(name: str) -> float | None:
    return next((peak for key, peak in GPU_PEAKS if key.lower() in name.lower()), None)


# ---------------------------------------------------------------------------------------------
# The parent: one worker process per (model, side), then the table.
# ---------------------------------------------------------------------------------------------
def run_worker(work: str, *args: str) -> dict:
    """Runs this module with --worker ... in a fresh interpreter; -> the JSON it wrote (or the error)."""
    out = os.path.join(work, "result.json")
    if os.path.exists(out):
        os.remove(out)
    proc = subprocess.run([sys.executable, "-m", "scripts.bench.bench_accelerator", *args, f"--result_file={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=3600)
    if proc.returncode or not os.path.exists(out):
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
    with open(out) as f:
        return json.load(f)


def find_max_batch(work: str, model: str, side: str, args, start: int, fitted: bool, limit: int = 64) -> int | None:
    """Doubles the batch from `start` (which the main run `fitted` or not) until a try runs out of memory or
    reaches start * limit: -> the last that fitted, None when even `start` did not."""
    fitted, batch = (start, 2 * start) if fitted else (None, start)
    while batch <= start * limit:
        config = build_config(model, args.size, batch, args.seq_for[model], True, tuple(args.set))
        path = os.path.join(work, f"{model}_{batch}.npz")
        np.savez(path, **make_batches(model, config, 3))
        result = run_worker(work, f"--worker={model}:{side}", f"--size={args.size}", f"--batch={batch}",
                            f"--seq={args.seq_for[model]}", "--accelerator", f"--batches={path}", "--warmup=1",
                            *[f"--set={s}" for s in args.set])
        os.remove(path)
        if not result.get("times"):
            break  # out of memory (or another failure: its message is in the main run's table if it recurs)
        fitted, batch = batch, batch * 2
    return fitted


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="", help="comma-separated (default: every model of the size)")
    p.add_argument("--size", default="", choices=["", *SIZES], help="default: tiny on a CPU, base on a GPU")
    p.add_argument("--steps", type=int, default=0, help="timed + warm-up steps (default: 10 CPU, 30 GPU)")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps (compilation happens here)")
    p.add_argument("--batch", type=int, default=0, help="sequences per step (default: the size's, per model)")
    p.add_argument("--seq", type=int, default=0, help="tokens per sequence (T5: encoder; default: the size's)")
    p.add_argument("--no_compile", action="store_true", help="skip the torch.compile side (the CPU default)")
    p.add_argument("--compile", action="store_true", help="run the torch.compile side on a CPU too (slow)")
    p.add_argument("--find_max_batch", action="store_true", help="GPU only: the largest batch each side fits")
    p.add_argument("--torch_threads", type=int, default=0, help="PyTorch's CPU threads (default: all cores, as "
                   "XLA uses); on a CPU shared with other jobs 1 can be far faster (OpenMP waits on busy cores)")
    p.add_argument("--sides", default=",".join(SIDES), help="which sides run (a subset of the default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config setting for both sides (repeatable); a MODEL: prefix keeps it to that model, "
                   "e.g. bert:model.attention_dropout_rate=0.0")
    p.add_argument("--markdown", default="", help="write the table as Markdown here")
    p.add_argument("--peak_tflops", type=float, default=0.0, help="the GPU's peak instead of the table's")
    p.add_argument("--output", default="", help="write the results as JSON here")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)  # MODEL:SIDE, run by the parent
    for hidden in ("--result_file", "--batches"):
        p.add_argument(hidden, default="", help=argparse.SUPPRESS)
    p.add_argument("--accelerator", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> None:
    p = make_parser()
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    with tempfile.TemporaryDirectory() as work:
        device = run_worker(work, "--worker=probe:jax")  # no JAX in this process: it would hold the GPU
        if "error" in device:
            raise SystemExit(f"probing the device failed: {device['error']}")
        accelerator = device["backend"] == "gpu"
        size = args.size or ("base" if accelerator else "tiny")
        steps = args.steps or (30 if accelerator else 10)
        compile_side = accelerator and not args.no_compile or args.compile
        peak = (args.peak_tflops * 1e12 or gpu_peak(device["kind"])) if accelerator else device["roofline"]
        asked = [s for s in args.sides.split(",") if s]
        sides = [s for s in SIDES if s in asked and (compile_side or s != "torch_compile")]
        models = [m for m in args.models.split(",") if m] or list(SIZES[size])
        if set(models) - set(SIZES[size]) or set(asked) - set(SIDES) or args.warmup >= steps:
            p.error(f"--models takes {','.join(SIZES[size])}; --sides takes {','.join(SIDES)}; "
                    "--steps must exceed --warmup")
        args.size, args.seq_for = size, {}
        if not accelerator:
            what = f"{peak / 1e9:.1f} GFLOP/s (float32 matmul roofline, measured)"
        else:
            what = f"{peak / 1e12:.0f} TFLOP/s (bf16 dense)" if peak else "unknown: no MFU (give --peak_tflops)"
        print(f"device: {device['kind']} ({'bf16 compute, float32 params' if accelerator else 'float32'}); "
              f"peak {what}", flush=True)
        if not compile_side:
            print("torch.compile side skipped" + ("" if accelerator else " (the CPU default: on the 2-core dev "
                  "machine Inductor's first step took 65 s for BERT tiny, XLA's 20 s; --compile runs it)"), flush=True)
        results = {"device": device["kind"], "accelerator": accelerator, "size": size, "steps": steps,
                   "settings": args.set,
                   "torch_threads": None if accelerator else args.torch_threads or os.cpu_count(),
                   "warmup": args.warmup, "peak_flops": peak, "models": {}}
        for model in models:
            results["models"][model] = bench_model(work, model, size, sides, steps, args, accelerator, peak)
    print_table(results, args.find_max_batch and accelerator)
    if args.markdown:
        write_markdown(results, args.markdown)
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            json.dump(results, f, indent=2)


def bench_model(work: str, model: str, size: str, sides: list[str], steps: int, args, accelerator: bool,
                peak: float) -> dict:
    """One model's steps on every side (each in a worker process of its own), the same batches for all; -> its
    entry of the results: shape, FLOPs, each side's times and losses, and the time ratios ours / theirs."""
    _, batch, seq = SIZES[size][model]
    batch, seq = args.batch or batch, args.seq or seq
    args.seq_for[model] = seq
    config = build_config(model, size, batch, seq, accelerator, tuple(args.set))
    flops, tokens = model_flops(model, config)
    path = os.path.join(work, f"{model}.npz")
    np.savez(path, **make_batches(model, config, steps))
    entry = {"batch": batch, "seq": seq, "tokens_per_step": tokens, "flops_per_step": flops, "sides": {}}
    for side in sides:
        r = run_worker(work, f"--worker={model}:{side}", f"--size={size}", f"--batch={batch}",
                       f"--seq={seq}", f"--batches={path}", f"--warmup={args.warmup}",
                       f"--torch_threads={args.torch_threads}", *(["--accelerator"] if accelerator else []),
                       *[f"--set={s}" for s in args.set])
        if r.get("times"):
            r["median_step_s"] = float(np.median(r["times"][args.warmup:]))
            r["first_step_s"] = r["times"][0]  # compilation included (XLA's, Inductor's)
            r["tokens_per_s"] = tokens / r["median_step_s"]
            r["mfu"] = flops / r["median_step_s"] / peak if peak else None
        if args.find_max_batch and accelerator:
            r["max_batch"] = find_max_batch(work, model, side, args, batch, "times" in r)
        entry["sides"][side] = r
        print(f"  {model} {side}: " + (f"{r['median_step_s'] * 1e3:.1f} ms/step on {r['device']}"
                                       if "median_step_s" in r else f"failed: {r.get('error')}"), flush=True)
    peers = [s for s in sides if s != "jax"] if "jax" in sides else []  # ratios need ours
    for side in peers:
        ours, theirs = entry["sides"]["jax"].get("median_step_s"), entry["sides"][side].get("median_step_s")
        if ours and theirs:
            entry[f"time_ratio_ours_over_{side}"] = ours / theirs
    return entry


def print_table(results: dict, max_batch: bool) -> None:
    gib = lambda b: "n/a" if b is None else f"{b / 2 ** 30:.2f}"  # noqa: E731
    print(f"\n{'model':6s} {'shape':>10s} {'side':14s} {'params':>12s} {'ms/step':>9s} {'tokens/s':>10s} "
          f"{'MFU':>6s} {'peak GiB':>8s} {'max batch':>9s} {'1st step s':>10s} {'loss@1':>7s} {'loss@end':>8s}")
    for model, entry in results["models"].items():
        for side, r in entry["sides"].items():
            shape = f"{entry['batch']}x{entry['seq']}"
            if "median_step_s" not in r:
                print(f"{model:6s} {shape:>10s} {side:14s} failed: {r.get('error')}")
                continue
            mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
            fits = str(r.get("max_batch")) if max_batch else "n/a"
            print(f"{model:6s} {shape:>10s} {side:14s} {r['params']:12,d} {r['median_step_s'] * 1e3:9.1f} "
                  f"{r['tokens_per_s']:10,.0f} {mfu:>6s} {gib(r.get('peak_bytes')):>8s} {fits:>9s} "
                  f"{r['first_step_s']:10.1f} {r['losses'][0]:7.3f} {r['losses'][-1]:8.3f}")
    print("\ntime per step, ours / theirs (below 1: ours is faster)")
    for model, entry in results["models"].items():
        ratios = [f"{k.rsplit('over_', 1)[1]} {v:.2f}" for k, v in entry.items() if k.startswith("time_ratio")]
        print(f"  {model}: {', '.join(ratios) or 'n/a'};  model FLOPs/step {entry['flops_per_step'] / 1e9:.2f} G, "
              f"{entry['tokens_per_step']:,} tokens/step")


def write_markdown(results: dict, path: str) -> None:
    """The table as Markdown: one row per (model, side), the ratios to ours in the last column."""
    settings = ", ".join(results["settings"]) or "the configs' own"
    lines = [f"Device: {results['device']}; size {results['size']}; {results['steps']} steps "
             f"({results['warmup']} warm-up); settings: {settings}.", "",
             "| model | batch x seq | side | ms/step | tokens/s | MFU | peak GiB | 1st step s | ours / this side |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for model, entry in results["models"].items():
        for side, r in entry["sides"].items():
            cells = [model, f"{entry['batch']} x {entry['seq']}", side]
            if "median_step_s" not in r:
                lines.append("| " + " | ".join(cells + [f"failed: {r.get('error')}"] + [""] * 5) + " |")
                continue
            ratio = entry.get(f"time_ratio_ours_over_{side}")
            cells += [f"{r['median_step_s'] * 1e3:.1f}", f"{r['tokens_per_s']:,.0f}",
                      "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}",
                      "n/a" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 2 ** 30:.2f}",
                      f"{r['first_step_s']:.1f}", "" if ratio is None else f"{ratio:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
