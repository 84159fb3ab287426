"""Hugging Face T5 import/export: our T5 computes what transformers' T5ForConditionalGeneration computes
(T5 1.0 and 1.1 layouts, with and without padding), a round trip is bitwise, and transformers loads
our exports with no missing or unexpected keys."""
from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from models.convert.hf_io import read_weights
from models.convert.hf_t5 import hf_config_to_t5, load_hf_t5, save_hf_t5, t5_params_from_hf
from models.errors import ModelInputError
from models.t5 import T5, T5Config
from tests.helpers.random_weights import t5_random_params

SIZES = dict(vocab_size=128, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_decoder_layers=2, num_heads=4,
             dropout_rate=0.0)
# version -> (feed_forward_proj, tie_word_embeddings, give the model its own lm_head tensor)
VERSIONS = {"1.0": ("relu", True, False), "1.1": ("gated-gelu", False, True),
            # transformers 5 builds a 1.1 config with lm_head tied to `shared` but no output scaling
            "1.1-tied-by-transformers": ("gated-gelu", False, False)}
TOLERANCE = 1e-4


def random_hf(version: str, seed: int = 0) -> transformers.T5ForConditionalGeneration:
    feed_forward, tie, own_lm_head = VERSIONS[version]
    torch.manual_seed(seed)
    config = transformers.T5Config(**SIZES, feed_forward_proj=feed_forward, tie_word_embeddings=tie)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():  # the norms start at 1: randomise them so that a mix-up shows
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(0.3 * torch.randn_like(p))
        if own_lm_head:
            model.lm_head.weight = torch.nn.Parameter(torch.randn(SIZES["vocab_size"], SIZES["d_model"]) * 0.2)
    return model


def random_batch(padding: bool, seed: int = 0, batch: int = 3, enc_len: int = 12, dec_len: int = 9):
    rng = np.random.default_rng(seed)
    encoder_ids = rng.integers(1, SIZES["vocab_size"], (batch, enc_len))
    if padding:
        lengths = np.array([enc_len, 5, 8])[:batch]
        encoder_ids = np.where(np.arange(enc_len)[None] < lengths[:, None], encoder_ids, 0)
    decoder_ids = rng.integers(1, SIZES["vocab_size"], (batch, dec_len))
    decoder_ids[:, 0] = 0  # the start token
    return encoder_ids, decoder_ids


def hf_logits(model, encoder_ids, decoder_ids) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(encoder_ids), attention_mask=torch.tensor(encoder_ids != 0).long(),
                    decoder_input_ids=torch.tensor(decoder_ids))
    return out.logits.numpy()


def our_logits(config: T5Config, params, encoder_ids, decoder_ids) -> np.ndarray:
    forward = jax.jit(lambda p, e, d: T5(config).apply({"params": p}, e, d)["logits"])  # eager is slower than a compile
    return np.asarray(forward(params, jnp.asarray(encoder_ids), jnp.asarray(decoder_ids)))


# fused: self-attention's query/key/value imported into one qkv (cross-attention keeps its three)
@pytest.mark.parametrize("version, padding, fused_qkv", [(version, padding, False) for version in VERSIONS
                                                         for padding in (False, True)] + [("1.1", True, True)])
