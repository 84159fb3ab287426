"""Weight layouts shared by the Hugging Face converters: PyTorch's [out, in] Linear weights and fused
[H*K] head dimensions against our [in, out] kernels with separate [H, K] axes."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from absl import logging

from models.errors import ModelInputError

# Ours <- HF and HF <- ours for each layout; c is the model config (heads H = c.num_heads).
TO_OURS = {
    "copy": lambda w, c: w,
    "linear": lambda w, c: w.T,                                                          # [out, in] -> [in, out]
    "heads_in": lambda w, c: w.T.reshape(w.shape[1], c.num_heads, -1),                   # [H*K, D] -> [D, H, K]
    "heads_bias": lambda w, c: w.reshape(c.num_heads, -1),                               # [H*K] -> [H, K]
    "heads_out": lambda w, c: w.T.reshape(c.num_heads, -1, w.shape[0]),                  # [D, H*K] -> [H, K, D]
}
TO_HF = {
    "copy": lambda w, c: w,
    "linear": lambda w, c: w.T,
    "heads_in": lambda w, c: w.reshape(w.shape[0], -1).T,
    "heads_bias": lambda w, c: w.reshape(-1),
    "heads_out": lambda w, c: w.reshape(-1, w.shape[-1]).T,
}


def place_tensor(params: dict, state_dict: dict, name: str, path: tuple[str, ...], layout: str,
                 shape: tuple[int, ...], config, *, source: str, missing_hint: str) -> None:
    """params[path] = state_dict[name] in our layout, after checking it exists with the expected shape."""
    if state_dict.get(name) is None:
        raise ModelInputError(f"{source} has no tensor {name!r} ({missing_hint})")
    if state_dict[name].shape != shape:
        raise ModelInputError(f"{source}: tensor {name!r} has shape {list(state_dict[name].shape)}, config.json "
                              f"implies {list(shape)} (config and weights disagree)")
    node = params
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = TO_OURS[layout](state_dict[name], config)


def lookup(params: dict, path: tuple[str, ...]):
    """params[path[0]][path[1]]...; None where a key is missing."""
    node = params
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def take_tensor(params: dict, path: tuple[str, ...], layout: str, config) -> np.ndarray:
    """Our parameter at `path` in Hugging Face's layout, float32; one-line error when it is missing."""
    node = lookup(params, path)
    if node is None:
        raise ModelInputError(f"parameter {'/'.join(path)} is missing from the params to export (pass the whole "
                              "tree, e.g. state.params, with the config it was trained with)")
    return np.ascontiguousarray(TO_HF[layout](np.asarray(node, np.float32), config))


def drop_untied_head(params: dict, decoder: np.ndarray | None, word_embeddings: np.ndarray, source: str,
                     name: str) -> None:
    """Our MLM head decodes with the word embeddings: a checkpoint whose decoder `name` differs from them keeps its
    encoder and loses params['mlm_head'], with a warning."""
    if "mlm_head" in params and decoder is not None and not np.array_equal(decoder, word_embeddings):
        logging.warning("%s: %s is not tied to the word embeddings; our model ties them, so the MLM head is left out",
                        source, name)
        del params["mlm_head"]
