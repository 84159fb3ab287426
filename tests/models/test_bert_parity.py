"""Our BERT against the reference implementation: Hugging Face transformers on PyTorch."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from models import stack
from models.bert import BertConfig, BertForPreTraining, BertModel
from models.convert.hf_bert import bert_params_from_hf
from pretrain.training.train_state import unbox


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


@pytest.mark.parametrize("scan_layers, attention", [(False, "xla"), (True, "auto")])
def test_internals_match_transformers_attentions_and_hidden_states(scan_layers, attention):
    """return_internals (what distillation reads): every layer's attention probabilities and hidden states against
    BertModel(output_attentions=True, output_hidden_states=True), its scores and values against Hugging Face's own
    query/key/value projections; through the reference even where the config names a fused kernel."""
    reference, config, params = reference_and_ours(seed=2)
    reference.config._attn_implementation = "eager"  # the implementation that returns its attention probabilities
    ids, segments, mask, _ = batch(np.random.default_rng(2))
    with torch.no_grad():
        out = reference.bert(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                             attention_mask=torch.from_numpy(mask), output_attentions=True, output_hidden_states=True)
    config = dataclasses.replace(config, scan_layers=scan_layers, attention=attention)
    bert = params["bert"] if not scan_layers else stack.to_layout(params["bert"], scan=True)
    _, _, internals = BertModel(config).apply({"params": bert}, jnp.asarray(ids), jnp.asarray(segments),
                                              jnp.asarray(mask), return_internals=True)
    real = mask.astype(bool)  # padded query rows attend differently (ours: to nothing); their keys are masked in both
    hidden = [internals["embeddings"], *internals["hidden"]]
    assert len(hidden) == len(out.hidden_states) == 4
    for ours, theirs in zip(hidden, out.hidden_states):
        assert np.abs(np.asarray(ours)[real] - theirs.numpy()[real]).max() < 1e-5
    probs = np.asarray(internals["probs"]).transpose(1, 3, 0, 2, 4)[real]  # [N, B, H, L, S] -> [real, N, H, S]
    hf_probs = np.stack([a.numpy() for a in out.attentions]).transpose(1, 3, 0, 2, 4)[real]
    assert np.abs(probs - hf_probs).max() < 1e-5
    for i, layer in enumerate(reference.bert.encoder.layer):
        attention_heads = layer.attention.self
        with torch.no_grad():
            q, k, v = (proj(out.hidden_states[i]).numpy().reshape(*ids.shape, 4, 12)
                       for proj in (attention_heads.query, attention_heads.key, attention_heads.value))
        scores = np.einsum("blhk,bshk->bhls", q, k) / np.sqrt(12)  # real rows: HF's padded states differ
        pairs = (real[:, None, :, None] & real[:, None, None, :]).repeat(4, axis=1)  # [B, H, L, S]
        assert np.abs(np.asarray(internals["scores"][i])[pairs] - scores[pairs]).max() < 1e-5
        assert np.abs(np.asarray(internals["values"][i])[real] - v[real]).max() < 1e-5
