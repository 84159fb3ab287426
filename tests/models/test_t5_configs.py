"""configs/t5.py: sizes with the published parameter counts (and Hugging Face's exact ones), recipes, errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from configs import t5 as t5_configs
from models.t5 import T5, T5Config
from pretrain.training.optimizers import learning_rate_schedule
from pretrain.training.train_state import unbox

# Published sizes. 1.0: Raffel et al. (2020), Section 3.7 (rounded there; Large's "770M" is 4.2%
# above its released checkpoint, hence 5%). 1.1: the T5 repository's released_checkpoints.md.
PUBLISHED = {
    ("1.0", "small"): (60e6, 0.01), ("1.0", "base"): (220e6, 0.015), ("1.0", "large"): (770e6, 0.05),
    ("1.0", "3b"): (2.8e9, 0.02), ("1.0", "11b"): (11e9, 0.03),
    ("1.1", "small"): (77e6, 0.01), ("1.1", "base"): (248e6, 0.01), ("1.1", "large"): (783e6, 0.01),
    ("1.1", "xl"): (2.85e9, 0.01), ("1.1", "xxl"): (11.1e9, 0.01),
}
# The exact counts the docstring of configs/t5.py reports.
DOCUMENTED = {
    ("1.0", "small"): 60_506_624, ("1.0", "base"): 222_903_552, ("1.0", "large"): 737_668_096,
    ("1.0", "3b"): 2_851_598_336, ("1.0", "11b"): 11_307_321_344,
    ("1.1", "small"): 76_961_152, ("1.1", "base"): 247_577_856, ("1.1", "large"): 783_150_080,
    ("1.1", "xl"): 2_849_757_184, ("1.1", "xxl"): 11_135_332_352,
}


def model_config(config) -> T5Config:
    return T5Config(**{k: v for k, v in config.model.to_dict().items() if k != "name"})


def our_count(config: T5Config) -> int:
    ids = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(T5(config).init, jax.random.key(0), ids, ids)["params"]  # no memory needed
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(unbox(shapes)))


def hf_count(config: T5Config) -> int:
    """transformers' count on the meta device (no memory). transformers >= 5 ties lm_head to the
    embedding in memory even for 1.1 (it unties it when a checkpoint has its own), so the separate
    lm_head of a 1.1 checkpoint is added."""
    hf_config = transformers.T5Config(
        vocab_size=config.vocab_size, d_model=config.d_model, d_kv=config.head_dim, d_ff=config.d_ff,
        num_layers=config.num_encoder_layers, num_decoder_layers=config.num_decoder_layers,
        num_heads=config.num_heads, feed_forward_proj=config.feed_forward,
        tie_word_embeddings=config.tie_word_embeddings)
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(hf_config)
    tied = model.lm_head.weight is model.shared.weight
    return sum(p.numel() for p in model.parameters()) + (0 if tied == config.tie_word_embeddings
                                                          else config.vocab_size * config.d_model)


@pytest.mark.parametrize("version,size", list(PUBLISHED))
def test_parameter_counts_equal_transformers_and_the_published_sizes(version, size):
    config = model_config(t5_configs.get_config(f"size={size},version={version}"))
    count = our_count(config)
    assert count == DOCUMENTED[version, size]
    assert count == hf_count(config)
    published, tolerance = PUBLISHED[version, size]
    assert abs(count - published) <= tolerance * published


def test_sizes_follow_the_paper_and_the_released_1_1_configs():
    large = t5_configs.get_config("size=large").model
    assert (large.num_encoder_layers, large.d_model, large.num_heads, large.d_ff, large.head_dim) == (
        24, 1024, 16, 4096, 64)
    assert large.feed_forward == "relu" and large.tie_word_embeddings and large.dropout_rate == 0.0
    small = t5_configs.get_config("size=small,version=1.1").model
    assert (small.num_encoder_layers, small.num_decoder_layers, small.num_heads, small.d_ff) == (8, 8, 6, 1024)
    assert small.feed_forward == "gated-gelu" and not small.tie_word_embeddings and small.dropout_rate == 0.0
    alias, xl = (t5_configs.get_config(f"size={s},version=1.1").to_dict() for s in ("3b", "xl"))
    assert alias == xl
    assert t5_configs.get_config("size=11b,version=1.1").model.d_model == 4096


def test_paper_recipe():
    c = t5_configs.get_config("size=base")
    assert (c.batch_size, c.num_train_steps, c.data.max_seq_length) == (128, 2 ** 19, 512)
    assert (c.data.source, c.data.tfds_name, c.objective.name, c.objective.mode) == (
        "tfds", "c4/en", "span_corruption", "span_corruption")
    assert (c.objective.noise_density, c.objective.mean_noise_span_length) == (0.15, 3.0)
    assert (c.tokenizer.kind, c.tokenizer.extra_ids, c.model.vocab_size) == ("sentencepiece", 100, 32128)
    # Adafactor with 1/sqrt(max(n, 10^4)) (Section 3.1.2), as pretrain/training/optimizers.py computes it
    schedule = learning_rate_schedule(c.optimizer, c.num_train_steps)
    for step, expected in ((0, 0.01), (10_000, 0.01), (40_000, 0.005), (2 ** 19, 2 ** -9.5)):
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6)
    assert c.optimizer.name == "adafactor" and c.optimizer.grad_clip_norm == 0.0


def test_derived_targets_length_is_t5s():
    from objectives.span_corruption import compute_input_and_target_lengths
    assert t5_configs.get_config("size=base").objective.targets_length == 0  # derived by the objective
    assert compute_input_and_target_lengths(512, 0.15, 3.0) == (568, 114)   # Raffel et al. (2020), 3.1.2
    assert compute_input_and_target_lengths(128, 0.15, 3.0)[1] == 29        # the short recipe's


def test_released_and_short_recipes():
    released = t5_configs.get_config("size=large,recipe=released")
    assert (released.batch_size, released.num_train_steps) == (2048, 1_000_000)
    short = t5_configs.get_config("size=tiny")
    assert short.data.source == "text" and short.data.path == "demo_out/corpus.txt"
    assert short.tokenizer.path == "demo_out/tokenizer/spm.model" and short.tokenizer.extra_ids == 100
    assert short.model.vocab_size >= 8000 + 100 and short.num_train_steps <= 1000
    assert short.data.max_seq_length == 128


@pytest.mark.parametrize("arg,match", [("size=huge", "size"), ("version=2.0", "version"),
                                       ("recipe=fast", "recipe"), ("size=xl,version=1.0", "size"),
                                       ("layers=3", "layers")])
def test_bad_config_strings_are_errors(arg, match):
    with pytest.raises(ValueError, match=match):
        t5_configs.get_config(arg)


def test_config_is_locked():
    c = t5_configs.get_config("size=small")
    with pytest.raises(AttributeError):
        c.model.d_modle = 3
