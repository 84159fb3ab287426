"""ULMFiT's slanted triangular learning rates (Howard & Ruder 2018, Section 3.2, eq. 3) as
config.optimizer.schedule=slanted_triangular, and its keys' checks."""
from __future__ import annotations

import math

import ml_collections
import numpy as np
import pytest

from configs import glue
from pretrain.runtime.errors import ConfigError
from pretrain.training import optimizers, validation

PEAK = 0.01


def paper(t: int, total: int, cut_frac: float, ratio: float) -> float:
    """Eq. 3 as the paper writes it."""
    cut = math.floor(total * cut_frac)
    p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1))
    return PEAK * (1 + p * (ratio - 1)) / ratio


def schedule(total: int, **keys):
    config = ml_collections.ConfigDict(dict(learning_rate=PEAK, warmup_steps=-1, schedule="slanted_triangular",
                                            end_learning_rate=0.0, **keys))
    return optimizers.learning_rate_schedule(config, total)


@pytest.mark.parametrize("total, cut_frac, ratio", [(100, 0.1, 32.0), (1000, 0.1, 32.0), (60, 0.25, 8.0)])
def test_the_rate_is_the_papers_eq_3_at_every_step(total, cut_frac, ratio):
    lr = schedule(total, cut_frac=cut_frac, ratio=ratio)
    cut = math.floor(total * cut_frac)
    for t in (0, cut - 1, cut, cut + 1, total - 1, total):
        assert float(lr(t)) == pytest.approx(paper(t, total, cut_frac, ratio), rel=1e-6), t
    rates = np.array([float(lr(t)) for t in range(total + 1)])
    np.testing.assert_allclose(rates, [paper(t, total, cut_frac, ratio) for t in range(total + 1)], rtol=1e-6)
    assert int(np.argmax(rates)) == cut and rates[cut] == pytest.approx(PEAK, rel=1e-6)
    assert rates[0] == pytest.approx(PEAK / ratio, rel=1e-6) and rates[total] == pytest.approx(PEAK / ratio, rel=1e-6)


def test_the_defaults_are_the_papers_cut_frac_and_ratio():
    config = glue.get_config("task=mrpc")
    assert (config.optimizer.cut_frac, config.optimizer.ratio) == (0.1, 32.0)
    lr = schedule(200)  # a config without the keys: the same defaults
    assert float(lr(20)) == pytest.approx(PEAK) and float(lr(200)) == pytest.approx(PEAK / 32)


def test_a_step_count_the_cut_does_not_divide_still_ends_at_peak_over_ratio_and_never_below():
    """T = 105: the paper's fall of cut * (1/cut_frac - 1) = 90 steps ends before T - cut = 95 and its rate turns
    negative at T; ours falls over the 95 steps."""
    assert paper(105, 105, 0.1, 32.0) < 0
    lr = schedule(105, cut_frac=0.1, ratio=32.0)
    rates = np.array([float(lr(t)) for t in range(110)])
    assert rates.min() == pytest.approx(PEAK / 32, rel=1e-6) and rates[105] == pytest.approx(PEAK / 32, rel=1e-6)
    assert int(np.argmax(rates)) == 10 and np.all(np.diff(rates[10:106]) < 0)


def test_a_run_too_short_for_a_cut_still_peaks_at_step_one():
    lr = schedule(5, cut_frac=0.1, ratio=32.0)  # floor(0.5) = 0: the rise takes one step
    assert float(lr(1)) == pytest.approx(PEAK) and float(lr(5)) == pytest.approx(PEAK / 32)


@pytest.mark.parametrize("key, value, allowed", [
    ("optimizer.cut_frac", 0.0, "a fraction in (0, 1)"), ("optimizer.cut_frac", 1.0, "a fraction in (0, 1)"),
    ("optimizer.ratio", 0.5, "a number >= 1"), ("optimizer.schedule", "slanted", "'slanted_triangular'")])
def test_bad_values_are_one_line_naming_the_key(key, value, allowed):
    config = glue.get_config("task=mrpc")
    config.update_from_flattened_dict({key: value})
    with pytest.raises(ConfigError) as info:
        validation.check_ranges(config)
    message = str(info.value)
    assert "\n" not in message and f"config.{key}={value!r}" in message and allowed in message
    assert f"--config.{key}=" in message
