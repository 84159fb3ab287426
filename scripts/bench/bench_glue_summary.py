"""bench_glue.py's summaries: per (task, method), each side's runs over seeds (mean ± std of the dev metrics,
wall time, peak memory, trainable parameters), the check ours against HF, and the table in docs/benchmarks.md."""
from __future__ import annotations

import numpy as np

SIDES = {"ours": "jax/flax (ours)", "hf": "pytorch/transformers"}
COLUMNS = {"ours": "ours", "hf": "transformers (+ peft)"}  # the docs table's score columns

LABELS = {"cola": "CoLA", "sst2": "SST-2", "stsb": "STS-B"}  # the others: upper case


def pm(mean_std: tuple[float, float], digits: int = 1, *, runs: int) -> str:
    """'mean ± std' over `runs` runs; the mean alone for one run, which has no spread to show (runs has no
    default: a default of 2 printed ± 0 for single seeds)."""
    return f"{mean_std[0]:.{digits}f}" + (f" ± {mean_std[1]:.{digits}f}" if runs > 1 else "")


def mean_std(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def pooled(a: tuple[float, float], n_a: int, b: tuple[float, float], n_b: int) -> tuple[float, float]:
    """mean_std of two groups' union from each group's mean and std (Chan et al.'s parallel update), exact
    up to their rounding: rows whose runs are gone (--prior) join the runs measured since."""
    if not n_a or not n_b:
        return a if n_a else b
    n = n_a + n_b
    squares = a[1] ** 2 * (n_a - 1) + b[1] ** 2 * (n_b - 1) + (a[0] - b[0]) ** 2 * n_a * n_b / n
    return (n_a * a[0] + n_b * b[0]) / n, float(np.sqrt(squares / (n - 1)))


def side_summary(results: list[dict], split: str, names: list[str]) -> dict:
    """One side's runs of one (task, method): each metric's mean/std over seeds (x100), time, memory, size."""
    rss = [r["peak_rss_mib"] for r in results if r.get("peak_rss_mib") is not None]
    trainable, total = results[0].get("trainable_parameters"), results[0].get("parameters")
    return {"seeds": [r["seed"] for r in results],
            "metrics": {m: mean_std([100 * r["metrics"][split][m] for r in results]) for m in names},
            "best_epochs": [r["best_epoch"] for r in results],
            "wall_sec": mean_std([r["bench_wall_sec"] for r in results]),
            "train_sec": mean_std([r["train_time_sec"] for r in results]),
            "peak_rss_mib": mean_std(rss) if rss else None,  # runs from before it was measured: None
            "trainable_parameters": trainable, "parameters": total,
            "trainable_percent": 100 * trainable / total if trainable and total else None}


def with_prior(side: dict | None, prior: dict, metric: str) -> dict:
    """Our side_summary (None: no run since) joined with a --prior cell's seeds (bench_ledger.read_prior).
    The prior kept the main metric, wall time and peak memory only, so the joined row has just those over
    all its seeds (train s: None; best epochs: the runs' since). A count that differs is another grid."""
    if side is None:  # no run since: an empty side of the prior's counts (pooled ignores a group of 0)
        trainable, total = prior["trainable_parameters"], prior["parameters"]
        side = {"seeds": [], "metrics": {metric: (0.0, 0.0)}, "best_epochs": [], "wall_sec": (0.0, 0.0),
                "peak_rss_mib": (0.0, 0.0), "trainable_parameters": trainable, "parameters": total,
                "trainable_percent": 100 * trainable / total}
    elif side["trainable_parameters"] != prior["trainable_parameters"]:
        raise ValueError(f"--prior's {prior['task']} {prior['method']} trained {prior['trainable_parameters']:,} "
                         f"parameters, its runs since {side['trainable_parameters']:,}: not the same grid")
    n, m = len(side["seeds"]), len(prior["seeds"])
    return {**side, "seeds": sorted(prior["seeds"] + side["seeds"]), "prior_seeds": prior["seeds"],
            "metrics": {metric: pooled(tuple(prior["score"]), m, side["metrics"][metric], n)},
            "wall_sec": pooled(tuple(prior["wall_sec"]), m, side["wall_sec"], n),
            "peak_rss_mib": pooled(tuple(prior["peak_rss_mib"]), m, side["peak_rss_mib"], n),
            "train_sec": None}


def summarize(task_name: str, method: str, lr: float, runs: dict[str, list[dict]], prior: dict | None = None
              ) -> dict:
    """Per side: side_summary, ours joined with prior (a --prior cell) if given; with both sides the
    main-metric check and the ratios ours / HF."""
    from pretrain.tasks.glue import data as glue
    task = glue.get_task(task_name)
    split = task.dev_splits[0]
    out = {"method": method, "learning_rate": lr, "main_metric": task.main_metric, "split": split,
           "sides": {side: side_summary(results, split, list(task.metrics)) for side, results in runs.items()
                     if results}}
    if prior is not None:
        out["sides"]["ours"] = with_prior(out["sides"].get("ours"), prior, task.main_metric)
    if len(out["sides"]) < 2:
        out["passed"] = None  # nothing to compare with (adapters, or --sides with one side)
        return out
    ours, hf = out["sides"]["ours"], out["sides"]["hf"]
    mine, ref = ours["metrics"][task.main_metric], hf["metrics"][task.main_metric]
    out["difference"] = mine[0] - ref[0]
    out["tolerance"] = max(1.0, ref[1], mine[1])
    out["passed"] = abs(out["difference"]) <= out["tolerance"]
    for key in ("wall_sec", "train_sec", "peak_rss_mib"):
        out[key.rsplit("_", 1)[0] + "_ratio"] = ours[key][0] / hf[key][0] if ours[key] and hf[key] else None
    return out


def rerun_summary(task: str, method: str, seed: int, first: dict, second: dict, hf: dict) -> dict:
    """Wall time of our first run (empty cache) and second run (warm), beside HF's same (task, method, seed)."""
    return {"task": task, "method": method, "seed": seed, "hf_wall_sec": hf["bench_wall_sec"],
            "first_wall_sec": first["bench_wall_sec"], "first_cache_entries": first.get("cache_entries_before"),
            "second_wall_sec": second["bench_wall_sec"], "second_cache_entries": second.get("cache_entries_before"),
            "first_ratio": first["bench_wall_sec"] / hf["bench_wall_sec"],
            "second_ratio": second["bench_wall_sec"] / hf["bench_wall_sec"]}


def print_rerun(r: dict) -> None:
    cold = "empty cache" if r["first_cache_entries"] == 0 else f"cache held {r['first_cache_entries']} entries"
    print(f"\nfirst and second run, {r['task']} {r['method']} seed {r['seed']} (wall s; ours / HF in brackets):")
    print(f"  ours, 1st run ({cold}): {r['first_wall_sec']:.0f} s ({r['first_ratio']:.2f})")
    print(f"  ours, 2nd run ({r['second_cache_entries']} cache entries): {r['second_wall_sec']:.0f} s "
          f"({r['second_ratio']:.2f})")
    print(f"  {SIDES['hf']}: {r['hf_wall_sec']:.0f} s")


def count(side: dict) -> str:
    n, pct = side["trainable_parameters"], side["trainable_percent"]
    return "n/a" if n is None else f"{n:,}" + (f" ({pct:.3g}%)" if pct is not None else "")


def print_summary(summary: dict[str, dict[str, dict]], args) -> None:
    print(f"\nGLUE dev, {args.epochs} epochs, batch {args.batch_size}, max length {args.max_seq_length}, seeds "
          f"{args.seeds}; metrics x100 as mean ± std over seeds at each run's best epoch.")
    print("wall s: a whole run, process start + imports + data + model load + training + dev evals (ours also JAX "
          "compilation and saving the best epoch's checkpoint; no test-set predictions on either side).\n"
          "train s: the epochs' loops with their dev evals (ours still compiles there). HF pads each batch to its "
          "longest sequence, ours to that rounded up to a multiple of 8 and then a length bucket.\n"
          "peak MiB: the run process's maximum resident set (ru_maxrss).")
    for task, methods in summary.items():
        for method, s in methods.items():
            names = list(dict.fromkeys(m for row in s["sides"].values() for m in row["metrics"]))
            header = "".join(f"{m:>16s}" for m in names) + f"{'wall s':>12s}{'train s':>12s}{'peak MiB':>12s}"
            print(f"\n{task} {method}, lr {s['learning_rate']:g} ({s['split']})".ljust(36) + header)
            for side, row in s["sides"].items():
                n = len(row["seeds"])  # one seed: the mean alone, as in the docs table
                cells = "".join(f"{pm(row['metrics'][m], runs=n) if m in row['metrics'] else 'n/a':>16s}"
                                for m in names)  # a row joined with --prior has the main metric alone
                cells += "".join(f"{pm(row[k], 0, runs=n) if row[k] else 'n/a':>12s}"
                                 for k in ("wall_sec", "train_sec", "peak_rss_mib"))
                prior = f" ({' '.join(map(str, row['prior_seeds']))}: --prior)" if row.get("prior_seeds") else ""
                print(f"  {SIDES[side]:34s}{cells}   trainable {count(row)}, "
                      f"seeds {' '.join(map(str, row['seeds']))}{prior}")
            if s["passed"] is None:
                print("  one side only (peft has no adapters, or --sides named one)")
                continue
            ratios = ", ".join(f"{k} {s[k + '_ratio']:.2f}" for k in ("wall", "train", "peak_rss")
                               if s[k + "_ratio"] is not None)
            print(f"  {s['main_metric']}: ours - HF = {s['difference']:+.1f} points (tolerance {s['tolerance']:.1f}) "
                  f"{'PASS' if s['passed'] else 'FAIL'}; ours / HF: {ratios} (below 1: ours is faster or smaller)")


def versus(ours: tuple | None, hf: tuple | None, hf_ran: bool) -> str:
    """'ours / HF (ratio)' of two means: '—' where HF has no such method, n/a where a run did not measure it."""
    def mean(m):
        return "n/a" if m is None else f"{m[0]:,.0f}"
    if ours is None or hf is None:
        return f"{mean(ours)} / {mean(hf) if hf_ran else '—'}"
    return f"{ours[0]:,.0f} / {hf[0]:,.0f} ({ours[0] / hf[0]:.2f})"


def markdown_table(summary: dict[str, dict[str, dict]]) -> str:
    """The docs table (docs/benchmarks.md): one row per (task, method); one side's columns where every row has just that side."""
    sides = {side for methods in summary.values() for s in methods.values() for side in s["sides"]}
    with_hf = len(sides) == 2
    one = "ours" if with_hf else next(iter(sides), "ours")  # the side of a one-sided table
    header = ["task (dev metric)", "method", "lr", "trainable params (% of all)", "seeds", COLUMNS[one]]
    header += ([COLUMNS["hf"], "ours − HF", "wall s per run, ours / HF", "peak RSS MiB, ours / HF"]
               if with_hf else ["wall s per run", "peak RSS MiB per run"])
    rows = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for task, methods in summary.items():
        for method, s in methods.items():
            main, hf = s["sides"][one], s["sides"].get("hf") if with_hf else None  # main: ours, or the one side
            metric, n = s["main_metric"], len(main["seeds"])
            params = count(main)
            if hf and hf["trainable_parameters"] != main["trainable_parameters"]:
                params += f"; HF {count(hf)}"
            cells = [f"{LABELS.get(task, task.upper())} {metric}", "full" if method == "none" else method,
                     f"{s['learning_rate']:g}", params, " ".join(map(str, main["seeds"])),
                     pm(main["metrics"][metric], runs=n)]
            if with_hf:
                cells += [pm(hf["metrics"][metric], runs=len(hf["seeds"])) if hf else "—",
                          f"{s['difference']:+.1f}" if hf else "—",
                          versus(main["wall_sec"], hf and hf["wall_sec"], bool(hf)),
                          versus(main["peak_rss_mib"], hf and hf["peak_rss_mib"], bool(hf))]
            else:
                cells += [pm(main["wall_sec"], 0, runs=n),
                          pm(main["peak_rss_mib"], 0, runs=n) if main["peak_rss_mib"] else "n/a"]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
