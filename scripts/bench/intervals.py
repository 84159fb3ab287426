"""95% confidence intervals for the learning claims the benchmarks print: a mean over seeds, and the difference of two
arms' means (Welch's t, which does not assume that the two arms vary alike: a pretrained arm also varies with its
pretraining run)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

LEVEL = 0.95


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% interval by Student's t); the half-width is nan for one value."""
    values = np.asarray(values, np.float64)
    if values.size < 2:
        return float(values.mean()) if values.size else float("nan"), float("nan")
    sem = values.std(ddof=1) / np.sqrt(values.size)
    return float(values.mean()), float(stats.t.ppf(0.5 + LEVEL / 2, values.size - 1) * sem)


def difference_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(mean(a) - mean(b), the 95% interval's lower and upper end) by Welch's t; nan ends for fewer than 2 each."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    difference = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return difference, float("nan"), float("nan")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = np.sqrt(va + vb)
    if se == 0:
        return difference, difference, difference
    dof = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    half = float(stats.t.ppf(0.5 + LEVEL / 2, dof) * se)
    return difference, difference - half, difference + half


def format_interval(values: Sequence[float]) -> str:
    """'67.4 ± 1.2' (the 95% interval's half-width), or '67.4 (one seed)'."""
    mean, half = mean_interval(values)
    return f"{mean:.1f} (one seed)" if np.isnan(half) else f"{mean:.1f} ± {half:.1f}"


def verdict(name: str, control: str, a: Sequence[float], b: Sequence[float]) -> str:
    """One plain sentence: the difference, its interval, and whether the interval leaves 0 out."""
    difference, low, high = difference_interval(a, b)
    if np.isnan(low):
        return f"{name} - {control}: {difference:+.1f} from one seed each, which cannot separate a gain from noise."
    where = ("better than" if low > 0 else "worse than" if high < 0 else "not distinguishable from")
    return (f"{name} - {control}: {difference:+.1f} points (95% interval {low:+.1f} to {high:+.1f}): {name} is "
            f"{where} {control} at this budget.")
