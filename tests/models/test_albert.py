"""ALBERT (our BERT with embedding_size < hidden_size, one shared layer, gelu_new) against transformers'
AlbertForPreTraining: the same logits on the same weights, both conversion directions, the parameter count of
every size configs/albert.py ships, and one-line errors for what we do not implement."""
from __future__ import annotations

import json

import flax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from configs import albert as albert_configs
from models import model_config
from models.bert import BertConfig, BertForPreTraining
from models.convert import load_hf_albert, save_hf_albert
from models.convert.hf_albert import albert_params_from_hf, hf_config_to_albert, hf_state_dict_from_albert
from models.errors import ModelInputError
from tests.helpers import bert_reference
from tests.helpers.bert_reference import count_params, init_params, randomised, state_dict

HF_CONFIG = dict(vocab_size=120, embedding_size=16, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                 intermediate_size=96, max_position_embeddings=64, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0, initializer_range=0.2)  # O(1) activations: differences show
TOLERANCE = 1e-5


def random_hf(seed: int = 0, **overrides) -> transformers.AlbertForPreTraining:
    torch.manual_seed(seed)
    return randomised(transformers.AlbertForPreTraining(transformers.AlbertConfig(**{**HF_CONFIG, **overrides})))


def random_batch(seed: int = 0):
    return bert_reference.random_batch(HF_CONFIG["vocab_size"], seed)


def logit_diffs(reference, params, config: BertConfig, seed: int = 0) -> dict[str, float]:
    """Max |ours - transformers| of the MLM logits at the masked positions and of the SOP logits."""
    ids, segments, mask, positions = random_batch(seed)
    with torch.no_grad():
        out = reference(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                        attention_mask=torch.from_numpy(mask))
    ours = BertForPreTraining(config).apply({"params": params}, *(jnp.asarray(a) for a in (ids, segments, mask,
                                                                                            positions)))
    hf_mlm = np.take_along_axis(out.prediction_logits.numpy(), positions[..., None], axis=1)
    return {"mlm": float(np.abs(np.asarray(ours["mlm_logits"]) - hf_mlm).max()),
            "sop": float(np.abs(np.asarray(ours["nsp_logits"]) - out.sop_logits.numpy()).max())}


@pytest.mark.parametrize("scan_layers", [False, True])
def test_imported_albert_prediction_and_sop_logits_match_transformers(scan_layers):
    reference = random_hf()
    config = hf_config_to_albert(HF_CONFIG, next_sentence=True)
    config = BertConfig(**{**config.__dict__, "scan_layers": scan_layers})
    params = albert_params_from_hf(state_dict(reference), config)
    diffs = logit_diffs(reference, params, config)
    assert diffs["mlm"] < TOLERANCE and diffs["sop"] < TOLERANCE, diffs


def test_exported_albert_loads_in_transformers_with_the_same_logits(tmp_path):
    config = BertConfig(**{**hf_config_to_albert(HF_CONFIG, next_sentence=True).__dict__, "initializer_range": 0.2})
    params = init_params(config, seed=1)
    rng = np.random.default_rng(0)  # noise on biases and LayerNorm scales (as random_hf): zeros and ones count too
    params = flax.traverse_util.unflatten_dict({
        path: np.asarray(x) + (0.3 * rng.standard_normal(x.shape).astype(np.float32) if path[-1] in ("bias", "scale")
                               else 0) for path, x in flax.traverse_util.flatten_dict(params).items()})
    save_hf_albert(str(tmp_path / "albert"), params, config)
    hf_config = json.loads((tmp_path / "albert" / "config.json").read_text())
    assert hf_config["architectures"] == ["AlbertForPreTraining"] and hf_config["model_type"] == "albert"
    reference = transformers.AlbertForPreTraining.from_pretrained(str(tmp_path / "albert")).eval()
    diffs = logit_diffs(reference, params, config)
    assert diffs["mlm"] < TOLERANCE and diffs["sop"] < TOLERANCE, diffs


