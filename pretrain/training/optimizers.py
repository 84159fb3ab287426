"""Optimizers and learning-rate schedules (optax).

BERT's recipe (`adamw`): AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 on every weight except
LayerNorm parameters and biases), linear warmup then linear decay to zero, global-norm clipping 1.0.

T5's recipe (`adafactor`, Raffel et al. 2020 Sec. 3.1.2 and t5x's Adafactor): factored second moments
with decay 1 - t^-0.8, update clipping at RMS 1.0, steps relative to each weight's RMS, no momentum,
and the inverse-square-root schedule 1/sqrt(max(step, 10^4)) (learning_rate 1.0, warmup_steps 10^4).

ALBERT's recipe (`lamb`, You et al. 2020, as ALBERT's released lamb_optimizer.py): Adam's moments (b1 0.9,
b2 0.999, eps 1e-6), weight decay 0.01 and the layer-wise trust ratio ||w|| / ||update||, both on every weight
except LayerNorm parameters and biases, with BERT's warmup, linear decay and clipping (see `lamb`).

The optimizers and the schedules are registries (models/registry.py): each registers beside its definition with the
config keys it reads and their ranges (pretrain/training/config_keys.py), which validation checks. The learning rate's
path: configs/common.py (config.optimizer.learning_rate) -> the loop that builds the optimizer (pretrain/loops/setup.py,
finetuning.py, adaptation.py) -> this file (a schedule, then the optimizer) -> optax.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from models.registry import Registry
from pretrain.runtime.errors import ConfigError
from pretrain.training import config_keys
from pretrain.training.config_keys import (BOOLEAN, FRACTION, NON_NEGATIVE_FLOAT, POSITIVE, POSITIVE_FLOAT, SHARE,
                                           UNIT_INTERVAL_OPEN, integer, number)
from pretrain.training.scalings import scale_by_adam_uncorrected, scale_by_factored_rms

# A schedule: (config.optimizer, num_train_steps, warmup_steps) -> optax.Schedule. Every one reads learning_rate.
SCHEDULES = config_keys.chosen_by("optimizer.schedule", Registry("schedule", "config.optimizer.schedule", ConfigError),
                                  learning_rate=POSITIVE_FLOAT)
# An optimizer: (config.optimizer, schedule) -> optax.GradientTransformation, before clipping and the batch ramp
# (make_optimizer's, whose keys every optimizer shares).
OPTIMIZERS = config_keys.chosen_by("optimizer.name", Registry("optimizer", "config.optimizer.name", ConfigError),
                                   grad_clip_norm=NON_NEGATIVE_FLOAT, ramp_accumulation=POSITIVE, ramp_fraction=SHARE)
# warmup_steps -1: fine-tuning derives it from config.warmup_fraction (pretrain/loops/finetuning.py)
WARMUP_KEYS = dict(warmup_steps=integer(-1))
DECAY_KEYS = dict(WARMUP_KEYS, end_learning_rate=NON_NEGATIVE_FLOAT)


def learning_rate_schedule(config: ml_collections.ConfigDict, num_train_steps: int,
                           warmup_steps: int | None = None) -> optax.Schedule:
    """config.optimizer.schedule's learning rate over `num_train_steps`, warming up over `warmup_steps` (default:
    config.warmup_steps; a run whose steps are derived at run time passes its own, pretrain/loops/budget.py)."""
    warmup = config.get("warmup_steps", 0) if warmup_steps is None else warmup_steps
    return SCHEDULES.get(config.schedule)(config, num_train_steps, warmup)


def _after_warmup(peak: float, warmup: int, after: optax.Schedule) -> optax.Schedule:
    """0 -> peak over `warmup` steps, then `after` (counted from the end of the warmup)."""
    return optax.join_schedules([optax.linear_schedule(0.0, peak, max(warmup, 1)), after], [warmup])


@config_keys.declare(SCHEDULES, "warmup_linear_decay", **DECAY_KEYS)
def warmup_linear_decay(config: ml_collections.ConfigDict, total: int, warmup: int) -> optax.Schedule:
    """0 -> peak over warmup_steps, then linear to end_learning_rate at num_train_steps (BERT)."""
    peak = config.learning_rate
    return _after_warmup(peak, warmup, optax.linear_schedule(peak, config.end_learning_rate, max(total - warmup, 1)))


@config_keys.declare(SCHEDULES, "warmup_cosine_decay", **DECAY_KEYS)
def warmup_cosine_decay(config: ml_collections.ConfigDict, total: int, warmup: int) -> optax.Schedule:
    """The same warmup, then half a cosine from peak down to end_learning_rate at num_train_steps (nanoGPT's get_lr;
    GPT-3, Brown et al. 2020, Appendix B)."""
    peak = config.learning_rate
    alpha = config.end_learning_rate / peak if peak else 0.0  # optax's floor is a fraction of the peak
    return _after_warmup(peak, warmup, optax.cosine_decay_schedule(peak, max(total - warmup, 1), alpha=alpha))


@config_keys.declare(SCHEDULES, "warmup_stable_decay", **DECAY_KEYS, decay_fraction=SHARE)
def warmup_stable_decay(config: ml_collections.ConfigDict, total: int, warmup: int) -> optax.Schedule:
    """ModernBERT's trapezoid (Warner et al. 2024; Hägele et al. 2024): the warmup, the peak held, then over the last
    `decay_fraction` of the steps a 1-sqrt decay, peak * (1 - sqrt(t)) + end * sqrt(t) for t from 0 to 1."""
    peak = config.learning_rate
    return _after_warmup(peak, warmup, _stable_decay(peak, config.end_learning_rate, max(total - warmup, 1),
                                                     config.get("decay_fraction", 0.1)))


@config_keys.declare(SCHEDULES, "constant", **WARMUP_KEYS)
def constant(config: ml_collections.ConfigDict, total: int, warmup: int) -> optax.Schedule:
    """The peak after the warmup, for short experiments."""
    return _after_warmup(config.learning_rate, warmup, optax.constant_schedule(config.learning_rate))


@config_keys.declare(SCHEDULES, "rsqrt", **WARMUP_KEYS)
def rsqrt(config: ml_collections.ConfigDict, total: int, warmup: int) -> optax.Schedule:
    """T5: learning_rate / sqrt(max(step, warmup_steps)), flat during the warmup; T5 pre-trains with learning_rate 1.0
    and warmup_steps 10^4, i.e. 0.01 for 10^4 steps, then 1/sqrt(step)."""
    peak, floor = config.learning_rate, float(max(warmup, 1))  # step 0 with no warmup would divide by zero
    return lambda step: peak * jax.lax.rsqrt(jnp.maximum(jnp.asarray(step, jnp.float32), floor))


@config_keys.declare(SCHEDULES, "slanted_triangular", cut_frac=FRACTION,
                     ratio=number(1, what="a number >= 1"))  # the share of the steps that rise; peak / lowest rate
def slanted_triangular_schedule(config: ml_collections.ConfigDict, total: int, warmup: int) -> optax.Schedule:
    """ULMFiT's (see `slanted_triangular`); warmup_steps is not read (its rise is the warmup)."""
    return slanted_triangular(config.learning_rate, total, config.get("cut_frac", 0.1), config.get("ratio", 32.0))


