"""Hugging Face GPT-2 import/export: our GPT computes what transformers' GPT2LMHeadModel computes (logits
and greedy generation), a round trip is bitwise, and transformers loads our exports with no missing or
unexpected keys."""
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

from models import decoding
from models.convert.hf_gpt2 import gpt_params_from_hf, hf_config_to_gpt, load_hf_gpt2, save_hf_gpt2
from models.convert.hf_io import read_weights
from models.errors import ModelInputError
from models.gpt import GPT, GPTConfig, init_cache, make_tokens_to_logits
from tests.helpers.random_weights import gpt_random_params

SIZES = dict(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
             attn_pdrop=0.0)
TOLERANCE = 1e-4


def random_hf(seed: int = 0) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES, bos_token_id=0, eos_token_id=1)).eval()
    with torch.no_grad():  # norms start at (1, 0) and biases at 0, weights at N(0, 0.02): make every term show
        for name, p in model.named_parameters():
            if "ln_" in name and name.endswith("weight"):
                p.add_(0.3 * torch.randn_like(p))
            elif name.endswith("bias") or "wte" in name or "wpe" in name:
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.mul_(10.0)  # N(0, 0.2): activations of O(1), logits of a size where a wrong term shows
    return model


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids)).logits.numpy()


def our_logits(config: GPTConfig, params, ids: np.ndarray) -> np.ndarray:
    forward = jax.jit(lambda p, x: GPT(config).apply({"params": p}, x)["logits"])
    return np.asarray(forward(params, jnp.asarray(ids)))


def random_ids(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SIZES["vocab_size"], shape)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf")
    random_hf().save_pretrained(directory)
    return directory


def fused_import(hf_dir) -> tuple[GPTConfig, dict]:
    """The checkpoint imported straight into the fused layout (c_attn -> one qkv [D, 3, H, K])."""
    config = dataclasses.replace(load_hf_gpt2(str(hf_dir))[0], fused_qkv=True)
    return config, gpt_params_from_hf(read_weights(str(hf_dir))[0], config)


@pytest.mark.parametrize("fused_qkv", [False, True])
def test_logits_match_transformers(hf_dir, fused_qkv):
    config, params = fused_import(hf_dir) if fused_qkv else load_hf_gpt2(str(hf_dir))
    assert (config.d_model, config.num_layers, config.num_heads, config.d_ff) == (64, 2, 4, 256)
    assert ("qkv" in params["layer_0"]["attention"]) == fused_qkv
    ids = random_ids((3, 20))
    expected = hf_logits(transformers.GPT2LMHeadModel.from_pretrained(str(hf_dir)).eval(), ids)
    assert np.abs(expected).max() > 1.0
    np.testing.assert_allclose(our_logits(config, params, ids), expected, atol=TOLERANCE, rtol=0)


def test_greedy_generation_matches_transformers(hf_dir):
    """The same tokens as generate(num_beams=1, do_sample=False), from the cache and decoding.greedy_search,
    for prompts of one length and (left-padded for transformers) of different lengths."""
    config, params = load_hf_gpt2(str(hf_dir))
    model = transformers.GPT2LMHeadModel.from_pretrained(str(hf_dir)).eval()
    prompts, lengths, new_tokens = random_ids((3, 6), seed=1), np.array([6, 6, 3]), 8
    for rows in ([0, 1], [0, 1, 2]):
        batch, width = prompts[rows], int(lengths[rows].max())
        # transformers takes left-padded prompts with an attention mask (positions follow the mask)
        valid = np.arange(width)[None] >= width - lengths[rows][:, None]
        padded = np.zeros((len(rows), width), np.int64)
        for r, n in enumerate(lengths[rows]):
            padded[r, width - n:] = batch[r, :n]
        with torch.no_grad():
            reference = model.generate(input_ids=torch.tensor(padded), attention_mask=torch.tensor(valid).long(),
                                       do_sample=False, num_beams=1, max_new_tokens=new_tokens,
                                       min_new_tokens=new_tokens, pad_token_id=0).numpy()[:, width:]
        start, prompt, prompt_lengths = decoding.split_prompts(batch, lengths[rows])
        total = width - 1 + new_tokens
        ours = np.asarray(decoding.greedy_search(
            make_tokens_to_logits(GPT(config), params), init_cache(GPT(config), params, len(rows), total),
            start, total, prompt=prompt, prompt_lengths=prompt_lengths))
        for r, n in enumerate(lengths[rows]):
            np.testing.assert_array_equal(ours[r, n - 1: n - 1 + new_tokens], reference[r])
        assert len({tuple(row) for row in reference}) > 1  # the prompts matter


