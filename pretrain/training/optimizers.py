"""Optimizers and learning-rate schedules (optax).

BERT's recipe (`adamw`): AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 on every weight except
LayerNorm parameters and biases), linear warmup then linear decay to zero, global-norm clipping 1.0.

T5's recipe (`adafactor`, Raffel et al. 2020 Sec. 3.1.2 and t5x's Adafactor): factored second moments
with decay 1 - t^-0.8, update clipping at RMS 1.0, steps relative to each weight's RMS, no momentum,
and the inverse-square-root schedule 1/sqrt(max(step, 10^4)) (learning_rate 1.0, warmup_steps 10^4).

ALBERT's recipe (`lamb`, You et al. 2020, as ALBERT's released lamb_optimizer.py): Adam's moments (b1 0.9,
b2 0.999, eps 1e-6), weight decay 0.01 and the layer-wise trust ratio ||w|| / ||update||, both on every weight
except LayerNorm parameters and biases, with BERT's warmup, linear decay and clipping (see `lamb`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from pretrain.runtime.errors import ConfigError

SCHEDULES = ("warmup_linear_decay", "warmup_cosine_decay", "warmup_stable_decay", "constant", "rsqrt",
             "slanted_triangular")
OPTIMIZERS = ("adamw", "adafactor", "lamb")


def learning_rate_schedule(config: ml_collections.ConfigDict, num_train_steps: int) -> optax.Schedule:
    """`warmup_linear_decay`: 0 -> peak over warmup_steps, then linear to end_learning_rate at
    num_train_steps. `warmup_cosine_decay`: the same warmup, then half a cosine from peak down to
    end_learning_rate at num_train_steps (nanoGPT's get_lr; GPT-3, Brown et al. 2020, Appendix B).
    `warmup_stable_decay` (ModernBERT's trapezoid, Warner et al. 2024; Hägele et al. 2024): the warmup, the peak
    held, then over the last `decay_fraction` of the steps a 1-sqrt decay, peak * (1 - sqrt(t)) + end * sqrt(t)
    for t from 0 to 1. `constant` after warmup is also available for short experiments.
    `rsqrt` (T5): learning_rate / sqrt(max(step, warmup_steps)), flat during the warmup; T5 pre-trains
    with learning_rate 1.0 and warmup_steps 10^4, i.e. 0.01 for 10^4 steps, then 1/sqrt(step).
    `slanted_triangular` (ULMFiT): see `slanted_triangular`; warmup_steps is not read (its rise is the warmup)."""
    peak, warmup, total = config.learning_rate, config.warmup_steps, num_train_steps
    if config.schedule == "slanted_triangular":
        return slanted_triangular(peak, total, config.get("cut_frac", 0.1), config.get("ratio", 32.0))
    if config.schedule == "rsqrt":
        floor = float(max(warmup, 1))  # step 0 with no warmup would divide by zero
        return lambda step: peak * jax.lax.rsqrt(jnp.maximum(jnp.asarray(step, jnp.float32), floor))
    warmup_fn = optax.linear_schedule(0.0, peak, max(warmup, 1))
    if config.schedule == "warmup_linear_decay":
        after = optax.linear_schedule(peak, config.end_learning_rate, max(total - warmup, 1))
    elif config.schedule == "warmup_cosine_decay":
        alpha = config.end_learning_rate / peak if peak else 0.0  # optax's floor is a fraction of the peak
        after = optax.cosine_decay_schedule(peak, max(total - warmup, 1), alpha=alpha)
    elif config.schedule == "warmup_stable_decay":
        after = _stable_decay(peak, config.end_learning_rate, max(total - warmup, 1), config.get("decay_fraction", 0.1))
    elif config.schedule == "constant":
        after = optax.constant_schedule(peak)
    else:
        raise ConfigError(f"config.optimizer.schedule={config.schedule!r} is unknown; "
                          f"use one of {', '.join(SCHEDULES)}")
    return optax.join_schedules([warmup_fn, after], [warmup])


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


# ----------------------------------------------------------------------------------------------
# Adafactor with t5x's factorization rules.

# t5x's `standard_logical_factor_rules`: which logical axes are the rows and which the columns of the
# matrix whose second moment is factored. An attention kernel [D, H, K] (embed, heads, kv) is the
# matrix [D, H*K], as T5's Mesh TensorFlow kernels were. Other names (relpos_buckets, classes, ...)
# are not factored.
FACTOR_ROWS = frozenset({"embed"})
FACTOR_COLUMNS = frozenset({"vocab", "mlp", "heads", "kv", "joined_kv"})


def factored_dims(shape: tuple[int, ...], names: tuple[str | None, ...] | None,
                  min_dim_size_to_factor: int = 128) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(row dims, column dims) of a weight's factored second moment, or None for a full one.

    As t5x (adafactor.py, `_parse_rule` with logical factor rules): a weight of rank > 2 is factored
    by its logical axis names, rows `embed` and columns `heads`/`kv`/`mlp`/`vocab`, when it has both
    and nothing else. Rank-2 weights, and weights without names, use Adafactor's original rule (as
    optax): the two largest dims, if the smaller of them has at least `min_dim_size_to_factor`
    entries. optax alone would keep a full moment for every [768, 12, 64] attention kernel, since
    its second largest dim is 64 < 128; T5 factored those kernels.
    """
    if len(shape) < 2:
        return None
    if names is not None and len(shape) > 2:
        rows = tuple(d for d, n in enumerate(names) if n in FACTOR_ROWS)
        cols = tuple(d for d, n in enumerate(names) if n in FACTOR_COLUMNS)
        return (rows, cols) if rows and cols and len(rows) + len(cols) == len(shape) else None
    small, large = (int(d) for d in np.argsort(shape, kind="stable")[-2:])
    return ((small,), (large,)) if shape[small] >= min_dim_size_to_factor else None


@dataclasses.dataclass
class _Scaled:
    """One weight's result; a plain class, so tree maps treat it as a leaf (as optax's _UpdateResult)."""
    update: jax.Array
    moments: tuple[jax.Array, ...]


class FactoredRmsState(NamedTuple):
    count: jax.Array  # updates taken
    # Per weight: (v_row, v_col), each the weight's shape with the other group's dims kept as size 1
    # (so the layout itself says which dims are rows), or (v,) with the weight's shape.
    moments: Any


def scale_by_factored_rms(decay_rate: float = 0.8, epsilon: float = 1e-30,
                          min_dim_size_to_factor: int = 128) -> optax.GradientTransformation:
    """Adafactor's scaling g / sqrt(v_hat) (Shazeer & Stern 2018, Alg. 4 without the update clipping).

    v_hat is a running mean of g^2 + epsilon with decay 1 - (t+1)^-decay_rate at update t (0 at the
    first), kept whole for vectors and as row and column means for factored weights (v_hat = row x
    col / mean(row)). Factoring follows `factored_dims`: `init` needs the weights in their nn.Partitioned
    boxes to see their logical axis names (without them every weight takes the rank-2 rule), and
    boxes the moments with the names that survive, so they shard like the weights; `update` takes
    plain arrays, as the trainer's step passes them. Moments are float32 whatever the weights' dtype,
    as in t5x.
    """
    def init(params):
        def init_one(param):
            boxed = isinstance(param, nn.Partitioned)
            value, names = (param.value, param.names) if boxed else (param, None)
            plan = factored_dims(value.shape, names, min_dim_size_to_factor)
            if plan is None:
                reduced_sets = [()]
            else:
                rows, cols = plan
                reduced_sets = [cols, rows]  # v_row averages over the columns, v_col over the rows

            def moment(reduced):
                shape = tuple(1 if d in reduced else n for d, n in enumerate(value.shape))
                zeros = jnp.zeros(shape, jnp.float32)
                if not boxed:
                    return zeros
                return param.replace(value=zeros, names=tuple(None if d in reduced else n
                                                              for d, n in enumerate(names)))
            return tuple(moment(r) for r in reduced_sets)

        moments = jax.tree.map(init_one, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
        return FactoredRmsState(jnp.zeros([], jnp.int32), moments)

    def update(grads, state, params=None):
        del params
        t = state.count.astype(jnp.float32) + 1.0
        decay = 1.0 - t ** (-decay_rate)

        def update_one(grad, moments):
            g = grad.astype(jnp.float32)
            g2 = jnp.square(g) + epsilon
            if len(moments) == 1:
                v = decay * moments[0] + (1.0 - decay) * g2
                return _Scaled((g * jax.lax.rsqrt(v)).astype(grad.dtype), (v,))
            v_row, v_col = moments
            # A dim reduced in v_row is a column dim; size-1 dims land in both, where a mean is a no-op.
            cols = tuple(d for d, n in enumerate(v_row.shape) if n == 1)
            rows = tuple(d for d, n in enumerate(v_col.shape) if n == 1)
            v_row = decay * v_row + (1.0 - decay) * jnp.mean(g2, axis=cols, keepdims=True)
            v_col = decay * v_col + (1.0 - decay) * jnp.mean(g2, axis=rows, keepdims=True)
            row_factor = jax.lax.rsqrt(v_row / jnp.mean(v_row))
            return _Scaled((g * row_factor * jax.lax.rsqrt(v_col)).astype(grad.dtype), (v_row, v_col))

        # grads' structure is a prefix of the moments' (each weight has a tuple of moments).
        results = jax.tree.map(update_one, grads, state.moments)
        updates = jax.tree.map(lambda r: r.update, results)
        moments = jax.tree.map(lambda r: r.moments, results)
        return updates, FactoredRmsState(optax.safe_increment(state.count), moments)

    return optax.GradientTransformation(init, update)


def adafactor(learning_rate: optax.ScalarOrSchedule, *, decay_rate: float = 0.8, clipping_threshold: float = 1.0,
              multiply_by_parameter_scale: bool = True, weight_decay: float = 0.0, epsilon1: float = 1e-30,
              epsilon2: float = 1e-3, min_dim_size_to_factor: int = 128) -> optax.GradientTransformation:
    """optax.adafactor (momentum None) with t5x's factorization of weights of rank > 2.

    optax.adafactor's stages: factored RMS scaling (ours: see `factored_dims`), update clipping at RMS
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


# ----------------------------------------------------------------------------------------------
# LAMB as ALBERT trained with it.

def scale_by_adam_uncorrected(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6) -> optax.GradientTransformation:
    """m / (sqrt(v) + eps) with m, v Adam's running means of g and g^2 and no bias correction, as ALBERT's
    lamb_optimizer.py (and BERT's AdamWeightDecay) compute it. optax.scale_by_adam always divides m and v by
    1 - b^t: on the weights without a trust ratio (LayerNorm, biases) ALBERT's steps are (1 - b1^t) / sqrt(1 - b2^t)
    times those (3.2x at the first step, 1.3x at step 1000), and ALBERT tuned its learning rate 0.00176 with them.
    The state is optax's ScaleByAdamState, so a checkpoint's optimizer state reads as Adam's."""
    def init(params):
        zeros = optax.tree.zeros_like(params)
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros, nu=zeros)

    def update(grads, state, params=None):
        del params
        mu = optax.tree.update_moment(grads, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(grads, state.nu, b2, 2)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        return updates, optax.ScaleByAdamState(count=optax.safe_increment(state.count), mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


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
    BERT (clip the raw gradient). Adafactor's keys default to T5's values when a config lacks them:
    decay_rate 0.8, clipping_threshold 1.0, multiply_by_parameter_scale True, weight_decay 0. `schedule`:
    learning_rate_schedule(config, num_train_steps), when the caller has built it already (the step logs it).
    ramp_accumulation > 1: the batch-size ramp of `with_batch_ramp` (clipping sees the averaged gradient)."""
    schedule = schedule or learning_rate_schedule(config, num_train_steps)
    if config.get("ramp_accumulation", 1) > 1:
        return with_batch_ramp(lambda rate: _clipped_optimizer(config, rate), schedule, num_train_steps,
                               config.ramp_accumulation, config.ramp_fraction)
    return _clipped_optimizer(config, schedule)


def _clipped_optimizer(config: ml_collections.ConfigDict, schedule: optax.Schedule) -> optax.GradientTransformation:
    """config.optimizer's optimizer at `schedule`, after clipping by global norm."""
    if config.name == "adamw":
        tx = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                         weight_decay=config.weight_decay, mask=weight_decay_mask)
    elif config.name == "adafactor":
        tx = adafactor(schedule, decay_rate=config.get("decay_rate", 0.8),
                       clipping_threshold=config.get("clipping_threshold", 1.0),
                       multiply_by_parameter_scale=config.get("multiply_by_parameter_scale", True),
                       weight_decay=config.get("weight_decay", 0.0))
    elif config.name == "lamb":
        tx = lamb(schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay)
    else:
        raise ConfigError(f"config.optimizer.name={config.name!r} is unknown; use one of {', '.join(OPTIMIZERS)}")
    clip = optax.clip_by_global_norm(config.grad_clip_norm) if config.get("grad_clip_norm") else optax.identity()
    return optax.chain(clip, tx)