def slanted_triangular(peak: float, total: int, cut_frac: float = 0.1, ratio: float = 32.0) -> optax.Schedule:
    """ULMFiT's slanted triangular learning rates (Howard & Ruder 2018, Section 3.2, eq. 3): over T = `total` steps,
    cut = floor(T * cut_frac), p = t / cut before the cut and 1 - (t - cut) / (cut * (1 / cut_frac - 1)) after it,
    lr_t = peak * (1 + p * (ratio - 1)) / ratio: a short linear rise from peak / ratio to the peak at step cut, then
    a long linear fall back to peak / ratio at step T (the paper's cut_frac 0.1, ratio 32).

    The fall's length cut * (1 / cut_frac - 1) is T - cut when T * cut_frac is whole; otherwise the floor shortens
    it and the paper's p goes below 0 before step T (T = 105: p(T) = -0.06, a negative rate at ratio 32). Here the
    fall spans T - cut whatever T, so the rate is the paper's wherever T * cut_frac is whole and always ends at
    peak / ratio; p stays in [0, 1] past T. cut is at least 1 (a handful of steps would otherwise divide by 0)."""
    cut = max(int(np.floor(total * cut_frac + 1e-9)), 1)  # + 1e-9: 0.29 * 100 is 28.999... in floating point
    fall = max(total - cut, 1)

    def schedule(step):
        t = jnp.asarray(step, jnp.float32)
        p = jnp.where(t < cut, t / cut, 1.0 - (t - cut) / fall)
        return peak * (1.0 + jnp.clip(p, 0.0, 1.0) * (ratio - 1.0)) / ratio
    return schedule


def _stable_decay(peak: float, end: float, steps: int, decay_fraction: float) -> optax.Schedule:
    """`steps` at the peak, the last decay_fraction of them (in [0, 1]: config validation) decaying as 1 - sqrt to
    `end`."""
    decay_steps = max(int(round(decay_fraction * steps)), 1)
    stable = steps - decay_steps

    def schedule(step):
        t = jnp.clip((jnp.asarray(step, jnp.float32) - stable) / decay_steps, 0.0, 1.0)
        return peak + (end - peak) * jnp.sqrt(t)
    return schedule


