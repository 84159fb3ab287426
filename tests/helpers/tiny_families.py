"""Tiny BERT, GPT and T5 models with inputs that exercise padding and packing, for the tests that compare two
ways of computing one function (looped and scanned layers, separate and fused query/key/value projections)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from models.bert import BertConfig, BertForPreTraining
from models.gpt import GPT, GPTConfig
from models.t5 import T5, T5Config

IDS = jax.random.randint(jax.random.key(3), (2, 16), 1, 101)
FAMILIES = {
    "bert": (BertForPreTraining, BertConfig(vocab_size=101, hidden_size=32, num_layers=2, num_heads=4,
                                            intermediate_size=64, max_position_embeddings=32),
             (IDS, jnp.zeros_like(IDS), (jnp.arange(16)[None] < jnp.array([[16], [9]])).astype(jnp.int32),
              jnp.array([[1, 2], [3, 4]]))),
    "gpt": (GPT, GPTConfig(vocab_size=101, n_positions=32, d_model=32, num_layers=2, num_heads=4, d_ff=64),
            (IDS, jnp.array([[1] * 9 + [2] * 7, [1] * 12 + [0] * 4]))),
    "t5": (T5, T5Config(vocab_size=101, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
                        num_decoder_layers=2, feed_forward="gated-gelu", tie_word_embeddings=False),
           (IDS.at[1, 10:].set(0), IDS[:, :8])),
}


def build(family: str, **changes):
    """-> (the family's tiny model with `changes` to its config, the inputs it is applied to)."""
    module, config, args = FAMILIES[family]
    return module(dataclasses.replace(config, **changes)), args


def tree_max_difference(a, b) -> float:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(jax.tree.leaves(a),
                                                                                jax.tree.leaves(b)))
