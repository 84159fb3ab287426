"""DistilBERT (our BERT without token types and pooler, the student models/distillation/model.py trains) against
transformers' DistilBertForMaskedLM: the same logits on the same weights, both conversion directions, the
parameter count of every student configs/distil.py ships, and one-line errors for what we do not implement."""
from __future__ import annotations

import dataclasses
import json

import flax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from configs import distil as distil_configs
from models import model_config, stack
from models.bert import BertConfig, BertForPreTraining
from models.convert import hf_bert
from models.convert.hf_distilbert import (distilbert_params_from_hf, hf_config_to_distilbert,
                                          hf_state_dict_from_distilbert, load_hf_distilbert, save_hf_distilbert)
from models.errors import ModelInputError
from tests.helpers import bert_reference
from tests.helpers.bert_reference import count_params, init_params, randomised, state_dict

HF_CONFIG = dict(vocab_size=120, dim=48, n_layers=3, n_heads=4, hidden_dim=96, max_position_embeddings=64,
                 dropout=0.0, attention_dropout=0.0, initializer_range=0.2)  # O(1) activations: differences show
TOLERANCE = 1e-5


def random_hf(seed: int = 0, **overrides) -> transformers.DistilBertForMaskedLM:
    torch.manual_seed(seed)
    return randomised(transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(**{**HF_CONFIG, **overrides})))


def random_batch(seed: int = 0):
    return bert_reference.random_batch(HF_CONFIG["vocab_size"], seed)