def weight_decay_mask(params: Any) -> Any:
    """True for weights that decay: every kernel / embedding, never LayerNorm scales or biases."""
    def decays(path, _):
        # Only dict keys name parameters; nn.Partitioned boxes add a `.value` attribute step.
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return names[-1] not in ("bias", "scale")
    return jax.tree_util.tree_map_with_path(decays, params)


def adafactor(learning_rate: optax.ScalarOrSchedule, *, decay_rate: float = 0.8, clipping_threshold: float = 1.0,
              multiply_by_parameter_scale: bool = True, weight_decay: float = 0.0, epsilon1: float = 1e-30,
              epsilon2: float = 1e-3, min_dim_size_to_factor: int = 128) -> optax.GradientTransformation:
    """optax.adafactor (momentum None) with t5x's factorization of weights of rank > 2.

    optax.adafactor's stages: factored RMS scaling (ours: see scalings.factored_dims), update clipping at RMS
    `clipping_threshold` (0: off), times max(RMS(weight), epsilon2) when `multiply_by_parameter_scale`,
    times the learning rate. Weight decay (T5: none) is added before the learning rate, on the
    weights of `weight_decay_mask`, so a step subtracts lr * weight_decay * w as our AdamW does
    (optax.adamw); t5x and optax.adafactor subtract weight_decay * w whatever the rate, transformers'
    Adafactor lr * RMS(w) * weight_decay * w. A BERT config's 0.01 thus stays harmless here.
    """
    return optax.chain(
        scale_by_factored_rms(decay_rate, epsilon1, min_dim_size_to_factor),
        optax.clip_by_block_rms(clipping_threshold) if clipping_threshold else optax.identity(),
        optax.scale_by_param_block_rms(epsilon2) if multiply_by_parameter_scale else optax.identity(),
        optax.add_decayed_weights(weight_decay, mask=weight_decay_mask) if weight_decay else optax.identity(),
        optax.scale_by_learning_rate(learning_rate),  # flips the sign: descent
    )


def lamb(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
         weight_decay: float = 0.01) -> optax.GradientTransformation:
    """LAMB (You et al. 2020) with the semantics of ALBERT's lamb_optimizer.py: per weight w,
    r = m / (sqrt(v) + eps) (`scale_by_adam_uncorrected`), r += weight_decay * w, then
    w -= lr * ||w|| / ||r|| * r (ratio 1 where either norm is 0). Both the decay and the trust ratio skip
    LayerNorm parameters and biases (`weight_decay_mask`): ALBERT passes exclude_from_weight_decay
    ["LayerNorm", "layer_norm", "bias"] and exclude_from_layer_adaptation defaults to it. optax.lamb applies
    the ratio to every weight, which would make each step of a LayerNorm scale lr * ||scale|| long (lr * sqrt(H)
    at its initial ones) whatever its gradient."""
    return optax.chain(
        scale_by_adam_uncorrected(b1, b2, eps),
        optax.add_decayed_weights(weight_decay, mask=weight_decay_mask) if weight_decay else optax.identity(),
        optax.masked(optax.scale_by_trust_ratio(), weight_decay_mask),
        optax.scale_by_learning_rate(learning_rate),  # flips the sign: descent
    )


# ----------------------------------------------------------------------------------------------
# The registered optimizers: config.optimizer -> the transformation at `schedule`.

ADAM_KEYS = dict(b1=UNIT_INTERVAL_OPEN, b2=UNIT_INTERVAL_OPEN, eps=POSITIVE_FLOAT, weight_decay=NON_NEGATIVE_FLOAT)


@config_keys.declare(OPTIMIZERS, "adamw", **ADAM_KEYS)
def adamw_of(config: ml_collections.ConfigDict, schedule: optax.Schedule) -> optax.GradientTransformation:
    """BERT's AdamW, weight decay on `weight_decay_mask`'s weights."""
    return optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay,
                       mask=weight_decay_mask)


@config_keys.declare(OPTIMIZERS, "adafactor", decay_rate=number(0, 1, low_open=True),
                     clipping_threshold=NON_NEGATIVE_FLOAT, multiply_by_parameter_scale=BOOLEAN,
                     weight_decay=NON_NEGATIVE_FLOAT)
