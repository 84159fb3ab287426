"""The report of scripts/bench/bench_transfer.py, from its curves only (row "arm/recipe" -> label count -> the dev
accuracies x100 of its finished seeds): the table, the labels at which each row matches random at REFERENCE, the aim
line, the plot and the JSON record. Missing cells are "—"."""
from __future__ import annotations

import json

import numpy as np

from scripts.bench import intervals
from scripts.reproduce import reproduction as rp

REFERENCE, AIM = 8000, 1000  # the aim: with AIM labels, what random weights reach with REFERENCE
OURS = ("pretrained", "adapted", "adapted_supervised")  # the arms the aim is about


def control_of(name: str) -> str:
    """The random row of row `name`'s recipe."""
    return "random/" + name.split("/")[1]


def reference(curves: dict[str, dict[int, list[float]]], name: str) -> float:
    """The mean of random at REFERENCE labels under row `name`'s recipe (nan where not run)."""
    values = curves.get(control_of(name), {}).get(REFERENCE, [])
    return float(np.mean(values)) if values else float("nan")


def labels_to_match(curve: dict[int, list[float]], target: float) -> float | None:
    """The smallest label count whose mean reaches `target`: between the two measured counts around the first
    crossing, linear in log(labels); the smallest count where it already does; None where none does."""
    points = [(n, float(np.mean(v))) for n, v in sorted(curve.items()) if v]
    for i, (n, mean) in enumerate(points):
        if mean >= target:
            if i == 0 or mean == target:
                return float(n)
            below, below_mean = points[i - 1]
            share = (target - below_mean) / (mean - below_mean)
            return float(np.exp(np.log(below) + share * (np.log(n) - np.log(below))))
    return None


def match_text(curve: dict[int, list[float]], target: float) -> str:
    measured = [n for n, v in curve.items() if v]
    if np.isnan(target) or not measured:
        return "—"
    value = labels_to_match(curve, target)
    if value is None:
        return f"> {max(measured):,}"
    return f"≤ {value:,.0f}" if value == min(measured) else f"{value:,.0f}"


def cell_text(values: list[float], seeds: int) -> str:
    """'84.1 ± 1.3' (intervals.format_interval), ' (n=7)' where the seeds are not --seeds' count, '—' for none."""
    if not values:
        return "—"
    return intervals.format_interval(values) + (f" (n={len(values)})" if len(values) != seeds else "")


def difference_text(values: list[float], control: list[float]) -> str:
    """'+3.2 [+1.0, +5.4]': the difference of the means and its 95% interval (Welch)."""
    if not values or not control:
        return "—"
    difference, low, high = intervals.difference_interval(values, control)
    return f"{difference:+.1f} [—]" if np.isnan(low) else f"{difference:+.1f} [{low:+.1f}, {high:+.1f}]"


def table(curves: dict[str, dict[int, list[float]]], rates: dict[str, float | None], seeds: int) -> str:
    """Markdown: a row per arm/recipe (a column per label count), then each arm - random of its recipe."""
    labels = sorted({n for curve in curves.values() for n in curve})
    header = ["arm/recipe", "rate", *[f"{n:,}" for n in labels], f"labels to match random@{REFERENCE:,}"]
    rows = [[name, f"{rates[name]:g}" if rates.get(name) else "—",
             *[cell_text(curve.get(n, []), seeds) for n in labels], match_text(curve, reference(curves, name))]
            for name, curve in curves.items()]
    for name, curve in curves.items():
        control = curves.get(control_of(name))
        if control is not None and name != control_of(name):
            rows.append([f"{name} - {control_of(name)}", "",
                         *[difference_text(curve.get(n, []), control.get(n, [])) for n in labels], ""])
    return (f"SST-2 dev accuracy x100 against labels (each count with its carved validation split), mean ± the 95% "
            f"interval's half-width over {seeds} seeds (n=: another number); arm - random of its recipe: the "
            f"difference [its 95% interval, Welch]; — not run (yet):\n\n" + rp.markdown(header, rows))


def best_at(curves: dict[str, dict[int, list[float]]], names: list[str], labels: int) -> str | None:
    names = [name for name in names if curves[name].get(labels)]
    return max(names, key=lambda name: np.mean(curves[name][labels])) if names else None


