"""A run with a scanned, rematerialized layer stack (and fused query/key/value projections) trains through the
real loop, and its checkpoint loads in the looped, separate layout (fine-tuning's init, the LM tools) and the
other way round."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import models
from models import stack
from pretrain.finetuners.base import merge_pretrained
from pretrain.lm import language_model
from pretrain.training import pretrained
from tests.helpers.tiny_bert import tiny_config


def test_a_scanned_bert_trains_and_its_checkpoint_initialises_a_looped_one(tmp_path, corpus_and_tokenizer):
    from pretrain.loops import pretraining
    config = tiny_config(*corpus_and_tokenizer, num_train_steps=3, checkpoint_every=3,
                         **{"model.scan_layers": True, "model.remat": "full"})
    metrics = pretraining.train_and_evaluate(config, str(tmp_path / "scanned"))
    assert np.isfinite(metrics["loss"])
    init = pretrained.load_pretrained(str(tmp_path / "scanned"))
    assert set(init.params) == {"embeddings", "layers", "pooler"}  # stored as trained: stacked [2, ...]
    assert init.params["layers"]["mlp"]["intermediate"]["kernel"].shape == (2, 32, 64)

    looped = models.build_model({**config.model.to_dict(), "scan_layers": False})
    example = [jnp.ones((1, 8), jnp.int32)] * 3 + [jnp.zeros((1, 2), jnp.int32)]
    fresh_params = jax.tree.map(np.asarray, nn.unbox(looped.init(jax.random.key(0), *example))["params"])
    merged, fresh = merge_pretrained(fresh_params["bert"], init.params, init.source)
    assert fresh == [] and "layer_1" in merged and "layers" not in merged
    np.testing.assert_array_equal(merged["layer_1"]["mlp"]["intermediate"]["kernel"],
                                  init.params["layers"]["mlp"]["intermediate"]["kernel"][1])
    # and the way back: the looped weights into a scanned model
    restacked, fresh = merge_pretrained(stack.to_layout(fresh_params["bert"], scan=True), merged, init.source)
    assert fresh == []
    np.testing.assert_array_equal(restacked["layers"]["mlp"]["intermediate"]["kernel"],
                                  init.params["layers"]["mlp"]["intermediate"]["kernel"])


def test_a_scanned_gpt_checkpoint_serves_the_lm_tools(tmp_path, corpus_and_tokenizer):
    from configs import gpt2
    from pretrain.loops import pretraining
    corpus, spm = corpus_and_tokenizer
    config = gpt2.get_config("size=tiny")
    config.update_from_flattened_dict({
        "data.path": corpus, "tokenizer.path": spm, "model.vocab_size": 1000, "model.d_model": 32,
        "model.num_heads": 2, "model.d_ff": 64, "model.num_layers": 2, "model.n_positions": 32,
        "data.max_seq_length": 32, "batch_size": 4, "num_train_steps": 2, "checkpoint_every": 2,
        "data.eval_documents": 0, "model.scan_layers": True, "model.remat": "minimal", "model.fused_qkv": True})
    pretraining.train_and_evaluate(config, str(tmp_path / "gpt"))
    lm = language_model.load_language_model(str(tmp_path / "gpt"))
    assert not lm.config.scan_layers and "layer_1" in lm.params  # the tools run the looped layout
    assert not lm.config.fused_qkv and "query" in lm.params["layer_1"]["attention"]  # and separate projections
    stored = pretrained.load_pretrained(str(tmp_path / "gpt")).params
    ids = jnp.asarray(np.arange(1, 17)[None], jnp.int32)
    scanned = models.build_model({**config.model.to_dict()})
    expected = scanned.apply({"params": stored}, ids)["logits"]
    np.testing.assert_allclose(lm.model.apply({"params": lm.params}, ids)["logits"], expected, atol=1e-5)
