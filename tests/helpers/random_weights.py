"""Random weights of O(1) activations for GPT and T5, drawn in numpy from the parameter shapes (jax.eval_shape:
no initialiser is compiled; the real initialisers have their own tests): differences that a wrong mask, cache
or conversion makes are then far above the tests' 1e-5 tolerances."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from models.gpt import GPT, GPTConfig
from models.t5 import T5, T5Config
from pretrain.training.train_state import unbox


@functools.lru_cache(maxsize=None)
def gpt_shapes(config: GPTConfig):
    """GPT's parameter shapes, boxed with their logical axes (nn.Partitioned)."""
    return jax.eval_shape(GPT(config).init, jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]


def gpt_random_params(config: GPTConfig, seed: int = 0) -> dict:
    """Kernels N(0, 1/fan_in), norms 1 + noise, biases and tables noise."""
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            return (1 + 0.2 * rng.standard_normal(leaf.shape)).astype(np.float32)
        if "bias" in name or "embedding" in name:
            return (0.5 * rng.standard_normal(leaf.shape)).astype(np.float32)
        fan_in = np.prod(leaf.shape[:2] if "'out'" in name else leaf.shape[:1])
        return (rng.standard_normal(leaf.shape) / np.sqrt(fan_in)).astype(np.float32)
    return jax.tree_util.tree_map_with_path(draw, unbox(gpt_shapes(config)))


@functools.lru_cache(maxsize=None)
def t5_shapes(config: T5Config) -> dict:
    """T5's parameter shapes, unboxed."""
    ids = jnp.ones((1, 4), jnp.int32)
    return unbox(jax.eval_shape(T5(config).init, jax.random.key(0), ids, ids)["params"])


def t5_random_params(config: T5Config, seed: int = 0) -> dict:
    """Kernels N(0, 1/fan_in); norms 1 + noise; tables N(0, 1)."""
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            return (1 + 0.2 * rng.standard_normal(leaf.shape)).astype(np.float32)
        fan_in = 1 if "embedding" in name else np.prod(leaf.shape[:2] if "'out'" in name else leaf.shape[:1])
        return (rng.standard_normal(leaf.shape) / np.sqrt(fan_in)).astype(np.float32)
    return jax.tree_util.tree_map_with_path(draw, t5_shapes(config))