@pytest.mark.parametrize("fused_qkv", [False, True])
def test_import_export_round_trip_is_bitwise(hf_dir, tmp_path, fused_qkv):
    config, params = fused_import(hf_dir) if fused_qkv else load_hf_gpt2(str(hf_dir))
    save_hf_gpt2(str(tmp_path / "ours"), params, config)
    original = safetensors.numpy.load_file(str(hf_dir / "model.safetensors"))
    exported = safetensors.numpy.load_file(str(tmp_path / "ours" / "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for name, array in original.items():
        assert exported[name].dtype == array.dtype and np.array_equal(exported[name], array), name
    assert load_hf_gpt2(str(tmp_path / "ours"))[0] == dataclasses.replace(config, fused_qkv=False)


def test_transformers_loads_our_export(tmp_path):
    config = GPTConfig(vocab_size=96, n_positions=16, d_model=32, num_layers=3, num_heads=2, d_ff=48,
                       dropout_rate=0.0, attention_dropout_rate=0.0)
    params = gpt_random_params(config, seed=1)
    save_hf_gpt2(str(tmp_path), params, config)
    model, info = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.config.n_layer == 3 and model.config.n_inner == 48
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied
    ids = random_ids((2, 16), seed=2) % 96
    np.testing.assert_allclose(hf_logits(model.eval(), ids), our_logits(config, params, ids), atol=TOLERANCE, rtol=0)


def test_openai_naming_and_buffers_are_read(hf_dir, tmp_path):
    """OpenAI's upload names tensors 'h.0...' (no 'transformer.') and old saves hold mask buffers."""
    state = safetensors.numpy.load_file(str(hf_dir / "model.safetensors"))
    renamed = {k.removeprefix("transformer."): v for k, v in state.items()}
    renamed["h.0.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
    renamed["lm_head.weight"] = state["transformer.wte.weight"]
    safetensors.numpy.save_file(renamed, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((hf_dir / "config.json").read_text())
    config, params = load_hf_gpt2(str(tmp_path))
    expected_config, expected = load_hf_gpt2(str(hf_dir))
    assert config == expected_config
    jax.tree.map(np.testing.assert_array_equal, params, expected)


def test_config_mapping():
    config = hf_config_to_gpt({"model_type": "gpt2", "n_embd": 48, "n_head": 3, "n_layer": 1, "n_inner": None,
                               "resid_pdrop": 0.2, "embd_pdrop": 0.2, "attn_pdrop": 0.05})
    assert (config.d_model, config.d_ff, config.dropout_rate, config.attention_dropout_rate) == (48, 192, 0.2, 0.05)
    assert hf_config_to_gpt({"activation_function": "gelu_pytorch_tanh"}) == GPTConfig()


def test_unusable_checkpoints_are_one_line_errors(hf_dir, tmp_path):
    for name in ("model.safetensors", "config.json"):
        (tmp_path / name).write_bytes((hf_dir / name).read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    for change, match in (({"n_inner": 100}, "c_fc.weight.*shape"), ({"n_embd": 32}, "c_attn.weight.*shape"),
                          ({"activation_function": "relu"}, "activation_function"),
                          ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
                          ({"model_type": "bert"}, "model_type")):
        (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ModelInputError, match=match):
            load_hf_gpt2(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(config))
    state = safetensors.numpy.load_file(str(hf_dir / "model.safetensors"))
    safetensors.numpy.save_file({**state, "lm_head.weight": state["transformer.wte.weight"] + 1},
                                str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelInputError, match="ties the output layer"):
        load_hf_gpt2(str(tmp_path))
    (tmp_path / "notes.txt").write_text("not written by an export")
    with pytest.raises(ModelInputError, match="not a previous export"):
        save_hf_gpt2(str(tmp_path), {}, GPTConfig())
