"""pretrain/training/validation.py: every shipped config passes as it stands, and each kind of bad value is one
ConfigError naming the key, the value and what is allowed."""
from __future__ import annotations

import pytest

from configs import albert, bert, cram, distil, electra, glue, gpt2, modernbert, qa, spanbert, t5, tagging
from pretrain.runtime.errors import ConfigError
from pretrain.training import validation
from tests.helpers.configs import changed

SHIPPED = ([bert.get_config(f"size={s}") for s in bert.SIZES]
           + [bert.get_config("size=base,nsp=False,wwm=True"), spanbert.get_config("size=tiny")]
           + [albert.get_config(f"size={s}") for s in albert.SIZES]
           + [t5.get_config(f"size={s},version={v}") for v in t5.SIZES for s in t5.SIZES[v]]
           + [gpt2.get_config(f"size={s}") for s in gpt2.SIZES]
           + [distil.get_config(f"size={s}") for s in distil.SIZES]
           + [modernbert.get_config(f"size={s}") for s in modernbert.SIZES]
           + [modernbert.get_config("size=tiny,packing=True")]
           + [glue.get_config(f"task={task},model={m}") for task in ("mrpc", "stsb", "mnli")
              for m in glue.MODELS]
           + [electra.get_config(f"size={s}") for s in electra.SIZES]
           + [cram.get_config(f"recipe={r}") for r in ("base", "best")]
           + [tagging.get_config(), qa.get_config()])


@pytest.mark.parametrize("index", range(len(SHIPPED)))
def test_every_shipped_config_is_valid(index):
    config = SHIPPED[index]
    validation.check_ranges(config)
    validation.check_relations(config)


@pytest.mark.parametrize("key, value, allowed", [
    ("batch_size", 0, "a positive integer"),
    ("checkpoint_every", -1, "an integer >= 0"),
    ("objective.mask_prob", 0.0, "a probability in (0, 1)"),
    ("objective.mask_prob", float("nan"), "a probability in (0, 1)"),
    ("objective.short_seq_prob", 1.5, "a number in [0, 1]"),
    ("model.attention_dropout_rate", -0.1, "a dropout rate in [0, 1)"),
    ("model.dtype", "fp16", "one of 'float32', 'bfloat16', 'float16'"),
    ("model.name", "roberta", "one of 'bert', 't5', 'gpt'"),
    ("optimizer.schedule", "cosine", "'warmup_cosine_decay'"),
    ("optimizer.name", "adam", "one of 'adamw', 'adafactor', 'lamb'"),
    ("objective.masking", "spans", "one of 'tokens', 'ngrams'"),
    ("objective.ngram_max", 0, "a positive integer"),
    ("optimizer.learning_rate", float("inf"), "a finite number > 0"),
    ("optimizer.b2", 1.0, "a number in [0, 1)"),
    ("data.window_documents", 0, "a positive integer"),
    ("model.attention", "flash", "one of 'auto', 'einsum', 'xla', 'cudnn', 'pallas', 'splash'"),
    ("model.remat", "all", "one of 'none', 'minimal', 'minimal_activation', 'dots', 'full'"),
    ("model.teacher_hidden_size", -768, "an integer >= 0"),
    ("optimizer.decay_fraction", 1.5, "a number in [0, 1]"),
    ("model.global_attn_every_n_layers", 0, "a positive integer"),
    ("prng_impl", "philox", "one of 'auto', 'threefry', 'rbg', 'unsafe_rbg', 'hash'"),
])
def test_a_value_out_of_range_names_key_value_and_range(key, value, allowed):
    config = changed(bert.get_config("size=tiny"), **{key: value})
    with pytest.raises(ConfigError) as info:
        validation.check_ranges(config)
    message = str(info.value)
    assert "\n" not in message and f"config.{key}={value!r}" in message and allowed in message, message


@pytest.mark.parametrize("config, flat, needle", [
    (bert.get_config("size=tiny"), {"grad_accum_steps": 3}, "config.batch_size=32 is not divisible"),
    (bert.get_config("size=tiny"), {"model.num_heads": 3}, "hidden_size=128 is not a multiple"),
    (bert.get_config("size=tiny"), {"objective.replace_with_random": 0.5}, "exceeds 1"),
    (bert.get_config("size=base"), {"data.long_seq_length": 1024}, "config.data.long_seq_length=1024 exceeds"),
    (gpt2.get_config("size=small"), {"model.num_heads": 7}, "d_model=768 is not a multiple"),
    (gpt2.get_config("size=small"), {"data.max_seq_length": 2048}, "exceeds config.model.n_positions=1024"),
    (t5.get_config("size=small"), {"model.feed_forward": "swiglu"}, "config.model.feed_forward='swiglu'"),
    (bert.get_config("size=tiny"), {"model.attention": "xla"}, "attention_dropout_rate=0.1: set it to 0"),
    (bert.get_config("size=tiny"), {"model.attention": "pallas"}, "attention='pallas' cannot drop attention"),
    (glue.get_config("task=mrpc,freeze=gradual"), {"model.scan_layers": True}, "freezes layer by layer"),
    (modernbert.get_config("size=tiny"), {"data.max_seq_length": 64},
     "config.model.local_attention=128 sees 64 tokens either side, the whole config.data.max_seq_length=64 row"),
    (modernbert.get_config("size=tiny"), {"model.num_heads": 3}, "hidden_size=128 is not a multiple"),
])
def test_relations_within_a_family(config, flat, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        validation.check_relations(changed(config, **flat))


def test_a_mesh_that_does_not_fit_the_devices():
    config = changed(bert.get_config("size=tiny"), mesh_shape=(64, 1, 1))
    with pytest.raises(ConfigError, match=r"mesh_shape=\(64, 1, 1\) needs 64 devices"):
        validation.check_mesh(config)


@pytest.mark.parametrize("kernel, backend", [("cudnn", "gpu"), ("pallas", "tpu"), ("splash", "tpu")])
def test_device_kernels_need_their_device(kernel, backend):
    import jax
    config = changed(bert.get_config("size=tiny"), **{"model.attention": kernel, "model.attention_dropout_rate": 0.0})
    if jax.default_backend() == backend:
        validation.check_devices(config)
    else:
        with pytest.raises(ConfigError, match=f"attention='{kernel}' needs a {backend.upper()}.*"
                                              "--config.model.attention=auto"):
            validation.check_devices(config)
