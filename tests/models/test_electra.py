"""ELECTRA against transformers (ElectraForPreTraining, ElectraForMaskedLM), its sampling and corruption by
hand, and its sizes' parameter counts."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from configs import electra as electra_configs
from models import model_config
from models.convert import hf_electra
from models.electra import Electra, ElectraConfig, corrupt, sample_replacements
from models.errors import ModelInputError

VOCAB = 120
HF_FIELDS = dict(vocab_size=VOCAB, embedding_size=24, num_hidden_layers=2, max_position_embeddings=64,
                 initializer_range=0.2)  # O(1) activations: differences show


def randomised(model: torch.nn.Module) -> torch.nn.Module:
    """HF initialises biases and LayerNorm to 0/1: randomise them so they count."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "LayerNorm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def reference_pair(seed: int = 0):
    """A discriminator (H 48, E 24: projected) and a generator (H 24: no projection) sharing embeddings."""
    torch.manual_seed(seed)
    discriminator = randomised(transformers.ElectraForPreTraining(transformers.ElectraConfig(
        hidden_size=48, num_attention_heads=4, intermediate_size=96, **HF_FIELDS)))
    generator = randomised(transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        hidden_size=24, num_attention_heads=2, intermediate_size=48, **HF_FIELDS)))
    generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())
    generator.tie_weights()
    return discriminator, generator


def numpy_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in model.state_dict().items()}


def ours_from(discriminator, generator) -> tuple[ElectraConfig, dict]:
    config = hf_electra.electra_config_from_hf(discriminator.config.to_dict(), generator.config.to_dict(), "test")
    return config, hf_electra.electra_params_from_hf(numpy_state(discriminator), numpy_state(generator), config)


def inputs(rng: np.random.Generator, batch: int = 3, length: int = 20):
    ids = rng.integers(0, VOCAB, (batch, length))
    segments = (np.arange(length)[None] >= rng.integers(3, length - 3, (batch, 1))).astype(np.int64)
    mask = (np.arange(length)[None] < rng.integers(8, length + 1, (batch, 1))).astype(np.int64)
    mask[0] = 1
    return ids, segments, mask


@pytest.mark.parametrize("scan_layers", [False, True])
def test_discriminator_and_generator_logits_match_transformers_within_1e5(scan_layers):
    discriminator, generator = reference_pair()
    config, params = ours_from(discriminator, generator)
    config = dataclasses.replace(config, scan_layers=scan_layers)
    if scan_layers:
        from models import stack
        params = stack.to_layout(params, scan=True)
    ids, segments, mask = inputs(np.random.default_rng(0))
    torch_inputs = dict(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                        attention_mask=torch.from_numpy(mask))
    with torch.no_grad():
        hf_disc = discriminator(**torch_inputs).logits.numpy()
        hf_mlm = generator(**torch_inputs).logits.numpy()
    model, args = Electra(config), (jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask))
    ours_disc = model.apply({"params": params}, *args, method=Electra.discriminate)
    positions = jnp.tile(jnp.arange(ids.shape[1])[None], (ids.shape[0], 1))
    ours_mlm = model.apply({"params": params}, *args, positions, method=Electra.generate)
    real = mask.astype(bool)  # padded positions are garbage in both implementations
    assert np.abs(np.asarray(ours_disc)[real] - hf_disc[real]).max() < 1e-5
    assert np.abs(np.asarray(ours_mlm)[real] - hf_mlm[real]).max() < 1e-5


def test_export_writes_back_the_imported_tensors_bitwise_and_transformers_loads_it(tmp_path):
    discriminator, generator = reference_pair(seed=1)
    config, params = ours_from(discriminator, generator)
    hf_electra.save_hf_electra(str(tmp_path / "out"), params, config)
    for name, reference in (("discriminator", discriminator), ("generator", generator)):
        cls = type(reference)
        loaded = cls.from_pretrained(str(tmp_path / "out" / name)).eval()
        expected, got = reference.state_dict(), loaded.state_dict()
        assert set(got) == set(expected)
        assert all(torch.equal(got[k], expected[k]) for k in expected), name
    again_config, again = hf_electra.load_hf_electra_pair(str(tmp_path / "out" / "discriminator"),
                                                         str(tmp_path / "out" / "generator"))
    assert again_config == config
    assert jax.tree.all(jax.tree.map(np.array_equal, again, params))