def test_logits_match_transformers(tmp_path, version, padding, fused_qkv):
    model = random_hf(version)
    model.save_pretrained(tmp_path)
    config, params = load_hf_t5(str(tmp_path))
    if fused_qkv:
        config = dataclasses.replace(config, fused_qkv=True)
        params = t5_params_from_hf(read_weights(str(tmp_path))[0], config)
        assert "qkv" in params["decoder"]["layer_0"]["self_attention"]
        assert "query" in params["decoder"]["layer_0"]["cross_attention"]
    assert config.feed_forward == VERSIONS[version][0]
    assert config.tie_word_embeddings == VERSIONS[version][1]
    encoder_ids, decoder_ids = random_batch(padding)
    expected = hf_logits(model, encoder_ids, decoder_ids)
    assert np.abs(expected).max() > 1.0  # logits of a size where a wrong term would show
    np.testing.assert_allclose(our_logits(config, params, encoder_ids, decoder_ids), expected, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("version, fused_qkv", [("1.0", False), ("1.1", False), ("1.1", True)])
def test_import_export_round_trip_is_bitwise(tmp_path, version, fused_qkv):
    random_hf(version).save_pretrained(tmp_path / "hf")
    config, params = load_hf_t5(str(tmp_path / "hf"))
    if fused_qkv:  # exported from the fused layout
        config = dataclasses.replace(config, fused_qkv=True)
        params = t5_params_from_hf(read_weights(str(tmp_path / "hf"))[0], config)
    save_hf_t5(str(tmp_path / "ours"), params, config)
    original = safetensors.numpy.load_file(str(tmp_path / "hf" / "model.safetensors"))
    exported = safetensors.numpy.load_file(str(tmp_path / "ours" / "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for name, array in original.items():
        assert exported[name].dtype == array.dtype and np.array_equal(exported[name], array), name
    config_again, _ = load_hf_t5(str(tmp_path / "ours"))
    assert config_again == dataclasses.replace(config, fused_qkv=False)


@pytest.mark.parametrize("feed_forward,tie", [("relu", True), ("gated-gelu", False)])
def test_transformers_loads_our_export(tmp_path, feed_forward, tie):
    config = T5Config(vocab_size=128, d_model=64, num_heads=4, head_dim=16, d_ff=96, num_encoder_layers=2,
                      num_decoder_layers=3, feed_forward=feed_forward, tie_word_embeddings=tie)
    params = t5_random_params(config)
    save_hf_t5(str(tmp_path), params, config)
    model, info = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.config.num_decoder_layers == 3 and model.config.d_kv == 16
    encoder_ids, decoder_ids = random_batch(padding=True, seed=1)
    np.testing.assert_allclose(hf_logits(model.eval(), encoder_ids, decoder_ids),
                               our_logits(config, params, encoder_ids, decoder_ids), atol=TOLERANCE, rtol=0)


def test_config_mapping_reads_old_and_new_tying_conventions():
    base = dict(model_type="t5", **SIZES, feed_forward_proj="gated-gelu")
    old = hf_config_to_t5({**base, "tie_word_embeddings": False}, untied_lm_head=True)          # transformers 4
    new = hf_config_to_t5({**base, "tie_word_embeddings": True, "scale_decoder_outputs": False},  # transformers 5
                          untied_lm_head=True)
    assert old == new and not old.tie_word_embeddings
    assert old.head_dim == 16 and old.num_encoder_layers == old.num_decoder_layers == 2
    assert hf_config_to_t5({**base, "num_decoder_layers": None}, untied_lm_head=False).num_decoder_layers == 2


def test_unusable_checkpoints_are_one_line_errors(tmp_path):
    random_hf("1.0").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "d_ff": 100}))
    with pytest.raises(ModelInputError, match="DenseReluDense.wi.weight.*shape"):
        load_hf_t5(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**config, "feed_forward_proj": "gated-silu"}))
    with pytest.raises(ModelInputError, match="feed_forward_proj"):
        load_hf_t5(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(ModelInputError, match="model_type"):
        load_hf_t5(str(tmp_path))
    with pytest.raises(ModelInputError, match="not a previous export"):
        save_hf_t5(str(tmp_path), {}, T5Config())


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_greedy_generation_matches_transformers(tmp_path, version):
    """The same output tokens as transformers' generate(num_beams=1) from the cached decoder."""
    from models.t5 import generate
    model = random_hf(version)
    model.save_pretrained(tmp_path)
    config, params = load_hf_t5(str(tmp_path))
    encoder_ids, _ = random_batch(padding=True)
    eos, length = 1, 10
    with torch.no_grad():
        reference = model.generate(input_ids=torch.tensor(encoder_ids),
                                   attention_mask=torch.tensor(encoder_ids != 0).long(), do_sample=False,
                                   num_beams=1, max_new_tokens=length, min_new_tokens=0, eos_token_id=eos,
                                   pad_token_id=0, decoder_start_token_id=0).numpy()[:, 1:]  # drop the start token
    ours = np.asarray(jax.jit(lambda p, e: generate(T5(config), p, e, length, eos))(params, jnp.asarray(encoder_ids)))
    reference = np.pad(reference, ((0, 0), (0, length - reference.shape[1])))  # HF stops when all rows end
    assert len(set(map(tuple, ours))) > 1  # rows differ: the encoder input matters
    np.testing.assert_array_equal(ours, reference)


def test_beam_search_with_one_beam_is_greedy_and_wider_beams_score_no_worse(tmp_path):
    from models.t5 import generate
    model = random_hf("1.0")
    model.save_pretrained(tmp_path)
    config, params = load_hf_t5(str(tmp_path))
    encoder_ids = jnp.asarray(random_batch(padding=True)[0])
    t5 = T5(config)
    greedy = jax.jit(lambda p, e: generate(t5, p, e, 8, 1))(params, encoder_ids)
    beam1 = jax.jit(lambda p, e: generate(t5, p, e, 8, 1, beam_size=1))(params, encoder_ids)
    np.testing.assert_array_equal(greedy, beam1)

    def log_prob(tokens):  # sum of log p over the tokens up to and including EOS (teacher forced)
        decoder_inputs = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))
        logits = t5.apply({"params": params}, encoder_ids, decoder_inputs)["logits"]
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1)[..., 0]
        keep = jnp.cumsum(tokens == 1, axis=1) - (tokens == 1) == 0  # up to the first EOS
        return np.asarray((logp * keep).sum(-1))
    beam4 = jax.jit(lambda p, e: generate(t5, p, e, 8, 1, beam_size=4, alpha=0.0))(params, encoder_ids)
    assert np.all(log_prob(beam4) >= log_prob(greedy) - 1e-4)