def aim(curves: dict[str, dict[int, list[float]]]) -> dict | None:
    """The best of our arms at AIM labels against the best random row at REFERENCE and at AIM (None before both)."""
    randoms = [name for name in curves if name.split("/")[0] == "random"]
    best = best_at(curves, [name for name in curves if name.split("/")[0] in OURS], AIM)
    controls = {"vs_reference": (best_at(curves, randoms, REFERENCE), REFERENCE),
                "vs_random": (best_at(curves, randoms, AIM), AIM)}
    if best is None or any(control is None for control, _ in controls.values()):
        return None
    result = {"best": best, "labels": AIM}
    for key, (control, labels) in controls.items():
        difference, low, high = intervals.difference_interval(curves[best][AIM], curves[control][labels])
        result[key] = dict(control=control, labels=labels, difference=difference, low=low, high=high)
    result["above_zero"] = bool(result["vs_random"]["low"] > 0)
    return result


def aim_line(result: dict | None) -> str:
    if result is None:
        return f"Aim: needs one of our arms at {AIM:,} labels and random at {AIM:,} and {REFERENCE:,} (not run yet)."
    parts = [f"{result['best']} at {AIM:,} labels - {d['control']} at {d['labels']:,}: {d['difference']:+.1f} "
             f"[{d['low']:+.1f}, {d['high']:+.1f}]" for d in (result["vs_reference"], result["vs_random"])]
    return f"Aim: {parts[0]}; {parts[1]}, lower end above 0: {'yes' if result['above_zero'] else 'no'}."


def plot(curves: dict[str, dict[int, list[float]]], path: str) -> None:
    """Accuracy against labels (log), a line per arm/recipe in its 95% band (the ceiling dotted), random's mean at
    REFERENCE a dashed line of its colour."""
    with rp.figure(path, "SST-2 labels (with the carved validation split)", "SST-2 dev accuracy x100") as ax:
        colors = {}
        for name, curve in curves.items():
            points = np.array([(n, *intervals.mean_interval(v)) for n, v in sorted(curve.items()) if v])
            if not len(points):
                continue
            labels, means, halves = points[:, 0], points[:, 1], np.nan_to_num(points[:, 2])
            line, = ax.plot(labels, means, marker="o", label=name, linestyle=":" if name.startswith("minilm") else "-")
            colors[name] = line.get_color()
            ax.fill_between(labels, means - halves, means + halves, color=colors[name], alpha=0.15)
        for name in (n for n in curves if n.split("/")[0] == "random" and curves[n].get(REFERENCE)):
            ax.axhline(np.mean(curves[name][REFERENCE]), color=colors[name], linestyle="--", linewidth=1,
                       label=f"{name} at {REFERENCE:,}")
        ax.set_xscale("log")


def finite(value):
    """value for JSON: nan and inf as null, keys as strings."""
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return None if isinstance(value, float) and not np.isfinite(value) else value


def lists(results: dict[str, dict[int, dict[int, float]]]) -> dict[str, dict[int, list[float]]]:
    """row -> labels -> seed -> accuracy, as the curves the other functions take (row -> labels -> accuracies)."""
    return {name: {n: list(by_seed.values()) for n, by_seed in by_labels.items()}
            for name, by_labels in results.items()}


def record(results: dict[str, dict[int, dict[int, float]]], rates: dict, selection: dict) -> dict:
    """Every number: per row its rate and the validation accuracies that chose it, per label count each seed's dev
    accuracy, the mean, the 95% half-width and the difference from random of the recipe with its interval; the labels
    to match random at REFERENCE; the aim."""
    curves, rows = lists(results), {}
    for name, by_labels in results.items():
        control, cells = curves.get(control_of(name), {}), {}
        for n, by_seed in by_labels.items():
            values = list(by_seed.values())
            mean, half = intervals.mean_interval(values)
            minus = (dict(zip(("difference", "low", "high"), intervals.difference_interval(values, control[n])))
                     if values and control.get(n) and name != control_of(name) else None)
            cells[n] = dict(dev=by_seed, mean=mean, half_width=half, minus_random=minus)
        rows[name] = dict(rate=rates.get(name), selection=selection.get(name, {}), cells=cells,
                          labels_to_match=labels_to_match(curves[name], reference(curves, name)))
    return finite(dict(reference_labels=REFERENCE, aim_labels=AIM, rows=rows, aim=aim(curves)))


def report(results: dict[str, dict[int, dict[int, float]]], rates: dict, selection: dict, seeds: int,
           png: str, path: str) -> None:
    """Prints the table and the aim line; writes the plot (png) and the JSON record (path)."""
    curves = lists(results)
    print("\n" + table(curves, rates, seeds))
    print("\n" + aim_line(aim(curves)))
    plot(curves, png)
    with open(path, "w") as f:
        json.dump(record(results, rates, selection), f, indent=1)
    print(f"wrote {path}")
