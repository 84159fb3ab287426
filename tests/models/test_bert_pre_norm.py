"""BERT with pre-LN blocks (BertConfig.pre_norm, configs/cram.py's bert_preln arm) against transformers'
RobertaPreLayerNormModel, the same architecture (embedding LayerNorm, x + Attn(LN(x)), x + FFN(LN(x)), a final
LayerNorm), given the same weights and the positions 0..L-1."""
from __future__ import annotations

import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.bert import BertConfig, BertModel
from models.convert import hf_bert
from models.errors import ModelInputError

# RobertaPreLayerNorm's names for the norms that moved inside the residual branches: before the attention, before
# the MLP (hf_bert's names are post-LN BERT's: after each)
PRE_LN_NAMES = ((r"attention\.output\.LayerNorm", "attention.LayerNorm"),
                (r"(layer\.\d+)\.output\.LayerNorm", r"\1.intermediate.LayerNorm"))


def ours(pre_norm: bool) -> tuple[BertConfig, dict]:
    # weights of std 0.5, so that the residual branches move the stream (at 0.02 both orders nearly agree)
    config = BertConfig(vocab_size=60, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                        next_sentence=False, pooler=False, dropout_rate=0.0, attention_dropout_rate=0.0,
                        initializer_range=0.5, pre_norm=pre_norm)
    ids = jnp.zeros((1, 4), jnp.int32)
    return config, flax.core.meta.unbox(BertModel(config).init(jax.random.PRNGKey(0), ids, ids, ids + 1)["params"])


def pre_ln_state_dict(params: dict, config: BertConfig) -> dict:
    import torch
    state = {}
    for name, tensor in hf_bert.hf_state_dict_from_bert({"bert": params}, config, prefix="").items():
        for old, new in PRE_LN_NAMES:
            name = re.sub(old, new, name)
        state[name] = torch.from_numpy(np.array(tensor))
    state["LayerNorm.weight"] = torch.from_numpy(np.array(params["final_norm"]["scale"]))
    state["LayerNorm.bias"] = torch.from_numpy(np.array(params["final_norm"]["bias"]))
    return state


def reference(config: BertConfig):
    import transformers
    return transformers.RobertaPreLayerNormModel(transformers.RobertaPreLayerNormConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings, type_vocab_size=2, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, layer_norm_eps=config.layer_norm_eps, pad_token_id=0),
        add_pooling_layer=False).eval()


def test_pre_norm_bert_equals_transformers_roberta_prelayernorm():
    import torch
    config, params = ours(pre_norm=True)
    model = reference(config)
    missing, unexpected = model.load_state_dict(pre_ln_state_dict(params, config), strict=False)
    assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
    ids = np.random.RandomState(0).randint(5, 60, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, 6:] = 0
    sequence, _ = BertModel(config).apply({"params": params}, jnp.asarray(ids), jnp.zeros_like(ids), jnp.asarray(mask))
    with torch.no_grad():
        expected = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                         token_type_ids=torch.zeros(2, 9, dtype=torch.long),
                         position_ids=torch.arange(9).expand(2, 9)).last_hidden_state.numpy()
    valid = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(sequence)[valid], expected[valid], atol=2e-5)
    post, post_params = ours(pre_norm=False)  # the same weights in post-LN order give another function
    post_sequence, _ = BertModel(post).apply({"params": post_params}, jnp.asarray(ids), jnp.zeros_like(ids),
                                             jnp.asarray(mask))
    assert np.abs(np.asarray(post_sequence)[valid] - expected[valid]).max() > 0.1


def test_pre_norm_bert_refuses_a_transformers_bert_export():
    config, _ = ours(pre_norm=True)
    with pytest.raises(ModelInputError, match="pre_norm=True .* no transformers BERT form"):
        hf_bert.bert_config_to_hf(config)


def test_fine_tuning_inherits_pre_norm_from_the_checkpoint():
    import models
    from pretrain.training import pretrained
    model, params = pretrained._inherited(models.family("bert"), {"pre_norm": True, "hidden_size": 16,
                                                                  "dropout_rate": 0.1}, {"bert": {"final_norm": 1}})
    assert model == {"pre_norm": True, "hidden_size": 16} and params == {"final_norm": 1}


def test_gradual_unfreezing_trains_a_pre_norm_final_norm_with_the_top_layer():
    import ml_collections

    from pretrain.training import freezing
    params = {"bert": {"embeddings": {"w": 0}, "layer_0": {"w": 0}, "layer_1": {"w": 0}, "final_norm": {"scale": 0}},
              "classifier": {"w": 0}}
    config = ml_collections.ConfigDict(dict(strategy="gradual", num_frozen_layers=0, freeze_embeddings=True,
                                            unfreeze_every_epochs=1))
    starts = freezing.unfreeze_steps(params, config, num_layers=2, steps_per_epoch=10)
    assert starts["bert"]["final_norm"]["scale"] == starts["bert"]["layer_1"]["w"] == 0
    assert starts["bert"]["layer_0"]["w"] == 10 and starts["bert"]["embeddings"]["w"] == 20
