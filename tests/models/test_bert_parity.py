"""Our BERT against the reference implementation: Hugging Face transformers on PyTorch."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from models.bert import BertConfig, BertForPreTraining, BertModel
from models.convert.hf_bert import bert_params_from_hf
from pretrain.core.train_state import unbox


def reference_and_ours(seed=0, fused_qkv=False):
    torch.manual_seed(seed)
    hf_config = transformers.BertConfig(vocab_size=120, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                        intermediate_size=96, max_position_embeddings=64, type_vocab_size=2,
                                        initializer_range=0.2)  # O(1) activations: differences show
    reference = transformers.BertForPreTraining(hf_config).eval()
    with torch.no_grad():  # HF initialises biases and LayerNorm to 0/1: randomise them so they count
        for name, p in reference.named_parameters():
            if "bias" in name or "LayerNorm" in name:
                p.add_(0.3 * torch.randn_like(p))
    config = BertConfig(vocab_size=120, hidden_size=48, num_layers=3, num_heads=4, intermediate_size=96,
                        max_position_embeddings=64, fused_qkv=fused_qkv)  # fused: imported into one qkv
    params = bert_params_from_hf({k: v.numpy() for k, v in reference.state_dict().items()}, config)
    return reference, config, params


def batch(rng, batch_size=3, length=20, predictions=4):
    ids = rng.integers(0, 120, (batch_size, length))
    segments = (np.arange(length)[None] >= rng.integers(3, length - 3, (batch_size, 1))).astype(np.int64)
    mask = (np.arange(length)[None] < rng.integers(8, length + 1, (batch_size, 1))).astype(np.int64)
    mask[0] = 1  # one row without padding
    positions = rng.integers(0, 8, (batch_size, predictions))
    return ids, segments, mask, positions


@pytest.mark.parametrize("fused_qkv", [False, True])
def test_hidden_states_mlm_and_nsp_logits_match_transformers(fused_qkv):
    reference, config, params = reference_and_ours(fused_qkv=fused_qkv)
    ids, segments, mask, positions = batch(np.random.default_rng(0))
    with torch.no_grad():
        out = reference(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                        attention_mask=torch.from_numpy(mask), output_hidden_states=True)
    ours = BertForPreTraining(config).apply({"params": params}, jnp.asarray(ids), jnp.asarray(segments),
                                            jnp.asarray(mask), jnp.asarray(positions))
    sequence, pooled = BertModel(config).apply({"params": params["bert"]}, jnp.asarray(ids), jnp.asarray(segments),
                                               jnp.asarray(mask))
    real = mask.astype(bool)  # padded positions are garbage in both implementations
    hf_sequence = out.hidden_states[-1].numpy()
    assert np.abs(np.asarray(sequence)[real] - hf_sequence[real]).max() < 1e-4
    hf_mlm = np.take_along_axis(out.prediction_logits.numpy(), positions[..., None], axis=1)
    assert np.abs(np.asarray(ours["mlm_logits"]) - hf_mlm).max() < 1e-4
    assert np.abs(np.asarray(ours["nsp_logits"]) - out.seq_relationship_logits.numpy()).max() < 1e-4
    hf_pooled = reference.bert.pooler(out.hidden_states[-1]).detach().numpy()
    assert np.abs(np.asarray(pooled) - hf_pooled).max() < 1e-4


@pytest.mark.parametrize("fused_qkv", [False, True])
def test_converted_tree_matches_our_initialised_tree(fused_qkv):
    """Every parameter we initialise is imported, with the same shape: nothing is silently left out."""
    _, config, params = reference_and_ours(fused_qkv=fused_qkv)
    ids, segments, mask, positions = batch(np.random.default_rng(1))
    init = unbox(BertForPreTraining(config).init(jax.random.key(0), jnp.asarray(ids), jnp.asarray(segments),
                                                 jnp.asarray(mask), jnp.asarray(positions)))["params"]
    def shapes(tree):
        return jax.tree.map(lambda x: tuple(np.shape(x)), tree)
    assert shapes(params) == shapes(init)
