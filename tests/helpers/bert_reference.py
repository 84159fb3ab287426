"""What the BERT-shaped converters' parity tests share (BERT, ALBERT, DistilBERT against transformers): random
weights whose zero biases and unit LayerNorms count too, a padded batch, torch state dicts as numpy, and our
parameter count from shapes alone."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from models.bert import BertConfig, BertForPreTraining
from pretrain.training.train_state import unbox


def randomised(model: torch.nn.Module) -> torch.nn.Module:
    """transformers initialises biases and LayerNorms to 0 and 1: noise on them (from torch's global generator,
    which the caller seeds), so a misplaced one shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name.lower():
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def random_batch(vocab_size: int, seed: int = 0, batch_size: int = 3, length: int = 20, predictions: int = 4):
    """(ids, segment ids of a pair, padding mask with one unpadded row, MLM positions), numpy int64."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, (batch_size, length))
    segments = (np.arange(length)[None] >= rng.integers(3, length - 3, (batch_size, 1))).astype(np.int64)
    mask = (np.arange(length)[None] < rng.integers(8, length, (batch_size, 1))).astype(np.int64)
    mask[0] = 1  # one row without padding
    return ids, segments, mask, rng.integers(0, 8, (batch_size, predictions))


def state_dict(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in model.state_dict().items()}


def init_params(config: BertConfig, seed: int = 0) -> dict:
    """BertForPreTraining(config)'s initial params, unboxed."""
    ids = jnp.zeros((1, 8), jnp.int32)
    return unbox(BertForPreTraining(config).init(jax.random.key(seed), ids, ids, ids + 1, ids[:, :2]))["params"]


def count_params(config: BertConfig) -> int:
    """BertForPreTraining(config)'s parameters from shapes only (jax.eval_shape): nothing is allocated."""
    ids = jnp.zeros((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda: BertForPreTraining(config).init(jax.random.key(0), ids, ids, ids + 1, ids[:, :2]))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(unbox(shapes)["params"]))
