"""BERT model: output shapes, padding masks, parameter counts, logical axes, dtypes."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import bert as bert_configs
from models import build_model
from models.bert import BertConfig, BertForPreTraining, BertModel
from pretrain.runtime import partitioning

# Published sizes (Devlin et al., 2019) and the exact counts of Hugging Face's BertForPreTraining.
PUBLISHED = {"base": 110e6, "large": 340e6}
HF_EXACT = {"base": 110_106_428, "large": 336_226_108}


def inputs(batch=2, length=16, predictions=4, vocab=100):
    rng = np.random.default_rng(0)
    return dict(input_ids=jnp.asarray(rng.integers(5, vocab, (batch, length)), jnp.int32),
                segment_ids=jnp.asarray(np.repeat([[0] * (length // 2) + [1] * (length // 2)], batch, 0)),
                input_mask=jnp.ones((batch, length), jnp.int32),
                masked_lm_positions=jnp.asarray(rng.integers(0, length, (batch, predictions)), jnp.int32))


def count(config: BertConfig) -> int:
    model = BertForPreTraining(config)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), **inputs(1, 8, 2)))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("size", ["base", "large"])
def test_parameter_counts(size):
    c = bert_configs.get_config(f"size={size}")
    n = count(build_model(c.model).config)
    assert n == HF_EXACT[size]
    if size == "base":
        assert abs(n - PUBLISHED[size]) / PUBLISHED[size] < 0.005
    else:
        # The paper's "340M" is rounded: the released BERT-Large has 336.2M (1.1% below it).
        assert abs(n - PUBLISHED[size]) / PUBLISHED[size] < 0.012


def test_sizes_match_the_paper_and_miniatures():
    expect = {"tiny": (2, 128, 2, 512), "mini": (4, 256, 4, 1024), "small": (4, 512, 8, 2048),
              "medium": (8, 512, 8, 2048), "base": (12, 768, 12, 3072), "large": (24, 1024, 16, 4096)}
    for size, dims in expect.items():
        m = bert_configs.get_config(f"size={size}").model
        assert (m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size) == dims
    base = bert_configs.get_config("size=base")
    assert (base.model.vocab_size, base.model.max_position_embeddings) == (30522, 512)
    assert (base.batch_size, base.optimizer.learning_rate, base.optimizer.warmup_steps,
            base.num_train_steps) == (256, 1e-4, 10_000, 1_000_000)
    assert (base.data.max_seq_length, base.data.long_seq_length, base.data.long_seq_start_step) == (128, 512, 900_000)


def small_config(**kw) -> BertConfig:
    return BertConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                      max_position_embeddings=64, **kw)


def test_output_shapes_and_nsp_switch():
    x = inputs(batch=3, length=16, predictions=5)
    for nsp in (True, False):
        model = BertForPreTraining(small_config(next_sentence=nsp))
        params = model.init(jax.random.key(0), **x)
        out = model.apply(params, **x)
        assert out["mlm_logits"].shape == (3, 5, 100)
        assert ("nsp_logits" in out) == nsp
        if nsp:
            assert out["nsp_logits"].shape == (3, 2)
    seq, pooled = BertModel(small_config()).apply(
        BertModel(small_config()).init(jax.random.key(0), x["input_ids"], x["segment_ids"], x["input_mask"]),
        x["input_ids"], x["segment_ids"], x["input_mask"])
    assert seq.shape == (3, 16, 32) and pooled.shape == (3, 32)


def test_padding_does_not_change_real_tokens():
    """Hidden states of real tokens are the same whatever sits in the padded positions."""
    model = BertModel(small_config())
    x = inputs(batch=1, length=16)
    mask = jnp.asarray([[1] * 10 + [0] * 6])
    params = model.init(jax.random.key(0), x["input_ids"], x["segment_ids"], mask)
    other_ids = x["input_ids"].at[:, 10:].set(7)
    a, _ = model.apply(params, x["input_ids"], x["segment_ids"], mask)
    b, _ = model.apply(params, other_ids, x["segment_ids"], mask)
    np.testing.assert_allclose(a[:, :10], b[:, :10], atol=1e-6)
    c, _ = model.apply(params, other_ids, x["segment_ids"], jnp.ones_like(mask))
    assert np.abs(np.asarray(c[:, :10] - a[:, :10])).max() > 1e-4  # the mask really matters


def test_mlm_decoder_is_tied_to_word_embeddings():
    model = BertForPreTraining(small_config())
    x = inputs()
    params = model.init(jax.random.key(0), **x)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    names = ["/".join(str(getattr(k, "key", k)) for k in path) for path, _ in flat]
    assert sum("embedding" in n and "word_embeddings" in n for n in names) == 1
    assert not any("decoder" in n for n in names)  # no second vocab x hidden matrix


def test_every_weight_has_logical_axes():
    model = BertForPreTraining(small_config())
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), **inputs()))
    specs = jax.tree.leaves(nn.get_partition_spec(boxed),
                            is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: hasattr(x, "names"))
    assert all(hasattr(x, "names") for x in leaves), "a weight without logical axis names"
    assert len(specs) == len(leaves)
    # and they map onto a mesh without error
    mesh = partitioning.create_mesh((-1, 1, 1))
    partitioning.logical_shardings(boxed, mesh)


def test_bfloat16_compute_float32_params():
    model = BertForPreTraining(small_config(dtype="bfloat16", param_dtype="float32"))
    x = inputs()
    params = model.init(jax.random.key(0), **x)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    out = model.apply(params, **x)
    ref = BertForPreTraining(small_config()).apply(params, **x)
    assert np.isfinite(np.asarray(out["mlm_logits"])).all()
    np.testing.assert_allclose(out["mlm_logits"], ref["mlm_logits"], atol=0.1)


def test_dropout_is_active_in_training_only():
    model = BertForPreTraining(small_config())
    x = inputs()
    params = model.init(jax.random.key(0), **x)
    a = model.apply(params, **x, deterministic=False, rngs={"dropout": jax.random.key(1)})["mlm_logits"]
    b = model.apply(params, **x, deterministic=False, rngs={"dropout": jax.random.key(2)})["mlm_logits"]
    c = model.apply(params, **x)["mlm_logits"]
    d = model.apply(params, **x)["mlm_logits"]
    assert np.abs(np.asarray(a - b)).max() > 1e-3
    np.testing.assert_array_equal(c, d)