def test_an_electra_directory_loads_as_a_bert_body_for_fine_tuning(tmp_path):
    discriminator, _ = reference_pair(seed=2)
    discriminator.save_pretrained(str(tmp_path))
    config, params = hf_electra.load_hf_electra(str(tmp_path))
    assert (config.embedding_width, config.hidden_size, config.pooler) == (24, 48, False)
    from models.bert import BertModel
    ids, segments, mask = inputs(np.random.default_rng(1))
    sequence, pooled = BertModel(config).apply({"params": params["bert"]}, jnp.asarray(ids), jnp.asarray(segments),
                                               jnp.asarray(mask))
    with torch.no_grad():
        hidden = discriminator.electra(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                                       attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    real = mask.astype(bool)
    assert pooled is None and np.abs(np.asarray(sequence)[real] - hidden[real]).max() < 1e-5


def hf_configs(size: str, vocab_size: int) -> tuple[transformers.ElectraConfig, transformers.ElectraConfig]:
    layers, hidden, heads, ffn, embedding, gen_hidden, gen_heads, gen_ffn = electra_configs.SIZES[size]
    common = dict(vocab_size=vocab_size, embedding_size=embedding, num_hidden_layers=layers)
    return (transformers.ElectraConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=ffn, **common),
            transformers.ElectraConfig(hidden_size=gen_hidden, num_attention_heads=gen_heads,
                                       intermediate_size=gen_ffn, **common))


def count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("size", list(electra_configs.SIZES))
def test_parameter_counts_equal_transformers_for_every_size(size):
    """Discriminator = ElectraForPreTraining; generator = ElectraForMaskedLM less the shared embeddings."""
    config = model_config(electra_configs.get_config(f"size={size},recipe=short").model)
    ids = jnp.zeros((1, 8), jnp.int32)
    positions = jnp.zeros((1, 2), jnp.int32)
    shapes = jax.eval_shape(lambda: Electra(config).init(jax.random.key(0), ids, ids, ids, positions, positions,
                                                         positions.astype(jnp.float32)))["params"]
    disc_hf, gen_hf = hf_configs(size, config.vocab_size)
    with torch.device("meta"):
        discriminator, generator = transformers.ElectraForPreTraining(disc_hf), transformers.ElectraForMaskedLM(gen_hf)
    shared = sum(p.numel() for p in generator.electra.embeddings.parameters())
    assert count(shapes["discriminator"]) + count(shapes["discriminator_head"]) == discriminator.num_parameters()
    assert count(shapes["generator"]) + count(shapes["generator_head"]) == generator.num_parameters() - shared


def test_sampling_follows_the_softmax_with_temperature_and_passes_no_gradient():
    logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1, 0.0]]]) + 1e-30)  # [1, 1, 4]
    draws = jax.vmap(lambda k: sample_replacements(logits, k, 1.0))(jax.random.split(jax.random.key(0), 4000))
    freq = np.bincount(np.asarray(draws).ravel(), minlength=4) / 4000
    assert np.abs(freq - [0.7, 0.2, 0.1, 0.0]).max() < 0.03
    hot = jax.vmap(lambda k: sample_replacements(logits, k, 0.25))(jax.random.split(jax.random.key(1), 4000))
    # temperature 1/4: p^4 normalised -> 0.7^4 / (0.7^4 + 0.2^4 + 0.1^4) = 0.9965
    assert abs(np.mean(np.asarray(hot) == 0) - 0.7 ** 4 / (0.7 ** 4 + 0.2 ** 4 + 0.1 ** 4)) < 0.01
    grad = jax.grad(lambda x: sample_replacements(x, jax.random.key(2), 1.0).astype(jnp.float32).sum())(logits)
    assert not np.asarray(grad).any()


def test_corruption_by_hand_a_sample_equal_to_the_original_is_not_replaced():
    # Row 0: positions 2 and 5 masked (originals 11, 12), samples 11 (= the original) and 40.
    # Row 1: position 3 masked (original 13), sample 41; its second entry is padding (weight 0, position 0).
    masked = jnp.array([[1, 9, 4, 9, 9, 4, 9, 2], [1, 9, 9, 4, 2, 0, 0, 0]])  # 4 = [MASK]
    positions = jnp.array([[2, 5], [3, 0]])
    originals = jnp.array([[11, 12], [13, 0]])
    weights = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    sampled = jnp.array([[11, 40], [41, 77]])
    corrupted, replaced = corrupt(masked, positions, originals, weights, sampled)
    assert np.asarray(corrupted).tolist() == [[1, 9, 11, 9, 9, 40, 9, 2], [1, 9, 9, 41, 2, 0, 0, 0]]
    assert np.asarray(replaced).tolist() == [[0, 0, 0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0, 0, 0]]


def test_a_generator_wider_than_the_discriminator_is_one_line():
    with pytest.raises(ModelInputError, match=r"generator_hidden_size=512 is wider than .* hidden_size=256") as e:
        ElectraConfig(hidden_size=256, num_heads=4, embedding_size=128, generator_hidden_size=512,
                      generator_num_heads=4)
    assert "\n" not in str(e.value)