def mlm_diff(reference, params, config: BertConfig) -> float:
    """Max |ours - transformers| of the MLM logits at the masked positions. Our model is given segment ids (a
    sentence pair's 0s and 1s): with no token-type table it must not read them, as DistilBERT has no input for them."""
    ids, segments, mask, positions = random_batch()
    with torch.no_grad():
        logits = reference(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    ours = BertForPreTraining(config).apply({"params": params}, *(jnp.asarray(a) for a in (ids, segments, mask,
                                                                                            positions)))
    hf_mlm = np.take_along_axis(logits, positions[..., None], axis=1)
    return float(np.abs(np.asarray(ours["mlm_logits"]) - hf_mlm).max())


@pytest.mark.parametrize("scan_layers", [False, True])
def test_imported_distilbert_mlm_logits_match_transformers(scan_layers):
    reference = random_hf()
    config = dataclasses.replace(hf_config_to_distilbert(HF_CONFIG), scan_layers=scan_layers)
    params = stack.to_layout(distilbert_params_from_hf(state_dict(reference), config), scan=scan_layers)
    assert mlm_diff(reference, params, config) < TOLERANCE


def test_exported_distilbert_loads_in_transformers_with_the_same_logits(tmp_path):
    config = hf_config_to_distilbert(HF_CONFIG)
    params = init_params(config, seed=1)
    rng = np.random.default_rng(0)  # noise on biases and LayerNorm scales (as random_hf): zeros and ones count too
    params = flax.traverse_util.unflatten_dict({
        path: np.asarray(x) + (0.3 * rng.standard_normal(x.shape).astype(np.float32) if path[-1] in ("bias", "scale")
                               else 0) for path, x in flax.traverse_util.flatten_dict(params).items()})
    assert save_hf_distilbert(str(tmp_path / "distilbert"), params, config) == "DistilBertForMaskedLM"
    hf_config = json.loads((tmp_path / "distilbert" / "config.json").read_text())
    assert hf_config["architectures"] == ["DistilBertForMaskedLM"] and hf_config["model_type"] == "distilbert"
    reference = transformers.DistilBertForMaskedLM.from_pretrained(str(tmp_path / "distilbert")).eval()
    assert mlm_diff(reference, params, config) < TOLERANCE


def test_import_then_export_round_trips_bitwise(tmp_path):
    reference = random_hf()
    reference.save_pretrained(tmp_path / "hf")
    config, params = load_hf_distilbert(str(tmp_path / "hf"))
    assert config.type_vocab_size == 0 and not config.pooler and not config.next_sentence
    assert set(params) == {"bert", "mlm_head"} and "token_type_embeddings" not in params["bert"]["embeddings"]
    exported = hf_state_dict_from_distilbert(params, config)
    original = state_dict(reference)
    assert set(exported) == set(original)
    for name, value in original.items():
        assert exported[name].dtype == np.float32 and np.array_equal(exported[name], value), name


def test_a_model_without_token_types_exports_as_bert_with_a_zero_table_and_the_same_logits(tmp_path):
    """A fine-tuned student is a BERT: transformers' BERT always adds a token-type row, so ours writes zeros; the
    pair's segment ids 1 then index a row too, and the logits still equal DistilBERT's."""
    reference = random_hf()
    config = hf_config_to_distilbert(HF_CONFIG)
    params = distilbert_params_from_hf(state_dict(reference), config)
    bert_sd = hf_bert.hf_state_dict_from_bert(params, config)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(**hf_bert.bert_config_to_hf(config, "BertForMaskedLM")))
    bert.load_state_dict({k: torch.from_numpy(v) for k, v in bert_sd.items()}, strict=False)
    ids, segments, mask, _ = random_batch()
    with torch.no_grad():
        ours = bert.eval()(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                           attention_mask=torch.from_numpy(mask)).logits.numpy()
        theirs = reference(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    assert not bert_sd["bert.embeddings.token_type_embeddings.weight"].any()
    assert np.abs(ours - theirs).max() < TOLERANCE


@pytest.mark.parametrize("key, value", [("sinusoidal_pos_embds", True), ("activation", "relu")])
def test_unsupported_distilbert_options_give_one_line_errors_naming_the_key(key, value):
    with pytest.raises(ModelInputError) as e:
        hf_config_to_distilbert({**HF_CONFIG, key: value})
    assert f"{key}={value!r}" in str(e.value) and "\n" not in str(e.value)


def test_a_model_with_token_types_does_not_export_as_distilbert():
    with pytest.raises(ModelInputError, match="type_vocab_size=2.*export it as BERT"):
        hf_state_dict_from_distilbert({}, BertConfig(vocab_size=120, hidden_size=48, num_layers=2, num_heads=4))


def count_transformers(config: BertConfig) -> int:
    """DistilBertForMaskedLM on the meta device (no memory); parameters() yields the tied projector once."""
    hf = transformers.DistilBertConfig(vocab_size=config.vocab_size, dim=config.hidden_size, n_layers=config.num_layers,
                                       n_heads=config.num_heads, hidden_dim=config.intermediate_size,
                                       max_position_embeddings=config.max_position_embeddings)
    with torch.device("meta"):
        model = transformers.DistilBertForMaskedLM(hf)
    return sum(p.numel() for p in model.parameters())


DISTILBERT_SHAPED = [size for size in distil_configs.SIZES if distil_configs.get_config(f"size={size}").model.distilbert_student]


def test_students_of_their_teachers_width_are_distilbert_shaped():
    assert DISTILBERT_SHAPED == ["tiny", "distilbert"]


@pytest.mark.parametrize("size", DISTILBERT_SHAPED)
def test_student_parameter_count_equals_transformers_and_the_docstring_for_every_size(size):
    student = model_config(distil_configs.get_config(f"size={size}").model).student()
    ours = count_params(student)
    assert ours == count_transformers(student)
    bullet = next(b for b in distil_configs.__doc__.split("\n- ") if b.startswith(f"{size}:"))
    assert f"{ours:,} parameters" in " ".join(bullet.split())  # the docstring's exact count is this one


def test_a_hugging_face_distilbert_directory_initialises_a_bert_family_fine_tuning(tmp_path):
    from pretrain.training import pretrained
    random_hf().save_pretrained(tmp_path / "hf")
    init = pretrained.load_pretrained(str(tmp_path / "hf"))
    assert init.family == "bert" and init.source == f"huggingface:{tmp_path / 'hf'}"
    assert init.model["type_vocab_size"] == 0 and "pooler" not in init.params  # the fine-tuning pooler is fresh
    assert init.tokenizer["kind"] == "wordpiece"


def test_an_untied_projector_keeps_the_encoder_and_leaves_the_mlm_head_out():
    """Our MLM head decodes with the word embeddings: a checkpoint that does not loses the head, not the encoder."""
    weights = state_dict(random_hf())
    weights["vocab_projector.weight"] = weights["vocab_projector.weight"] + 1.0
    params = distilbert_params_from_hf(weights, hf_config_to_distilbert(HF_CONFIG))
    assert set(params) == {"bert"}