def test_import_then_export_round_trips_bitwise(tmp_path):
    reference = random_hf()
    reference.save_pretrained(tmp_path / "hf")
    config, params = load_hf_albert(str(tmp_path / "hf"))
    assert config.shared_layers and config.embedding_size == 16 and config.hidden_act == "gelu_new"
    assert config.next_sentence and set(params) == {"bert", "mlm_head", "nsp_head"}
    exported = hf_state_dict_from_albert(params, config)
    original = state_dict(reference)
    assert set(exported) == set(original)
    for name, value in original.items():
        assert exported[name].dtype == np.float32 and np.array_equal(exported[name], value), name


def test_equal_widths_export_an_identity_mapping_and_import_only_that(tmp_path):
    hf = random_hf(embedding_size=48)
    with pytest.raises(ModelInputError, match="embedding_hidden_mapping_in is not the identity"):
        albert_params_from_hf(state_dict(hf), hf_config_to_albert({**HF_CONFIG, "embedding_size": 48}))
    with torch.no_grad():
        mapping = hf.albert.encoder.embedding_hidden_mapping_in
        mapping.weight.copy_(torch.eye(48))
        mapping.bias.zero_()
    config = hf_config_to_albert({**HF_CONFIG, "embedding_size": 48}, next_sentence=True)
    assert config.embedding_size == 0  # no projection in our model
    params = albert_params_from_hf(state_dict(hf), config)
    diffs = logit_diffs(hf, params, config)
    assert diffs["mlm"] < TOLERANCE and diffs["sop"] < TOLERANCE, diffs
    assert all(np.array_equal(v, state_dict(hf)[k]) for k, v in hf_state_dict_from_albert(params, config).items())


@pytest.mark.parametrize("key, value", [("num_hidden_groups", 2), ("inner_group_num", 2),
                                        ("position_embedding_type", "relative_key"), ("hidden_act", "relu")])
def test_unsupported_albert_options_give_one_line_errors_naming_the_key(key, value):
    with pytest.raises(ModelInputError) as e:
        hf_config_to_albert({**HF_CONFIG, key: value})
    assert f"{key}={value!r}" in str(e.value) and "\n" not in str(e.value)


def test_a_model_with_a_layer_per_depth_does_not_export_as_albert():
    config = BertConfig(vocab_size=120, hidden_size=48, num_layers=2, num_heads=4, intermediate_size=96)
    with pytest.raises(ModelInputError, match="shared_layers=True"):
        hf_state_dict_from_albert({}, config)


def test_embedding_size_above_hidden_size_is_a_one_line_error():
    with pytest.raises(ModelInputError, match="embedding_size=256 is above model.hidden_size=128"):
        BertConfig(hidden_size=128, num_heads=2, embedding_size=256, shared_layers=True)
    BertConfig(hidden_size=128, num_heads=2, embedding_size=256)  # ELECTRA's generator: a wider table, projected down


def count_transformers(config: BertConfig) -> int:
    """AlbertForPreTraining on the meta device (no memory); parameters() yields the tied decoder once."""
    hf = transformers.AlbertConfig(vocab_size=config.vocab_size, embedding_size=config.embedding_width,
                                   hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
                                   num_attention_heads=config.num_heads, intermediate_size=config.intermediate_size,
                                   max_position_embeddings=config.max_position_embeddings,
                                   type_vocab_size=config.type_vocab_size, hidden_act=config.hidden_act)
    with torch.device("meta"):
        model = transformers.AlbertForPreTraining(hf)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("size", list(albert_configs.SIZES))
def test_parameter_count_equals_transformers_and_the_docstring_for_every_size(size):
    c = albert_configs.get_config(f"size={size},recipe=paper")
    config = model_config(c.model)
    ours = count_params(config)
    assert ours == count_transformers(config)
    assert f"{size} {ours:,}" in albert_configs.__doc__  # the docstring's exact count is this one


def test_a_hugging_face_albert_directory_initialises_a_bert_family_fine_tuning(tmp_path):
    from pretrain.training import pretrained
    random_hf().save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    init = pretrained.load_pretrained(str(tmp_path / "hf"))
    assert init.family == "bert" and init.source == f"huggingface:{tmp_path / 'hf'}"
    assert init.model["shared_layers"] and init.model["embedding_size"] == 16 and init.model["hidden_act"] == "gelu_new"
    assert "shared_layer" in init.params and "embeddings_project" in init.params
    assert init.tokenizer == dict(kind="sentencepiece", path=str(tmp_path / "hf" / "spiece.model"), lowercase=False)
