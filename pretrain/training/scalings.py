"""The hand-written gradient scalings of the optimizers in optimizers.py, those optax lacks in the form the papers
trained with: Adafactor's factored second moments with t5x's factorization rules, and Adam's moments without bias
correction as ALBERT's LAMB computes them. They never see the learning rate (optimizers.py applies it)."""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

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