def adafactor_of(config: ml_collections.ConfigDict, schedule: optax.Schedule) -> optax.GradientTransformation:
    """T5's Adafactor; a key the config lacks takes T5's value (decay_rate 0.8, clipping_threshold 1.0,
    multiply_by_parameter_scale True, weight_decay 0)."""
    return adafactor(schedule, decay_rate=config.get("decay_rate", 0.8),
                     clipping_threshold=config.get("clipping_threshold", 1.0),
                     multiply_by_parameter_scale=config.get("multiply_by_parameter_scale", True),
                     weight_decay=config.get("weight_decay", 0.0))


@config_keys.declare(OPTIMIZERS, "lamb", **ADAM_KEYS)
def lamb_of(config: ml_collections.ConfigDict, schedule: optax.Schedule) -> optax.GradientTransformation:
    """ALBERT's LAMB."""
    return lamb(schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay)


def with_head_learning_rate(tx: optax.GradientTransformation, params: dict, head_learning_rate: float,
                            learning_rate: float, head: str = "head") -> optax.GradientTransformation:
    """The fresh task head (params[head]) at its own peak learning rate, on the same schedule: its updates are
    scaled by head_learning_rate / learning_rate. A head of two layers trained from scratch (span NER) learns
    too slowly at the 2e-5..1e-4 that suit the pretrained encoder."""
    if head not in params:
        raise ConfigError(f"config.head_learning_rate applies to a task head ('{head}'), which this model does not "
                          f"have (its parameters: {', '.join(params)}); set it to 0")
    return optax.chain(tx, optax.masked(optax.scale(head_learning_rate / learning_rate),
                                        {name: name == head for name in params}))


def ramp_plan(num_train_steps: int, final: int, ramp_fraction: float) -> np.ndarray:
    """Micro-batches per update [U] of a batch-size ramp over `num_train_steps` micro-batches: the update that
    starts at micro-batch m accumulates 1 + floor((final - 1) * min(m / (ramp_fraction * num_train_steps), 1)),
    so the batch grows linearly from one micro-batch to `final` of them, reached at ramp_fraction of the run."""
    ramp_steps, plan, step = max(ramp_fraction * num_train_steps, 1.0), [], 0
    while step < num_train_steps:
        plan.append(1 + int((final - 1) * min(step / ramp_steps, 1.0)))
        step += plan[-1]
    return np.asarray(plan, np.int32)


def with_batch_ramp(build: Callable[[optax.Schedule], optax.GradientTransformation], schedule: optax.Schedule,
                    num_train_steps: int, final: int, ramp_fraction: float) -> optax.GradientTransformation:
    """Cramming's batch-size ramp (Geiping & Goldstein 2022, `batch_size_ramp`): optax.MultiSteps averages the
    gradients of ramp_plan's groups of micro-batches and the optimizer `build(schedule)` takes one update per group,
    so the batch grows from config.batch_size to `final` times it while every trainer step keeps one shape; a step
    that ends no group changes nothing. `schedule` is over trainer steps, as the step logs it: each update takes
    its rate at the step that ends its group."""
    plan = ramp_plan(num_train_steps, final, ramp_fraction)
    group_size, group_end, last = jnp.asarray(plan), jnp.asarray(np.cumsum(plan) - 1), plan.size - 1
    tx = build(lambda update: schedule(group_end[jnp.minimum(update, last)]))
    return optax.MultiSteps(tx, every_k_schedule=lambda update: group_size[jnp.minimum(update, last)]
                            ).gradient_transformation()


def make_optimizer(config: ml_collections.ConfigDict, num_train_steps: int,
                   schedule: optax.Schedule | None = None) -> optax.GradientTransformation:
    """config = config.optimizer. Clipping by global norm (grad_clip_norm; 0 = off) comes first, as in
    BERT (clip the raw gradient), then the optimizer config.name registers. `schedule`: the one the loop built
    (and the step logs); learning_rate_schedule(config, num_train_steps) when none is given (tests, tools).
    ramp_accumulation > 1: the batch-size ramp of `with_batch_ramp` (clipping sees the averaged gradient)."""
    schedule = schedule or learning_rate_schedule(config, num_train_steps)
    if config.get("ramp_accumulation", 1) > 1:
        return with_batch_ramp(lambda rate: _clipped_optimizer(config, rate), schedule, num_train_steps,
                               config.ramp_accumulation, config.ramp_fraction)
    return _clipped_optimizer(config, schedule)


def _clipped_optimizer(config: ml_collections.ConfigDict, schedule: optax.Schedule) -> optax.GradientTransformation:
    """config.optimizer's optimizer at `schedule`, after clipping by global norm."""
    tx = OPTIMIZERS.get(config.name)(config, schedule)
    clip = optax.clip_by_global_norm(config.grad_clip_norm) if config.get("grad_clip_norm") else optax.identity()
    return optax.chain(clip, tx)
